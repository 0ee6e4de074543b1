package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.UUID;

/**
 * What {@code kvpool serve} and {@code kvpool launch} wait for before they say the pool serves: a put
 * through it that succeeds. A registered node is not proof enough: the first put after "serving" once
 * came back NO_SEGMENT for one to three seconds (Mooncake's own concurrency test deadlocked on it), so
 * the word is said only after a real put, through a client like any other, came back OK. The probe
 * object (a few bytes under {@code kvpool/ready-check/RANDOM}) is removed again.
 */
final class ReadyCheck {

    static final String PREFIX = "kvpool/ready-check/";

    private ReadyCheck() {
    }

    /**
     * Puts a probe through {@code config}'s master until one put is OK (then removes it), trying again
     * every 50 ms for up to {@code timeout}.
     *
     * @throws IOException naming the last answer when no put succeeded in time
     */
    static void awaitPut(ClientConfig config, Duration timeout) throws IOException, InterruptedException {
        String key = PREFIX + UUID.randomUUID();
        byte[] value = "ready".getBytes(StandardCharsets.US_ASCII);
        long deadline = System.nanoTime() + timeout.toNanos();
        String last = "no answer";
        // a two-phase put and no read lease: the probe leaves no write lease holding room behind it
        try (KvPoolClient c = KvPoolClient.connect(config.withWriteLeases(false).withLocationCache(0))) {
            while (true) {
                try {
                    PutStatus st = c.putDetailed(key, value, PutOptions.DEFAULT).status();
                    if (st == PutStatus.OK || st == PutStatus.ALREADY_EXISTS) {
                        c.remove(key);
                        return;
                    }
                    last = st.toString();
                } catch (RuntimeException e) {
                    last = e.getMessage();
                }
                if (System.nanoTime() > deadline) {
                    break;
                }
                Thread.sleep(50);
            }
        } catch (RuntimeException e) {
            last = e.getMessage();
        }
        throw new IOException("the pool took no put within " + timeout.toSeconds() + " s (the last answer: " + last
                + "); see the logs of its master and nodes");
    }
}

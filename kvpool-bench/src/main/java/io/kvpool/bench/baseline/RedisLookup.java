package io.kvpool.bench.baseline;

import io.kvpool.bench.Measurement;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Response;

/**
 * The Redis baseline for batch metadata lookups: one client asks whether each of a batch of keys
 * exists, in one pipelined round of {@code EXISTS} commands. One measured operation is one whole
 * batch.
 */
public final class RedisLookup implements AutoCloseable {

    private static final int STORE_CHUNK = 10_000;
    private static final byte[] SMALL_VALUE = {'1'};

    private final Jedis jedis;

    public RedisLookup(String host, int port) {
        this.jedis = new Jedis(new HostAndPort(host, port), RedisTarget.clientConfig());
    }

    public RedisLookup(RedisServer server) {
        this(server.host(), server.port());
    }

    /** Stores a one-byte value under every key (pipelined, in chunks), so each is present. */
    public void store(List<String> keys) {
        for (int from = 0; from < keys.size(); from += STORE_CHUNK) {
            List<String> chunk = keys.subList(from, Math.min(keys.size(), from + STORE_CHUNK));
            List<Response<String>> replies = new ArrayList<>(chunk.size());
            try (Pipeline p = jedis.pipelined()) {
                for (String k : chunk) {
                    replies.add(p.set(k.getBytes(StandardCharsets.UTF_8), SMALL_VALUE));
                }
                p.sync();
            }
            for (int i = 0; i < replies.size(); i++) {
                String r = replies.get(i).get();
                if (!"OK".equals(r)) {
                    throw new IllegalStateException("Redis SET " + chunk.get(i) + " replied " + r);
                }
            }
        }
    }

    /**
     * Runs pipelined {@code EXISTS} of all {@code keys} (stored beforehand with {@link #store}) for
     * {@code warmup}, then {@code iterations} times measured. Each iteration is one operation whose
     * latency is the whole batch's round trip; bytes are 0. Every key must be reported present.
     */
    public Measurement pipelinedExists(List<String> keys, int iterations, Duration warmup) {
        if (keys.isEmpty()) {
            throw new IllegalArgumentException("no keys to look up");
        }
        if (iterations <= 0) {
            throw new IllegalArgumentException("iterations must be positive: " + iterations);
        }
        String[] ks = keys.toArray(String[]::new);
        List<Response<Boolean>> replies = new ArrayList<>(ks.length);

        long warmEnd = System.nanoTime() + warmup.toNanos();
        while (System.nanoTime() < warmEnd) {
            batch(ks, replies);
            verify(ks, replies);
        }
        long[] latencies = new long[iterations];
        long start = System.nanoTime();
        for (int it = 0; it < iterations; it++) {
            long t0 = System.nanoTime();
            batch(ks, replies);
            latencies[it] = System.nanoTime() - t0;
            verify(ks, replies);
        }
        long wall = System.nanoTime() - start; // includes the (tiny) checks between batches
        return new Measurement(iterations, 0, wall, latencies);
    }

    private void batch(String[] keys, List<Response<Boolean>> replies) {
        replies.clear();
        try (Pipeline p = jedis.pipelined()) {
            for (String k : keys) {
                replies.add(p.exists(k));
            }
            p.sync();
        }
    }

    /** Checked outside the timed part, so the latency is Redis's and the pipeline's alone. */
    private static void verify(String[] keys, List<Response<Boolean>> replies) {
        for (int i = 0; i < keys.length; i++) {
            if (!Boolean.TRUE.equals(replies.get(i).get())) {
                throw new IllegalStateException("Redis EXISTS " + keys[i] + " reported it missing");
            }
        }
    }

    @Override
    public void close() {
        jedis.close();
    }
}

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.config.Durations;
import io.kvpool.protocol.Keys;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * A prefix match of 1,024 stored keys, by digest and by key, timed call by call against a running pool, with the
 * client's reply poll set as asked ({@code ClientConfig.busyPoll}); the pool's own is its -Dkvpool.busyPoll. By
 * key, the time is split into the client digesting the keys and the call itself.
 *
 * Run from the repository root against `./kvpool serve` (KVPOOL_JAVA_OPTS=-Dkvpool.busyPoll=0 turns the pool's
 * polling off):
 *   java -cp kvpool-cli/target/kvpool.jar scripts/LookupLatency.java 127.0.0.1:15570 100us
 * Used for docs/benchmarks.md, "Polling before blocking".
 */
public final class LookupLatency {

    private static final int KEYS = 1024;
    private static final int CALLS = 3000;

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: LookupLatency MASTER_HOST:PORT CLIENT_BUSY_POLL (e.g. 100us, 0us)");
            System.exit(2);
        }
        List<String> keys = new ArrayList<>(KEYS);
        for (int i = 0; i < KEYS; i++) {
            keys.add(String.format("lookup-latency/model/tp0/%064x", i * 7919L));
        }
        ClientConfig config = ClientConfig.forMaster(args[0]).withBusyPoll(Durations.parse(args[1]));
        try (KvPoolClient c = KvPoolClient.connect(config)) {
            List<MemorySegment> values = new ArrayList<>(KEYS);
            for (int i = 0; i < KEYS; i++) {
                values.add(MemorySegment.ofArray(new byte[64]));
            }
            c.putBatch(keys, values);
            long[] digests = Keys.digests(keys, 0, KEYS);
            for (int round = 0; round < 3; round++) {
                long[] byDigest = new long[CALLS];
                for (int i = 0; i < 500 + CALLS; i++) {
                    long s = System.nanoTime();
                    check(c.prefixMatchDigests(digests, 0, KEYS));
                    if (i >= 500) {
                        byDigest[i - 500] = System.nanoTime() - s;
                    }
                }
                long[] all = new long[CALLS];
                long[] digesting = new long[CALLS];
                long[] call = new long[CALLS];
                for (int i = 0; i < CALLS; i++) {
                    long s = System.nanoTime();
                    long[] d = Keys.digests(keys, 0, KEYS);
                    long m = System.nanoTime();
                    check(c.prefixMatchDigests(d, 0, KEYS));
                    long e = System.nanoTime();
                    all[i] = e - s;
                    digesting[i] = m - s;
                    call[i] = e - m;
                }
                System.out.printf("round %d: by digest p50 %6.1f us | by key p50 %6.1f us (digesting %5.1f, the call %5.1f)%n",
                        round, p50(byDigest), p50(all), p50(digesting), p50(call));
            }
        }
    }

    private static void check(int matched) {
        if (matched != KEYS) {
            throw new IllegalStateException("the pool holds " + matched + " of the " + KEYS + " keys just stored");
        }
    }

    private static double p50(long[] nanos) {
        long[] s = nanos.clone();
        Arrays.sort(s);
        return s[s.length / 2] / 1e3;
    }
}

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Durations;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Clients putting 1 MiB values one at a time over TCP (no shared memory) as fast as they can for 2.5 s, each on
 * its own KvPoolClient with the reply poll asked for; prints GB/s. The pool evicts as it fills.
 *
 * Run from the repository root against `./kvpool serve --segment-size 2GiB`:
 *   java -cp kvpool-cli/target/kvpool.jar scripts/PutRate.java 127.0.0.1:15570 100us 2
 * Used for docs/benchmarks.md, "Polling before blocking": what polling costs when every CPU is busy.
 */
public final class PutRate {

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: PutRate MASTER_HOST:PORT CLIENT_BUSY_POLL CLIENTS");
            System.exit(2);
        }
        ClientConfig config = ClientConfig.forMaster(args[0]).withBusyPoll(Durations.parse(args[1]))
                .withSharedMemory(false);
        int clients = Integer.parseInt(args[2]);
        long start = System.nanoTime() + 500_000_000L; // half a second of warm-up
        long end = start + 2_500_000_000L;
        AtomicLong bytes = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        for (int id = 0; id < clients; id++) {
            String prefix = "put-rate/" + id + "/";
            threads.add(Thread.ofPlatform().start(() -> {
                try (KvPoolClient c = KvPoolClient.connect(config)) {
                    MemorySegment value = MemorySegment.ofArray(new byte[1 << 20]);
                    for (long i = 0; ; i++) {
                        long now = System.nanoTime();
                        if (now > end) {
                            break;
                        }
                        PutStatus st = c.put(prefix + i, value);
                        if (st != PutStatus.OK) {
                            failed.incrementAndGet();
                        } else if (now > start) {
                            bytes.addAndGet(1 << 20);
                        }
                    }
                }
            }));
        }
        for (Thread t : threads) {
            t.join();
        }
        System.out.printf("%d clients, busy poll %s: %.2f GB/s (%d puts not OK)%n", clients, args[1],
                bytes.get() / 2.5 / 1e9, failed.get());
    }
}

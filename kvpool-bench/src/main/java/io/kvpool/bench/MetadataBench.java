package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;
import java.util.function.LongConsumer;

/**
 * The master alone at scale: tens of millions of objects, measured over the wire. A stand-in node
 * registers a segment large enough for all of them and heartbeats, but stores no bytes: only
 * metadata moves, so what is measured is the master (its heap per object, its batched put and
 * existence-check rates). Keys look like an engine's: {@code llama3-8b@v7/tp0/} + 64 hex digits.
 */
final class MetadataBench implements AutoCloseable {

    static final int PUT_BATCH = 4096;
    static final int EXISTS_BATCH = 1024;
    static final int VALUE_BYTES = 64;
    private static final Duration T = Duration.ofSeconds(60);

    private final PoolProcess master;
    private final HostPort address;
    private final long incarnation = ThreadLocalRandom.current().nextLong();
    private final Thread heartbeats;
    private volatile boolean running = true;
    private int segmentId;

    MetadataBench(PoolProcess master, long objects) throws Exception {
        this.master = master;
        this.address = HostPort.parse(master.masterAddress());
        long region = ObjectLayout.regionLength(key(0).length, VALUE_BYTES);
        try (FrameConnection c = connect()) {
            BodyWriter w = new BodyWriter();
            // nothing listens at this node address: frees and resets sent to it fail fast, which is fine
            // twice what the objects need, so usage stays far below the eviction watermark
            new MasterMessages.RegisterNode("bench-metadata:1", "127.0.0.1", 1, objects * region * 2 + (1 << 20),
                    0, incarnation, 0, "", ControlToken.random()).write(w);
            segmentId = MasterMessages.RegisterReply.read(c.call(Opcode.REGISTER_NODE, w, T).body()).segmentId();
            BodyWriter inv = new BodyWriter();
            new MasterMessages.Inventory(segmentId, incarnation, true, List.of()).write(inv);
            c.call(Opcode.NODE_INVENTORY, inv, T);
        }
        heartbeats = Thread.ofVirtual().start(this::heartbeatLoop);
    }

    /**
     * The {@code metadata} section: {@code n} objects stored in a master alone of heap {@code maxHeap}, its heap
     * per object, batched existence checks, and a forced removeAll of them all. {@code step} names each step
     * done (the progress bar).
     */
    static void run(Results results, long n, String maxHeap, Duration warmup, Duration duration,
                    Consumer<String> step) throws Exception {
        try (PoolProcess master = PoolProcess.start("0", maxHeap);
             MetadataBench mb = new MetadataBench(master, n)) {
            long before = mb.heapAfterGc();
            step.accept("metadata: baseline heap");
            long nanos = mb.fill(0, n, 2, done -> { });
            results.add(new Results.Row("metadata", "kvpool", "batched put", 0, 2, Double.NaN, n * 1e9 / nanos,
                    Double.NaN, Double.NaN, n + " objects, batches of " + PUT_BATCH + " (start+end)"));
            step.accept("metadata: filled");
            double perObject = (mb.heapAfterGc() - before) / (double) n;
            results.add(new Results.Row("metadata", "kvpool", "heap per object", 0, 0, Double.NaN, Double.NaN,
                    Double.NaN, Double.NaN, String.format(Locale.ROOT, "%.1f bytes at %d objects (81-byte keys)",
                    perObject, n)));
            results.environment.put("metadata_heap_bytes_per_object", perObject);
            results.environment.put("metadata_objects", n);
            step.accept("metadata: heap");
            for (int clients : List.of(1, 2)) {
                Measurement m = mb.exists(n, clients, warmup, duration.multipliedBy(2));
                results.add(new Results.Row("metadata", "kvpool", "batchExists", 0, clients, Double.NaN,
                        m.opsPerSecond() * EXISTS_BATCH, m.percentileMicros(0.5), m.percentileMicros(0.99),
                        EXISTS_BATCH + " random stored keys a call; ops/s = keys/s"));
            }
            step.accept("metadata: exists");
            try (KvPoolClient c = KvPoolClient.connect(master.masterAddress())) {
                long t0 = System.nanoTime();
                long removed = c.removeAll(true);
                double ms = (System.nanoTime() - t0) / 1e6;
                results.add(new Results.Row("metadata", "kvpool", "removeAll(force)", 0, 1, Double.NaN, Double.NaN,
                        ms * 1000, Double.NaN, String.format(Locale.ROOT, "%.0f ms for %d objects", ms, removed)));
            }
        }
    }

    private FrameConnection connect() throws Exception {
        return FrameConnection.connect(address, Duration.ofSeconds(5), Limits.DEFAULT);
    }

    private void heartbeatLoop() {
        try (FrameConnection c = connect()) {
            while (running) {
                BodyWriter w = new BodyWriter();
                new MasterMessages.Heartbeat(segmentId, incarnation, 0, 0).write(w);
                c.call(Opcode.NODE_HEARTBEAT, w, T);
                Thread.sleep(500);
            }
        } catch (Exception e) {
            if (running) {
                throw new IllegalStateException("stand-in node lost the master", e);
            }
        }
    }

    private static final byte[] PREFIX = "llama3-8b@v7/tp0/".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    /** The i-th key: 81 bytes, an engine-like prefix and 64 hex digits (four mixed 64-bit words). */
    static byte[] key(long i) {
        byte[] k = new byte[PREFIX.length + 64];
        System.arraycopy(PREFIX, 0, k, 0, PREFIX.length);
        long x = i * 0x9E3779B97F4A7C15L;
        int at = PREFIX.length;
        for (int w = 0; w < 4; w++) {
            x = mix(x + w);
            for (int d = 15; d >= 0; d--) {
                k[at + d] = HEX[(int) (x >>> ((15 - d) * 4)) & 15];
            }
            at += 16;
        }
        return k;
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    /**
     * Stores objects [from, to) with batched PUT_START + PUT_END on {@code clients} connections in
     * parallel; {@code progress} receives objects done. Returns the wall time in nanoseconds.
     */
    long fill(long from, long to, int clients, LongConsumer progress) throws Exception {
        long t0 = System.nanoTime();
        List<Thread> threads = new ArrayList<>();
        Throwable[] failure = new Throwable[1];
        long per = (to - from + clients - 1) / clients;
        for (int c = 0; c < clients; c++) {
            long a = from + c * per;
            long b = Math.min(to, a + per);
            threads.add(Thread.ofPlatform().start(() -> {
                try (FrameConnection conn = connect()) {
                    for (long i = a; i < b; i += PUT_BATCH) {
                        int n = (int) Math.min(PUT_BATCH, b - i);
                        putBatch(conn, i, n);
                        progress.accept(n);
                    }
                } catch (Throwable e) {
                    synchronized (failure) {
                        failure[0] = e;
                    }
                }
            }));
        }
        for (Thread t : threads) {
            t.join();
        }
        if (failure[0] != null) {
            throw new IllegalStateException("metadata fill failed: " + failure[0], failure[0]);
        }
        return System.nanoTime() - t0;
    }

    static void putBatch(FrameConnection conn, long first, int n) throws Exception {
        List<MasterMessages.PutStartItem> items = new ArrayList<>(n);
        for (int j = 0; j < n; j++) {
            items.add(new MasterMessages.PutStartItem(key(first + j), VALUE_BYTES));
        }
        BodyWriter w = new BodyWriter(n * 100);
        new MasterMessages.PutStart(false, 1, "", items).write(w);
        MasterMessages.PutStartReply r = MasterMessages.PutStartReply.read(conn.call(Opcode.BATCH_PUT_START, w, T).body());
        List<MasterMessages.PutEndItem> ends = new ArrayList<>(n);
        for (int j = 0; j < n; j++) {
            MasterMessages.PutStartResult res = r.results().get(j);
            if (res.code() != ResultCode.OK) {
                throw new IllegalStateException("put_start of object " + (first + j) + " returned " + res.code());
            }
            ends.add(new MasterMessages.PutEndItem(items.get(j).key(), res.generation(), 0));
        }
        BodyWriter e = new BodyWriter(n * 100);
        new MasterMessages.PutEnd(ends).write(e);
        for (ResultCode c : MasterMessages.Codes.read(conn.call(Opcode.BATCH_PUT_END, e, T).body()).codes()) {
            if (c != ResultCode.OK) {
                throw new IllegalStateException("put_end returned " + c);
            }
        }
    }

    /**
     * Batched existence checks of random stored keys, 1024 per request, on {@code clients} connections.
     * Request bodies are built before the measurement, so the figure is the master's, not the cost of
     * formatting keys in the benchmark.
     */
    Measurement exists(long stored, int clients, Duration warmup, Duration duration) throws Exception {
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final FrameConnection conn = connect();
            final List<BodyWriter> bodies = new ArrayList<>();

            {
                SplittableRandom rnd = new SplittableRandom(id);
                for (int b = 0; b < 32; b++) {
                    List<byte[]> keys = new ArrayList<>(EXISTS_BATCH);
                    for (int k = 0; k < EXISTS_BATCH; k++) {
                        keys.add(key(rnd.nextLong(stored)));
                    }
                    BodyWriter w = new BodyWriter(EXISTS_BATCH * 90);
                    new KeyList(keys).write(w);
                    bodies.add(w);
                }
            }

            @Override
            public Load.Op op() {
                return i -> {
                    BodyWriter w = bodies.get(i % bodies.size());
                    boolean[] present = MasterMessages.Flags.read(conn.call(Opcode.BATCH_EXIST_KEY, w, T).body()).values();
                    for (boolean p : present) {
                        if (!p) {
                            throw new IllegalStateException("a stored key was reported missing");
                        }
                    }
                    return 0;
                };
            }

            @Override
            public void close() throws Exception {
                conn.close();
            }
        });
    }

    /** Heap the master uses after a full collection. */
    long heapAfterGc() throws Exception {
        master.collectGarbage();
        return (long) master.metric("jvm_memory_used_bytes{area=\"heap\"}");
    }

    @Override
    public void close() throws Exception {
        running = false;
        heartbeats.interrupt();
    }
}

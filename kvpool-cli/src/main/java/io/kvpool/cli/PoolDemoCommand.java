package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import io.kvpool.protocol.Limits;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;

/**
 * {@code kvpool pool-demo}: an embedded master and node, and concurrent clients behaving like inference
 * engines on a multi-turn chat workload. Every request hashes its prompt into chained block keys,
 * asks the pool how many leading blocks it has ({@code prefixMatch}), loads those ({@code getIntoBatch})
 * and checks every byte, then saves the blocks it had to compute ({@code putBatch}).
 */
@Command(name = "pool-demo", mixinStandardHelpOptions = true,
        description = "Run an embedded pool with concurrent engine-like clients and print a summary.")
final class PoolDemoCommand implements Callable<Integer> {

    @Option(names = "--clients", paramLabel = "N", description = "Concurrent clients (default: ${DEFAULT-VALUE}).")
    int clients = 4;

    @Option(names = "--conversations", paramLabel = "N", description = "Conversations (default: ${DEFAULT-VALUE}).")
    int conversations = 48;

    @Option(names = "--turns", paramLabel = "N", description = "Turns per conversation (default: ${DEFAULT-VALUE}).")
    int turns = 5;

    @Option(names = "--system-prompts", paramLabel = "N",
            description = "Distinct system prompts shared across conversations (default: ${DEFAULT-VALUE}).")
    int systemPrompts = 4;

    @Option(names = "--system-blocks", paramLabel = "N", description = "Blocks per system prompt (default: ${DEFAULT-VALUE}).")
    int systemBlocks = 12;

    @Option(names = "--turn-blocks", paramLabel = "N", description = "Blocks added by each turn (default: ${DEFAULT-VALUE}).")
    int turnBlocks = 3;

    @Option(names = "--min-block", paramLabel = "SIZE", description = "Smallest KV block (default: 256KiB).")
    Size minBlock = Size.ofKiB(256);

    @Option(names = "--max-block", paramLabel = "SIZE", description = "Largest KV block (default: 2MiB).")
    Size maxBlock = Size.ofMiB(2);

    @Option(names = "--segment-size", paramLabel = "SIZE",
            description = "Memory of the embedded node; smaller than the workload so eviction runs (default: 512MiB).")
    Size segmentSize = Size.ofMiB(512);

    /** Conversations each client interleaves at once: the client's working set. */
    private static final int ACTIVE_PER_CLIENT = 2;

    /**
     * The most clients: each opens its own connections to the embedded master and node, which take at
     * most {@link Limits#DEFAULT_MAX_CONNECTIONS_PER_HOST} from this host.
     */
    static final int MAX_CLIENTS = 256;

    /** The most blocks of one prompt (64K tokens of 16): every client holds a buffer for each. */
    static final int MAX_PROMPT_BLOCKS = 4096;

    /** The most requests of a run ({@code --conversations} times {@code --turns}): each one's latency is kept. */
    static final long MAX_REQUESTS = 10_000_000;

    private final AtomicLong requests = new AtomicLong();
    private final AtomicLong blocksTotal = new AtomicLong();
    private final AtomicLong blocksHit = new AtomicLong();
    private final AtomicLong blocksLost = new AtomicLong();
    private final AtomicLong bytesRead = new AtomicLong();
    private final AtomicLong bytesWritten = new AtomicLong();
    private final AtomicLong objectsWritten = new AtomicLong();
    private final AtomicLong alreadyPresent = new AtomicLong();
    private final AtomicLong putRejected = new AtomicLong();
    private final AtomicLong corrupt = new AtomicLong();

    @Override
    public Integer call() throws Exception {
        validate();
        MasterConfig mc = MasterConfig.defaults().withListen("127.0.0.1", 0, 0).withSummaryInterval(java.time.Duration.ZERO);
        try (OnExit exit = OnExit.start("pool-demo", NodeConfig.DEFAULT_SHM_DIR)) { // on SIGTERM too
            EmbeddedPool pool = exit.add(new EmbeddedPool(mc,
                    master -> NodeConfig.defaults(master, segmentSize).withListen("127.0.0.1", 0)));
            System.out.printf("kvpool pool-demo: embedded master %s, node %s with %s; %d clients, %d conversations x %d turns,"
                            + " blocks %s..%s%n", pool.masterAddress(), pool.node().name(), segmentSize, clients,
                    conversations, turns, minBlock, maxBlock);
            long total = (long) conversations * turns;
            long[][] latencies = new long[clients][];
            long start = System.nanoTime();
            try (ProgressBar bar = new ProgressBarBuilder().setTaskName("requests").setInitialMax(total)
                    .setStyle(ProgressBarStyle.ASCII).setUpdateIntervalMillis(200).continuousUpdate().build();
                 ExecutorService exec = Executors.newVirtualThreadPerTaskExecutor()) {
                List<Future<long[]>> futures = new ArrayList<>();
                for (int c = 0; c < clients; c++) {
                    int id = c;
                    futures.add(exec.submit(() -> runClient(id, pool.masterAddress(), bar)));
                }
                for (int c = 0; c < clients; c++) {
                    latencies[c] = futures.get(c).get();
                }
            }
            double secs = (System.nanoTime() - start) / 1e9;
            PoolStats stats;
            try (KvPoolClient c = KvPoolClient.connect(pool.masterAddress())) {
                stats = c.stats();
            }
            long evictedKeys = pool.master().service().eviction().evictedKeyCount();
            printSummary(secs, latencies, stats, evictedKeys);
        }
        return corrupt.get() == 0 ? 0 : 1;
    }

    /** Every count and size against its bound and, together, against this machine's memory (docs/operations.md). */
    private void validate() {
        Bounds.range("--clients", clients, 1, MAX_CLIENTS, "each client opens its own connections to the embedded"
                + " master and node, which take at most " + Limits.DEFAULT_MAX_CONNECTIONS_PER_HOST + " from this host");
        Bounds.range("--conversations", conversations, 1, MAX_REQUESTS, null);
        Bounds.range("--turns", turns, 1, MAX_REQUESTS, null);
        Bounds.productAtMost("--conversations", conversations, "--turns", turns, MAX_REQUESTS, "requests",
                "each one's latency is kept for the summary");
        Bounds.range("--system-prompts", systemPrompts, 1, MAX_REQUESTS, null);
        Bounds.range("--system-blocks", systemBlocks, 0, MAX_PROMPT_BLOCKS, null);
        Bounds.range("--turn-blocks", turnBlocks, 1, MAX_PROMPT_BLOCKS, null);
        long blocks = promptBlocks();
        if (blocks > MAX_PROMPT_BLOCKS) {
            throw new IllegalArgumentException("--system-blocks " + systemBlocks + " + --turns " + turns
                    + " x --turn-blocks " + turnBlocks + " is a last prompt of " + blocks + " blocks, more than "
                    + MAX_PROMPT_BLOCKS + " (a client holds a buffer for each block of a prompt)");
        }
        Bounds.sizeAtLeast("--min-block", minBlock, 8);
        if (maxBlock.bytes() < minBlock.bytes()) {
            throw new IllegalArgumentException("--max-block " + maxBlock + " is less than --min-block " + minBlock);
        }
        Bounds.sizeAtLeast("--segment-size", segmentSize, 1 << 20);
        Bounds.sizeAtMost("--max-block", maxBlock, MasterConfig.DEFAULT_MAX_VALUE_SIZE.bytes(),
                "the largest value the embedded master takes");
        Bounds.sizeAtMost("--max-block", maxBlock, segmentSize.bytes(), "the embedded node's memory (--segment-size)");
        Bounds.fitsMemory("--segment-size " + segmentSize + " and --clients " + clients + " with a buffer each for "
                + blocks + " blocks of up to --max-block " + maxBlock, Bounds.plus(segmentSize.bytes(),
                Bounds.times(Bounds.times(clients, blocks), maxBlock.bytes())));
    }

    /** Blocks of a conversation's last prompt: its system prompt and every turn's. */
    private long promptBlocks() {
        return systemBlocks + (long) turns * turnBlocks;
    }

    /** One engine-like client; returns its request latencies in nanoseconds. */
    private long[] runClient(int id, String master, ProgressBar bar) throws Exception {
        List<Integer> mine = new ArrayList<>();
        for (int c = id; c < conversations; c += clients) {
            mine.add(c);
        }
        long[] lat = new long[mine.size() * turns];
        int n = 0;
        try (KvPoolClient client = KvPoolClient.connect(ClientConfig.forMaster(master));
             Arena arena = Arena.ofConfined()) {
            int maxBlocks = (int) promptBlocks();
            MemorySegment[] buffers = new MemorySegment[maxBlocks];
            for (int i = 0; i < maxBlocks; i++) {
                buffers[i] = arena.allocate(maxBlock.bytes(), 64);
            }
            for (int w = 0; w < mine.size(); w += ACTIVE_PER_CLIENT) {
                List<Integer> window = mine.subList(w, Math.min(mine.size(), w + ACTIVE_PER_CLIENT));
                for (int t = 0; t < turns; t++) {
                    for (int conv : window) {
                        long t0 = System.nanoTime();
                        request(client, conv, t, buffers, arena);
                        lat[n++] = System.nanoTime() - t0;
                        bar.step();
                        long total = blocksTotal.get();
                        bar.setExtraMessage(String.format(Locale.ROOT, " hit %.0f%%",
                                total == 0 ? 0.0 : 100.0 * blocksHit.get() / total));
                    }
                }
            }
        }
        return Arrays.copyOf(lat, n);
    }

    private void request(KvPoolClient client, int conv, int turn, MemorySegment[] buffers, Arena arena) {
        List<String> keys = promptKeys(conv, turn);
        int matched = client.prefixMatch(keys);
        List<String> hitKeys = keys.subList(0, matched);
        long[] got = client.getIntoBatch(hitKeys, Arrays.asList(buffers).subList(0, matched));
        int loaded = 0;
        for (int i = 0; i < matched; i++) {
            if (got[i] == KvPoolClient.MISS) {
                break; // evicted between the lookup and the load: recompute from here
            }
            if (got[i] != blockSize(keys.get(i)) || !verify(keys.get(i), buffers[i].asSlice(0, got[i]))) {
                corrupt.incrementAndGet();
            }
            bytesRead.addAndGet(got[i]);
            loaded++;
        }
        blocksLost.addAndGet(matched - loaded);
        blocksHit.addAndGet(loaded);
        blocksTotal.addAndGet(keys.size());
        List<String> toSave = keys.subList(loaded, keys.size());
        List<MemorySegment> values = new ArrayList<>(toSave.size());
        for (int i = 0; i < toSave.size(); i++) {
            MemorySegment v = buffers[loaded + i].asSlice(0, blockSize(toSave.get(i)));
            fill(toSave.get(i), v);
            values.add(v);
        }
        List<PutStatus> st = client.putBatch(toSave, values);
        for (int i = 0; i < st.size(); i++) {
            switch (st.get(i)) {
                case OK -> {
                    objectsWritten.incrementAndGet();
                    bytesWritten.addAndGet(values.get(i).byteSize());
                }
                case ALREADY_EXISTS -> alreadyPresent.incrementAndGet();
                default -> putRejected.incrementAndGet();
            }
        }
        requests.incrementAndGet();
    }

    /** Chained block keys of a conversation's prompt at a turn: system prompt, then every turn so far. */
    private List<String> promptKeys(int conv, int turn) {
        List<String> keys = new ArrayList<>();
        byte[] parent = "kvpool-demo-root".getBytes(StandardCharsets.UTF_8);
        int sys = conv % systemPrompts;
        for (int b = 0; b < systemBlocks; b++) {
            parent = blockHash(parent, "sys" + sys + "/" + b);
            keys.add(key(parent));
        }
        for (int t = 0; t <= turn; t++) {
            for (int b = 0; b < turnBlocks; b++) {
                parent = blockHash(parent, "conv" + conv + "/turn" + t + "/" + b);
                keys.add(key(parent));
            }
        }
        return keys;
    }

    private static byte[] blockHash(byte[] parent, String tokens) {
        try {
            MessageDigest d = MessageDigest.getInstance("SHA-256");
            d.update(parent);
            d.update(tokens.getBytes(StandardCharsets.UTF_8));
            return d.digest();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private static String key(byte[] hash) {
        return "demo/llama-demo@v1/tp0/" + HexFormat.of().formatHex(hash);
    }

    private static long seed(String key) {
        return HexFormat.fromHexDigitsToLong(key.substring(key.length() - 16));
    }

    /** Each block's size is fixed by its key, between --min-block and --max-block, in 64 KiB steps. */
    private long blockSize(String key) {
        long steps = Math.max(1, (maxBlock.bytes() - minBlock.bytes()) / 65536 + 1);
        return Math.min(maxBlock.bytes(), minBlock.bytes() + Math.floorMod(seed(key), steps) * 65536) & ~7L;
    }

    private static final ValueLayout.OfLong LONG = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    /** Deterministic content from the key, so any reader can check every byte. */
    private static void fill(String key, MemorySegment dst) {
        long x = seed(key);
        for (long off = 0; off + 8 <= dst.byteSize(); off += 8) {
            x += 0x9E3779B97F4A7C15L;
            dst.set(LONG, off, mix(x));
        }
    }

    private static boolean verify(String key, MemorySegment got) {
        long x = seed(key);
        for (long off = 0; off + 8 <= got.byteSize(); off += 8) {
            x += 0x9E3779B97F4A7C15L;
            if (got.get(LONG, off) != mix(x)) {
                return false;
            }
        }
        return true;
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    private void printSummary(double secs, long[][] latencies, PoolStats stats, long evictedKeys) {
        long[] all = Arrays.stream(latencies).flatMapToLong(Arrays::stream).sorted().toArray();
        double p50 = all.length == 0 ? 0 : all[(int) (all.length * 0.50)] / 1e6;
        double p99 = all.length == 0 ? 0 : all[Math.min(all.length - 1, (int) (all.length * 0.99))] / 1e6;
        long total = blocksTotal.get();
        System.out.println();
        Table t = new Table("metric", "value").right(1);
        t.row("requests", requests.get());
        t.row("wall time", String.format(Locale.ROOT, "%.2f s", secs));
        t.row("blocks looked up", total);
        t.row("hit rate (blocks loaded from the pool)", String.format(Locale.ROOT, "%.1f%%", total == 0 ? 0.0 : 100.0 * blocksHit.get() / total));
        t.row("blocks lost between lookup and load", blocksLost.get());
        t.row("objects written", objectsWritten.get());
        t.row("puts already present (written by another client)", alreadyPresent.get());
        t.row("puts not stored (pool full or failed)", putRejected.get());
        t.row("bytes read", Size.human(bytesRead.get()));
        t.row("bytes written", Size.human(bytesWritten.get()));
        t.row("read throughput", String.format(Locale.ROOT, "%.2f GB/s", bytesRead.get() / secs / 1e9));
        t.row("write throughput", String.format(Locale.ROOT, "%.2f GB/s", bytesWritten.get() / secs / 1e9));
        t.row("request latency p50 / p99", String.format(Locale.ROOT, "%.1f / %.1f ms", p50, p99));
        t.row("objects in pool at end", stats.keys());
        t.row("pool used", String.format(Locale.ROOT, "%s of %s", Size.human(stats.allocatedBytes()), Size.human(stats.capacityBytes())));
        t.row("objects evicted", evictedKeys);
        t.row("corrupt reads (must be 0)", corrupt.get());
        t.print(System.out);
        if (corrupt.get() != 0) {
            System.out.println("FAILED: some reads returned wrong bytes");
        }
    }
}

package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.master.events.EventBatchReader;
import io.kvpool.master.events.KvEventsConfig;
import io.kvpool.protocol.BlockInfo;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.zeromq.SocketType;
import org.zeromq.ZContext;
import org.zeromq.ZMQ;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * KV events end to end: a master with events on (free ports), a real pool and client, and a JeroMQ
 * subscriber that decodes every payload: puts, removals, evictions and resets reach it, replay from
 * sequence 0 gives back what was published and ends with vLLM's end marker, and a spill to the SSD tier
 * is a removal from CPU and a store to STORAGE. Waits poll with generous deadlines.
 */
class KvEventsIT {

    private static final int VALUE = 256 << 10;
    private static final Duration DEADLINE = Duration.ofSeconds(60);

    /** A connector key whose block hash's low 64 bits are {@code n}. */
    static String key(long n) {
        return "kvp1/it/v1/tp0of1-pp0of1/bf16/" + "0".repeat(48) + "%016x".formatted(n);
    }

    private static InProcessCluster cluster(Size memory, Path disk) throws Exception {
        return new InProcessCluster(1, memory,
                m -> m.withKvEvents(KvEventsConfig.at("tcp://127.0.0.1:*").withReplay("tcp://127.0.0.1:*")),
                n -> disk == null ? n : n.withDisk(disk, Size.ofMiB(128)).withPromoteAfter(0));
    }

    enum Medium { CPU, STORAGE }

    /** A subscriber that applies every event it hears to a router's view: block hash to media. */
    private static final class Subscriber implements AutoCloseable {
        final ZContext ctx = new ZContext();
        final ZMQ.Socket sub = ctx.createSocket(SocketType.SUB);
        final List<EventBatchReader.Event> heard = new ArrayList<>();
        final List<Long> seqs = new ArrayList<>();
        final Map<Long, EnumSet<Medium>> view = new TreeMap<>();

        Subscriber(String endpoint) {
            sub.subscribe(new byte[0]);
            sub.setReceiveTimeOut(100);
            sub.connect(endpoint);
        }

        /** Takes in what arrived (waits up to 100 ms for the first message); true if anything did. */
        boolean pump() {
            boolean any = false;
            byte[] topic;
            while ((topic = sub.recv(0)) != null) {
                assertThat(topic).as("vLLM's default topic").isEmpty();
                byte[] seq = sub.recv(0);
                byte[] payload = sub.recv(0);
                assertThat(sub.hasReceiveMore()).as("three frames").isFalse();
                long s = ByteBuffer.wrap(seq).getLong();
                if (!seqs.isEmpty()) {
                    assertThat(s).as("consecutive sequence numbers").isEqualTo(seqs.getLast() + 1);
                }
                seqs.add(s);
                for (EventBatchReader.Event e : EventBatchReader.read(payload).events()) {
                    heard.add(e);
                    apply(view, e);
                }
                any = true;
            }
            return any;
        }

        /** Pumps until {@code done} holds; fails after the deadline. */
        void until(String what, java.util.function.BooleanSupplier done) {
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (!done.getAsBoolean()) {
                assertThat(System.nanoTime()).as("waiting until " + what).isLessThan(deadline);
                pump();
            }
        }

        @Override
        public void close() {
            ctx.close();
        }
    }

    static void apply(Map<Long, EnumSet<Medium>> view, EventBatchReader.Event e) {
        switch (e.type()) {
            case "BlockStored" -> e.blockHashes().forEach(h -> view.computeIfAbsent(h, x -> EnumSet.noneOf(Medium.class))
                    .add(Medium.valueOf(e.medium())));
            case "BlockRemoved" -> e.blockHashes().forEach(h -> {
                EnumSet<Medium> m = view.get(h);
                if (m != null && m.remove(Medium.valueOf(e.medium())) && m.isEmpty()) {
                    view.remove(h);
                }
            });
            case "AllBlocksCleared" -> view.clear();
            default -> throw new AssertionError("unknown event " + e);
        }
    }

    /** Puts probes until the subscriber hears one (a subscription takes a moment to reach the PUB socket). */
    private static void connect(Subscriber s, KvPoolClient c) {
        long deadline = System.nanoTime() + DEADLINE.toNanos();
        for (int i = 0; !s.pump(); i++) {
            assertThat(System.nanoTime()).as("the subscriber hears the master").isLessThan(deadline);
            String probe = "probe/" + i;
            c.put(probe, new byte[8]);
            c.remove(probe);
        }
    }

    private static byte[] value(String k) {
        byte[] v = new byte[VALUE];
        byte[] b = k.getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(b, 0, v, 0, b.length);
        return v;
    }

    /** Every batch the replay socket has from {@code start}, as (seq, payload), up to the end marker. */
    static List<Map.Entry<Long, byte[]>> replay(ZContext ctx, String endpoint, long start) {
        ZMQ.Socket dealer = ctx.createSocket(SocketType.DEALER);
        dealer.setReceiveTimeOut((int) DEADLINE.toMillis());
        dealer.connect(endpoint);
        dealer.sendMore(new byte[0]);
        dealer.send(ByteBuffer.allocate(8).putLong(start).array(), 0);
        List<Map.Entry<Long, byte[]>> out = new ArrayList<>();
        while (true) {
            byte[] empty = dealer.recv(0);
            assertThat(empty).as("a replay reply within the deadline").isNotNull().isEmpty();
            byte[] topic = dealer.recv(0);
            long seq = ByteBuffer.wrap(dealer.recv(0)).getLong();
            byte[] payload = dealer.recv(0);
            assertThat(topic).isEmpty();
            if (seq == -1) {
                assertThat(payload).as("the end marker's payload").isEmpty();
                ctx.destroySocket(dealer);
                return out;
            }
            out.add(Map.entry(seq, payload));
        }
    }

    @Test
    void putsRemovalsEvictionsAndResetsReachASubscriberAndReplay() throws Exception {
        try (InProcessCluster cluster = cluster(Size.ofMiB(8), null);
             KvPoolClient c = cluster.client();
             Subscriber s = new Subscriber(cluster.master.kvEvents().endpoint())) {
            connect(s, c);
            assertThat(c.put(key(1), value(key(1)))).isEqualTo(PutStatus.OK);
            s.until("BlockStored of the put", () -> s.view.containsKey(1L));
            assertThat(s.view.get(1L)).containsExactly(Medium.CPU);
            assertThat(c.remove(key(1))).isTrue();
            s.until("BlockRemoved of the removal", () -> !s.view.containsKey(1L));

            // 40 values of 256 KiB into 8 MiB: the oldest are evicted, and a router hears which
            Map<Long, String> keys = new HashMap<>();
            for (long i = 100; i < 140; i++) {
                assertThat(c.put(key(i), value(key(i)))).isEqualTo(PutStatus.OK);
                keys.put(i, key(i));
            }
            s.until("the view matches the pool's objects", () -> {
                for (Map.Entry<Long, String> e : keys.entrySet()) {
                    if (s.view.containsKey(e.getKey()) != c.exists(e.getValue())) {
                        return false;
                    }
                }
                return true;
            });
            // which objects go is approximate LRU by access tick (puts within one tick are equals), so the test
            // names no victim: it checks that each one evicted was announced by a removal of its own
            List<Long> evicted = keys.keySet().stream().filter(h -> !s.view.containsKey(h)).sorted().toList();
            assertThat(evicted).as("evicted").isNotEmpty();
            for (long h : evicted) {
                assertThat(s.heard).as("a BlockRemoved for evicted " + h)
                        .anyMatch(e -> e.type().equals("BlockRemoved") && e.blockHashes().contains(h));
            }

            c.removeAll(true);
            s.until("AllBlocksCleared", () -> !s.heard.isEmpty() && s.heard.getLast().type().equals("AllBlocksCleared"));
            assertThat(s.view).isEmpty();
            assertThat(cluster.master.kvEvents().droppedEvents()).isZero();

            // replay from 0: every batch since the master started, the subscriber's among them, then the end marker
            List<Map.Entry<Long, byte[]>> replayed = replay(s.ctx, cluster.master.kvEvents().replayEndpoint(), 0);
            assertThat(replayed.getFirst().getKey()).as("a single master's stream starts at 0").isZero();
            assertThat(replayed.getLast().getKey()).isEqualTo(s.seqs.getLast());
            List<EventBatchReader.Event> fromReplay = new ArrayList<>();
            for (Map.Entry<Long, byte[]> b : replayed) {
                if (b.getKey() >= s.seqs.getFirst()) {
                    fromReplay.addAll(EventBatchReader.read(b.getValue()).events());
                }
            }
            assertThat(fromReplay).as("the replay says what the subscriber heard").isEqualTo(s.heard);
            assertThat(replay(s.ctx, cluster.master.kvEvents().replayEndpoint(), s.seqs.getLast() + 1)).isEmpty();

            String metrics = java.net.http.HttpClient.newHttpClient().send(java.net.http.HttpRequest.newBuilder(
                    java.net.URI.create("http://127.0.0.1:" + cluster.master.httpPort() + "/metrics")).build(),
                    java.net.http.HttpResponse.BodyHandlers.ofString()).body();
            assertThat((long) metric(metrics, "master_kv_events_sequence")).isEqualTo(s.seqs.getLast());
            assertThat((long) metric(metrics, "master_kv_events_batches_total")).isEqualTo(s.seqs.getLast() + 1);
            assertThat((long) metric(metrics, "master_kv_events_published_total")).isGreaterThanOrEqualTo(s.heard.size());
            assertThat(metric(metrics, "master_kv_events_dropped_total")).isZero();
        }
    }

    /**
     * What the connector said of its blocks (BLOCK_INFO) reaches the router in their stores: a chain saved in one
     * batch is one BlockStored with every token, as vLLM sends it; a block it said nothing of has none; and after a
     * spill the STORAGE store carries the tokens again.
     */
    @Test
    void blockInfosFromTheClientRideInTheStores(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(Size.ofMiB(8), disk);
             KvPoolClient c = cluster.client();
             Subscriber s = new Subscriber(cluster.master.kvEvents().endpoint())) {
            connect(s, c);
            List<String> chain = List.of(key(501), key(502), key(503));
            List<BlockInfo> infos = List.of(BlockInfo.of(null, 4, new int[]{1, 2, 3, 4}),
                    BlockInfo.of(501L, 4, new int[]{5, 6, 7, 8}), BlockInfo.of(502L, 4, new int[]{9, 10, 11, 12}));
            assertThat(c.describeBlocks(chain, infos)).isEqualTo(3);
            assertThat(c.putBatch(chain, chain.stream().map(k -> java.lang.foreign.MemorySegment.ofArray(value(k)))
                    .toList())).containsOnly(PutStatus.OK);
            assertThat(c.put(key(504), value(key(504)))).isEqualTo(PutStatus.OK);
            s.until("the chain and the bare block stored", () -> s.view.keySet().containsAll(List.of(501L, 502L, 503L, 504L)));
            List<Integer> tokens = new ArrayList<>();
            for (EventBatchReader.Event e : s.heard) {
                if (e.type().equals("BlockStored") && e.blockHashes().stream().anyMatch(h -> h >= 501 && h <= 503)) {
                    assertThat(e.blockSize()).isEqualTo(4);
                    assertThat(e.parentBlockHash()).as("the first stored block's parent")
                            .isEqualTo(e.blockHashes().getFirst() == 501L ? null : e.blockHashes().getFirst() - 1);
                    tokens.addAll(e.tokenIds());
                }
                if (e.type().equals("BlockStored") && e.blockHashes().contains(504L)) {
                    assertThat(e.tokenIds()).as("a block nobody described").isEmpty();
                    assertThat(e.blockSize()).isZero();
                }
            }
            assertThat(tokens).containsExactly(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
            // 40 more values of 256 KiB into 8 MiB: the chain spills to the SSD tier, its tokens with it
            for (long i = 600; i < 640; i++) {
                assertThat(c.put(key(i), value(key(i)))).isEqualTo(PutStatus.OK);
            }
            s.until("the chain stored in STORAGE", () -> s.heard.stream().anyMatch(e -> e.type().equals("BlockStored")
                    && "STORAGE".equals(e.medium()) && e.blockHashes().contains(501L)));
            assertThat(s.heard).filteredOn(e -> e.type().equals("BlockStored") && "STORAGE".equals(e.medium())
                    && e.blockHashes().contains(501L)).allSatisfy(e -> assertThat(e.tokenIds()).startsWith(1, 2, 3, 4));
        }
    }

    private static double metric(String body, String series) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("^" + java.util.regex.Pattern.quote(series)
                + " (\\S+)$", java.util.regex.Pattern.MULTILINE).matcher(body);
        assertThat(m.find()).as(series + " in /metrics").isTrue();
        return Double.parseDouble(m.group(1));
    }

    @Test
    void aSpillIsARemovalFromCpuAndAStoreToStorage(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(Size.ofMiB(8), disk);
             KvPoolClient c = cluster.client();
             Subscriber s = new Subscriber(cluster.master.kvEvents().endpoint())) {
            connect(s, c);
            int n = 64; // 16 MiB into 8 MiB of memory
            for (long i = 0; i < n; i++) {
                assertThat(c.put(key(i), value(key(i)))).isEqualTo(PutStatus.OK);
            }
            Await.until("every object is listed again (memory or disk)", () -> c.stats().keys() >= n);
            s.until("a router sees every object, some on SSD", () -> {
                for (long i = 0; i < n; i++) {
                    if (!s.view.containsKey(i)) {
                        return false;
                    }
                }
                return s.view.values().stream().anyMatch(m -> m.contains(Medium.STORAGE));
            });
            for (long i = 0; i < n; i++) {
                long h = i;
                if (!s.view.get(h).contains(Medium.STORAGE)) {
                    continue;
                }
                int removedFromCpu = indexOf(s.heard, "BlockRemoved", h, "CPU");
                int storedToStorage = indexOf(s.heard, "BlockStored", h, "STORAGE");
                assertThat(removedFromCpu).as("key %d left memory", h).isNotNegative();
                assertThat(storedToStorage).as("key %d landed on SSD after it left memory", h).isGreaterThan(removedFromCpu);
            }
        }
    }

    private static int indexOf(List<EventBatchReader.Event> heard, String type, long hash, String medium) {
        for (int i = 0; i < heard.size(); i++) {
            EventBatchReader.Event e = heard.get(i);
            if (e.type().equals(type) && medium.equals(e.medium()) && e.blockHashes().contains(hash)) {
                return i;
            }
        }
        return -1;
    }
}

package io.kvpool.master;

import io.kvpool.master.events.KvEventSink;
import io.kvpool.master.events.Medium;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.Consumer;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What the master says to routers (KV events), checked on the state machine alone: each kind of change
 * says what it changed, and a router that applies everything it heard holds exactly what the index
 * lists, after random operations and under concurrent puts racing a remove_all.
 */
class ObjectEventsTest {

    private static final int VALUE = 1000;
    private static final long REGION = ObjectLayout.regionLength(8, VALUE);
    private static final MasterMessages.TierStats DISK =
            new MasterMessages.TierStats(0, 0, 0, 1L << 30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);

    private final ManualClock clock = new ManualClock(1_700_000_000_000L);
    private long incarnations;

    /** One thing said: STORED, REMOVED or CLEARED, a key (null for CLEARED) and a medium. */
    private record Said(String kind, String key, Medium medium) {
        @Override
        public String toString() {
            return kind + (key == null ? "" : " " + key + " " + medium);
        }
    }

    /** Records what the master says, and applies it to a router's view: key to media. */
    private static final class Router implements KvEventSink {
        final List<Said> said = new ArrayList<>();
        final Map<String, EnumSet<Medium>> view = new TreeMap<>();

        @Override
        public synchronized void stored(List<byte[]> keys, Medium medium) {
            for (byte[] k : keys) {
                String key = new String(k, StandardCharsets.UTF_8);
                said.add(new Said("STORED", key, medium));
                view.computeIfAbsent(key, x -> EnumSet.noneOf(Medium.class)).add(medium);
            }
        }

        @Override
        public synchronized void removed(List<byte[]> keys, Medium medium) {
            for (byte[] k : keys) {
                String key = new String(k, StandardCharsets.UTF_8);
                said.add(new Said("REMOVED", key, medium));
                EnumSet<Medium> m = view.get(key);
                if (m != null && m.remove(medium) && m.isEmpty()) {
                    view.remove(key);
                }
            }
        }

        @Override
        public synchronized void allCleared() {
            said.add(new Said("CLEARED", null, null));
            view.clear();
        }

        synchronized List<Said> take() {
            List<Said> out = List.copyOf(said);
            said.clear();
            return out;
        }

        synchronized Map<String, EnumSet<Medium>> view() {
            return new TreeMap<>(view);
        }
    }

    /** What the index lists now: key to the media of its copies. */
    private static Map<String, EnumSet<Medium>> listed(ObjectIndex index) {
        Map<String, EnumSet<Medium>> out = new TreeMap<>();
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock
        Consumer<ObjectIndex.Shard> list = shard -> {
            ObjectTable t = shard.objects;
            for (int slot = 0; slot < t.size(); slot++) {
                EnumSet<Medium> m = EnumSet.noneOf(Medium.class);
                for (int r = 0; r < t.replicas(slot); r++) {
                    m.add(StoredSegment.onDisk(t.segment(slot, r)) ? Medium.STORAGE : Medium.CPU);
                }
                out.put(new String(t.key(slot), StandardCharsets.UTF_8), m);
            }
        };
        index.forEachShard(list);
        return out;
    }

    /** Where a router's view and the index's listing differ: key to "heard ..., listed ...", empty when they agree. */
    private static Map<String, String> differences(Map<String, EnumSet<Medium>> heard, Map<String, EnumSet<Medium>> listed) {
        Map<String, String> out = new TreeMap<>();
        java.util.Set<String> keys = new java.util.TreeSet<>(heard.keySet());
        keys.addAll(listed.keySet());
        for (String key : keys) {
            if (!java.util.Objects.equals(heard.get(key), listed.get(key))) {
                out.put(key, "heard " + heard.get(key) + ", listed " + listed.get(key));
            }
        }
        return out;
    }

    private static Said stored(String key, Medium m) {
        return new Said("STORED", key, m);
    }

    private static Said removed(String key, Medium m) {
        return new Said("REMOVED", key, m);
    }

    private static final Said CLEARED = new Said("CLEARED", null, null);

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** A master whose index says everything to {@code router}. */
    private MasterService master(ObjectIndex index, Router router) {
        MasterService s = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), NodeNotifier.NONE,
                index);
        s.publishEvents(router);
        return s;
    }

    /** Registers an active segment of {@code regions} test regions; with an SSD tier if {@code disk}. Returns {id, incarnation}. */
    private int[] join(MasterService s, String name, long regions, boolean disk) {
        long inc = ++incarnations;
        int seg = s.membership().registerNode(new RegisterNode(name, "10.0.0." + inc, 50052, regions * REGION, s.epoch(),
                inc, 0, "", ControlToken.random())).segmentId();
        s.membership().inventory(new Inventory(seg, inc, true, List.of()));
        s.membership().heartbeat(seg, inc, disk ? DISK : MasterMessages.TierStats.NONE);
        return new int[]{seg, (int) inc};
    }

    /** A put of a key of 8 bytes; its generation, or 0 if refused. */
    private static long put(MasterService s, String key, boolean upsert, long ifGeneration) {
        PutStartResult r = s.putStart(new PutStart(upsert, 1, "", List.of(new PutStartItem(k(key), VALUE, ifGeneration))))
                .results().getFirst();
        if (r.code() != ResultCode.OK) {
            return 0;
        }
        return s.putEnd(List.of(new PutEndItem(k(key), r.generation(), 0))).getFirst() == ResultCode.OK ? r.generation() : 0;
    }

    private static Inventory onDisk(int[] seg, String key, long generation, long epoch) {
        return new Inventory(seg[0], seg[1], true, List.of(new InventoryItem(0, generation, epoch, k(key), VALUE, Tier.DISK)));
    }

    @Test
    void putsRemovalsAndResetsSayWhatTheyChanged() {
        Router router = new Router();
        MasterService s = master(new ObjectIndex(), router);
        join(s, "a:1", 64, false);
        long g = put(s, "key-0001", false, 0);
        assertThat(router.take()).containsExactly(stored("key-0001", Medium.CPU));
        assertThat(put(s, "key-0001", true, g)).as("an upsert").isPositive();
        assertThat(router.take()).as("an upsert stays where it was: nothing to say").isEmpty();
        s.remove(List.of(k("key-0001"), k("key-none")));
        assertThat(router.take()).containsExactly(removed("key-0001", Medium.CPU));

        put(s, "pre/0001", false, 0);
        put(s, "pre/0002", false, 0);
        put(s, "key-0002", false, 0);
        router.take();
        assertThat(s.removeByPrefix(k("pre/"))).isEqualTo(2);
        assertThat(router.take()).containsExactlyInAnyOrder(removed("pre/0001", Medium.CPU), removed("pre/0002", Medium.CPU));
        assertThat(s.removeAll(true)).isOne();
        assertThat(router.take()).containsExactly(CLEARED);
        put(s, "key-0003", false, 0);
        router.take();
        assertThat(s.removeAll(false)).isOne();
        assertThat(router.take()).as("nothing was stored since it was announced").containsExactly(CLEARED);
        assertThat(router.view()).isEmpty();
    }

    @Test
    void evictionSpillsPromotionsAndDiskDropsMoveBetweenMedia() {
        Router router = new Router();
        ObjectIndex index = new ObjectIndex();
        MasterService s = master(index, router);
        int[] seg = join(s, "a:1", 16, true);
        Map<String, Long> generations = new HashMap<>();
        for (int i = 0; i < 24; i++) {
            String key = "key-%04d".formatted(i);
            generations.put(key, put(s, key, false, 0));
        }
        List<Said> said = router.take();
        List<String> evicted = said.stream().filter(x -> x.kind().equals("REMOVED")).map(Said::key).sorted().toList();
        assertThat(evicted).as("evicted to make room").isNotEmpty();
        assertThat(said).filteredOn(x -> x.kind().equals("REMOVED")).allMatch(x -> x.medium() == Medium.CPU);
        // a spilled object is listed on the SSD tier from its eviction on
        assertThat(said).filteredOn(x -> x.kind().equals("STORED")).hasSize(24 + evicted.size());
        assertThat(said).filteredOn(x -> x.kind().equals("STORED") && x.medium() == Medium.STORAGE)
                .map(Said::key).containsExactlyInAnyOrderElementsOf(evicted);

        // the spill lands: nothing changes for the router
        String a = evicted.get(0);
        assertThat(s.membership().diskAdd(onDisk(seg, a, generations.get(a), s.epoch()))).containsExactly(ResultCode.OK);
        assertThat(router.take()).isEmpty();
        // promotion: the node's conditional upsert moves it back to memory
        assertThat(put(s, a, true, generations.get(a))).isPositive();
        List<Said> promoted = router.take();
        assertThat(promoted).contains(removed(a, Medium.STORAGE), stored(a, Medium.CPU));
        assertThat(promoted.indexOf(removed(a, Medium.STORAGE))).isLessThan(promoted.indexOf(stored(a, Medium.CPU)));
        // another spill lands, then the SSD tier lets it go
        String b = evicted.get(1);
        s.membership().diskAdd(onDisk(seg, b, generations.get(b), s.epoch()));
        router.take();
        assertThat(s.membership().diskDrop(onDisk(seg, b, generations.get(b), s.epoch()))).containsExactly(ResultCode.OK);
        assertThat(router.take()).containsExactly(removed(b, Medium.STORAGE));
        assertThat(differences(router.view(), listed(index))).isEmpty();
    }

    @Test
    void aLostNodeTakesItsObjectsOutOfTheView() {
        Router router = new Router();
        ObjectIndex index = new ObjectIndex();
        MasterService s = master(index, router);
        join(s, "a:1", 64, false);
        put(s, "key-0001", false, 0);
        router.take();
        for (int i = 0; i < 30; i++) { // no heartbeat past the TTL
            clock.advance(Duration.ofSeconds(1));
            s.tick();
        }
        assertThat(s.keyCount()).isZero();
        assertThat(router.take()).containsExactly(removed("key-0001", Medium.CPU));
    }

    /**
     * A router that applies everything it hears holds what the index lists, after every one of many
     * random operations: puts, upserts, removals by key and prefix, evictions with spills that land or
     * not, SSD drops, node losses and resets. The seed is in the failure message.
     */
    @Test
    void aRouterApplyingEverythingItHeardHoldsWhatTheIndexLists() {
        long seed = new SplittableRandom().nextLong();
        SplittableRandom rnd = new SplittableRandom(seed);
        Router router = new Router();
        ObjectIndex index = new ObjectIndex(0xFF); // few shards and hashes: collisions, swaps, shifts
        MasterService s = master(index, router);
        List<int[]> segs = new ArrayList<>(List.of(join(s, "a:1", 12, true), join(s, "b:1", 12, false)));
        Map<String, Long> generations = new HashMap<>();
        for (int step = 0; step < 3_000; step++) {
            String key = (rnd.nextBoolean() ? "p/" : "q/") + "%06d".formatted(rnd.nextInt(60));
            int op = rnd.nextInt(100);
            String what;
            if (op < 45) {
                what = "put " + key;
                long g = put(s, key, rnd.nextInt(4) == 0, 0);
                if (g != 0) {
                    generations.put(key, g);
                }
            } else if (op < 60) {
                // a spill lands (usually one on its way: a key just evicted from memory)
                List<String> evicted = router.said.stream().filter(x -> x.equals(removed(x.key(), Medium.CPU)))
                        .map(Said::key).toList();
                String landing = evicted.isEmpty() || rnd.nextInt(5) == 0 ? key : evicted.get(rnd.nextInt(evicted.size()));
                what = "disk add " + landing;
                Long g = generations.get(landing);
                if (g != null) {
                    s.membership().diskAdd(onDisk(segs.getFirst(), landing, g, s.epoch()));
                }
            } else if (op < 64) {
                what = "disk drop " + key;
                Long g = generations.get(key);
                if (g != null) {
                    s.membership().diskDrop(onDisk(segs.getFirst(), key, g, s.epoch()));
                }
            } else if (op < 80) {
                what = "remove " + key;
                s.remove(List.of(k(key)));
            } else if (op < 83) {
                what = "remove prefix " + key.substring(0, 2);
                s.removeByPrefix(k(key.substring(0, 2)));
            } else if (op < 84 && rnd.nextInt(4) == 0) { // rare: one step in 400
                what = "remove all";
                s.removeAll(rnd.nextBoolean());
            } else if (op < 87) {
                what = "promote " + key;
                Long g = generations.get(key);
                long promoted = g == null ? 0 : put(s, key, true, g);
                if (promoted != 0) {
                    generations.put(key, promoted);
                }
            } else if (op < 88 && segs.size() == 2) {
                what = "lose b:1";
                for (int i = 0; i < 12; i++) {
                    clock.advance(Duration.ofSeconds(1));
                    s.membership().heartbeat(segs.getFirst()[0], segs.getFirst()[1], DISK);
                    s.tick();
                }
                segs.removeLast();
            } else {
                what = "tick";
                s.tick();
            }
            assertThat(differences(router.view(), listed(index))).as("seed %d, step %d (%s)", seed, step, what).isEmpty();
            if (router.said.size() > 200) {
                router.take(); // keep the recent ones only (what a disk add picks from)
            }
        }
    }

    /**
     * remove_all without force clears shard after shard while puts land: a router still ends with what
     * the index lists, whatever the interleaving (many rounds, three threads released together).
     */
    @Test
    void aRemoveAllRacingPutsLeavesTheRouterExact() throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(3);
        try {
            for (int round = 0; round < 40; round++) {
                Router router = new Router();
                ObjectIndex index = new ObjectIndex();
                MasterService s = master(index, router);
                join(s, "a:1", 4096, false);
                int r = round;
                java.util.concurrent.CyclicBarrier go = new java.util.concurrent.CyclicBarrier(3);
                List<Future<?>> work = new ArrayList<>();
                for (int t = 0; t < 2; t++) {
                    int thread = t;
                    work.add(pool.submit(() -> {
                        go.await();
                        for (int i = 0; i < 200; i++) {
                            put(s, "r%02d/t%d/%04d".formatted(r, thread, i), false, 0);
                        }
                        return null;
                    }));
                }
                work.add(pool.submit(() -> {
                    go.await();
                    for (int i = 0; i < 5; i++) {
                        s.removeAll(false);
                    }
                    return null;
                }));
                for (Future<?> f : work) {
                    f.get();
                }
                assertThat(differences(router.view(), listed(index))).as("round %d", round).isEmpty();
            }
        } finally {
            pool.shutdownNow();
        }
    }
}

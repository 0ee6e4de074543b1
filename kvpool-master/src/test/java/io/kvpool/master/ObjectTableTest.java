package io.kvpool.master;

import io.kvpool.protocol.KeyDigest;
import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * {@link ObjectTable} against a reference model (a {@code HashMap} keyed by the key bytes as a
 * string): random inserts, replacements, removals, lookups, touches, replica changes, scans that
 * remove and change entries, forced key compactions and clears, with keys of 1..512 bytes. Phases
 * alternate between growing and shrinking, so the table grows and shrinks, record pages are
 * released and slabs compact on their own. Hash masks force collisions: every key on one hash, a
 * handful of hashes, or distinct hashes sharing one home cell. Every field of every object is
 * checked against the model after each batch of steps; failures name the seed.
 */
class ObjectTableTest {

    /** The model's view of one object. */
    private record Obj(long valueLength, long generation, int tick, List<long[]> replicas) {
    }

    /** A mode: how hashes are squeezed, and how many distinct keys the run draws from. */
    static Stream<Arguments> runs() {
        List<Arguments> out = new ArrayList<>();
        int[][] modes = {
                {-1, 3000},          // real hashes
                {0xFFF0_0000, 500},  // distinct hashes, all on the same home cell (low bits zero)
                {0x7, 400},          // eight hashes: long runs, tag and hash collisions
                {0, 200},            // one hash for every key: everything is decided by the key bytes
        };
        for (int[] m : modes) {
            for (long seed = 1; seed <= 12; seed++) {
                out.add(Arguments.of(seed * 7919 + m[0], m[0], m[1]));
            }
        }
        return out.stream();
    }

    @ParameterizedTest(name = "seed {0}, hash mask {1}, {2} keys")
    @MethodSource("runs")
    void behavesLikeAMap(long seed, int hashMask, int universe) {
        new Run(seed, hashMask, universe).go(20_000);
    }

    private static final class Run {
        final long seed;
        final int hashMask;
        final SplittableRandom rnd;
        final List<byte[]> keys = new ArrayList<>();
        final Map<String, Obj> model = new HashMap<>();
        /** The model's pins (key to deadline) and copies wanted, beside {@link #model}. */
        final Map<String, Long> pins = new HashMap<>();
        final Map<String, Integer> wanted = new HashMap<>();
        final AtomicLong poolPinned = new AtomicLong();
        final ObjectTable table = new ObjectTable(poolPinned, ObjectEvents.Shard.off());
        int tick;
        long gen = 1_000;
        int steps;

        Run(long seed, int hashMask, int universe) {
            this.seed = seed;
            this.hashMask = hashMask;
            this.rnd = new SplittableRandom(seed);
            Set<String> seen = new HashSet<>();
            String[] prefixes = {"", "m1/", "m2/", "llama3-8b@v7/tp0/", "x"};
            while (keys.size() < universe) {
                byte[] k;
                if (rnd.nextInt(3) == 0) {
                    // a shared prefix and hex, as engines name blocks
                    String p = prefixes[rnd.nextInt(prefixes.length)];
                    StringBuilder sb = new StringBuilder(p);
                    int hex = 1 + rnd.nextInt(rnd.nextBoolean() ? 8 : 64);
                    for (int i = 0; i < hex; i++) {
                        sb.append(Character.forDigit(rnd.nextInt(16), 16));
                    }
                    k = sb.toString().getBytes(StandardCharsets.UTF_8);
                } else {
                    int len = rnd.nextInt(4) == 0 ? 1 + rnd.nextInt(512) : 1 + rnd.nextInt(rnd.nextBoolean() ? 8 : 100);
                    k = new byte[len];
                    for (int i = 0; i < len; i++) {
                        // few distinct byte values for short keys, so lengths and contents collide often
                        k[i] = (byte) (len < 4 ? 'a' + rnd.nextInt(3) : rnd.nextInt(256));
                    }
                }
                if (k.length <= 512 && seen.add(s(k))) {
                    keys.add(k);
                }
            }
        }

        static String s(byte[] k) {
            return new String(k, StandardCharsets.ISO_8859_1);
        }

        int hash(byte[] k) {
            return Key.hash(k) & hashMask;
        }

        String at() {
            return "seed " + seed + ", hash mask " + Integer.toHexString(hashMask) + ", step " + steps;
        }

        void go(int total) {
            boolean growing = true;
            while (steps < total) {
                // alternate growing and shrinking phases, so tables grow and shrink and slabs compact
                if (steps % 2500 == 0) {
                    growing = !growing || model.isEmpty();
                }
                for (int b = 0; b < 100; b++, steps++) {
                    step(growing);
                }
                check();
            }
        }

        byte[] anyKey() {
            return keys.get(rnd.nextInt(keys.size()));
        }

        List<long[]> randomReplicas() {
            int n = rnd.nextInt(10) < 8 ? 1 : 2 + rnd.nextInt(7);
            List<long[]> r = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                r.add(new long[]{rnd.nextInt(1, 50), 64L * rnd.nextLong(1L << 40)});
            }
            return r;
        }

        void step(boolean growing) {
            int op = rnd.nextInt(100);
            byte[] k = anyKey();
            int h = hash(k);
            int slot = table.find(k, h);
            Obj o = model.get(s(k));
            assertThat(slot >= 0).as("presence of a key, %s", at()).isEqualTo(o != null);
            if (op < (growing ? 45 : 15)) {
                // put: insert, or replace the version of a present key
                List<long[]> reps = randomReplicas();
                int[] segs = new int[reps.size() + 2];
                long[] offs = new long[reps.size() + 2];
                for (int i = 0; i < reps.size(); i++) {
                    segs[i] = (int) reps.get(i)[0];
                    offs[i] = reps.get(i)[1];
                }
                long vl = rnd.nextLong(1L << 40);
                long g = ++gen;
                int t = ++tick;
                if (slot >= 0) {
                    table.replace(slot, vl, g, t, segs, offs, reps.size());
                } else {
                    int s = table.insert(k, h, vl, g, t, segs, offs, reps.size());
                    assertThat(table.find(k, h)).as("inserted key is found at its slot, %s", at()).isEqualTo(s);
                }
                model.put(s(k), new Obj(vl, g, t, reps));
                pins.remove(s(k));
                wanted.put(s(k), reps.size());
            } else if (op < (growing ? 60 : 60)) {
                if (slot >= 0) {
                    table.remove(slot);
                    forget(s(k));
                    assertThat(table.find(k, h)).as("removed key is gone, %s", at()).isEqualTo(-1);
                }
            } else if (op < 65) {
                if (slot >= 0) {
                    switch (rnd.nextInt(3)) {
                        case 0 -> {
                            long until = 1 + rnd.nextLong(1L << 50);
                            table.pin(slot, until);
                            pins.put(s(k), until);
                        }
                        case 1 -> {
                            table.pin(slot, 0);
                            pins.remove(s(k));
                        }
                        default -> {
                            int w = 1 + rnd.nextInt(8);
                            table.setWanted(slot, w);
                            wanted.put(s(k), w);
                        }
                    }
                }
            } else if (op < 70) {
                if (slot >= 0) {
                    int t = ++tick;
                    table.touch(slot, t);
                    model.put(s(k), new Obj(o.valueLength, o.generation, t, o.replicas));
                }
            } else if (op < 75) {
                if (slot >= 0) {
                    long[] rep = {rnd.nextInt(1, 50), 64L * rnd.nextLong(1L << 40)};
                    table.addReplica(slot, (int) rep[0], rep[1]);
                    List<long[]> reps = new ArrayList<>(o.replicas);
                    reps.add(rep);
                    model.put(s(k), new Obj(o.valueLength, o.generation, o.tick, reps));
                    wanted.merge(s(k), reps.size(), Math::max);
                }
            } else if (op < 80) {
                if (slot >= 0 && o.replicas.size() > 1) {
                    int idx = rnd.nextInt(o.replicas.size());
                    table.removeReplica(slot, idx);
                    List<long[]> reps = new ArrayList<>(o.replicas);
                    reps.remove(idx);
                    model.put(s(k), new Obj(o.valueLength, o.generation, o.tick, reps));
                }
            } else if (op < 81) {
                scan();
            } else if (op < 82) {
                long now = rnd.nextLong(1L << 50);
                int expired = table.expirePins(now);
                int before = pins.size();
                pins.values().removeIf(until -> until <= now);
                assertThat(expired).as("pins expired, %s", at()).isEqualTo(before - pins.size());
            } else if (op < 83) {
                table.compactKeys();
            } else if (op == 83 && rnd.nextInt(20) == 0) {
                table.clear();
                model.clear();
                pins.clear();
                wanted.clear();
            } else if (op == 84 && !growing && rnd.nextInt(5) == 0) {
                // a mass removal: most of the table goes at once, then it must shrink
                for (byte[] key : keys) {
                    int s = table.find(key, hash(key));
                    if (s >= 0 && rnd.nextInt(10) != 0) {
                        table.remove(s);
                        forget(s(key));
                    }
                }
            } else if (op < 92) {
                // a group looked up level by level, in a shuffled order, with repeats, as a batch does it
                int n = 1 + rnd.nextInt(40);
                byte[][] group = new byte[n][];
                int[] hashes = new int[n];
                for (int i = 0; i < n; i++) {
                    group[i] = i > 0 && rnd.nextInt(6) == 0 ? group[rnd.nextInt(i)] : anyKey();
                    hashes[i] = hash(group[i]);
                }
                int[] order = new int[n + 4];
                for (int i = 0; i < n; i++) {
                    order[i + 2] = i;
                }
                for (int i = n - 1; i > 0; i--) {
                    int j = rnd.nextInt(i + 1);
                    int x = order[i + 2];
                    order[i + 2] = order[j + 2];
                    order[j + 2] = x;
                }
                int[] slots = new int[n + 4];
                Arrays.fill(slots, 99);
                table.findAll(group, hashes, order, 2, n + 2, slots);
                assertThat(slots[0] == 99 && slots[1] == 99 && slots[n + 2] == 99).as("only [from, to), %s", at()).isTrue();
                for (int j = 2; j < n + 2; j++) {
                    byte[] q = group[order[j]];
                    Obj m = model.get(s(q));
                    assertThat(slots[j]).as("batch lookup, %s", at()).isEqualTo(table.find(q, hash(q)));
                    if (m != null) {
                        checkSlot(slots[j], q, m);
                    } else {
                        assertThat(slots[j]).as("batch lookup of a missing key, %s", at()).isEqualTo(-1);
                    }
                }
            } else {
                // lookups of a few keys, present or not
                for (int i = 0; i < 5; i++) {
                    byte[] q = anyKey();
                    Obj m = model.get(s(q));
                    int qs = table.find(q, hash(q));
                    assertThat(qs >= 0).as("lookup, %s", at()).isEqualTo(m != null);
                    if (m != null) {
                        checkSlot(qs, q, m);
                    }
                }
            }
        }

        /** A scan that removes some objects and changes the replicas of others, like dropping a segment. */
        void scan() {
            int kind = rnd.nextInt(3);
            byte[] prefix = Arrays.copyOf(anyKey(), 1 + rnd.nextInt(3));
            int dropSeg = rnd.nextInt(1, 50);
            long salt = rnd.nextLong();
            Set<String> visited = new HashSet<>();
            Set<String> expectedRemoved = new HashSet<>();
            int removed = table.removeIf(slot -> {
                byte[] k = table.key(slot);
                String ks = s(k);
                assertThat(visited.add(ks)).as("each object is visited once, %s", at()).isTrue();
                Obj o = model.get(ks);
                assertThat(o).as("a visited object is in the model, %s", at()).isNotNull();
                checkSlot(slot, k, o);
                boolean remove;
                switch (kind) {
                    case 0 -> remove = table.keyStartsWith(slot, prefix);
                    case 1 -> remove = ((Key.hash(k) ^ salt) & 3) == 0;
                    default -> {
                        int idx = -1;
                        for (int i = 0; i < table.replicas(slot); i++) {
                            if (table.segment(slot, i) == dropSeg) {
                                idx = i;
                                break;
                            }
                        }
                        remove = idx >= 0 && table.replicas(slot) == 1;
                        if (idx >= 0 && !remove) {
                            table.removeReplica(slot, idx);
                            List<long[]> reps = new ArrayList<>(o.replicas);
                            reps.remove(idx);
                            model.put(ks, new Obj(o.valueLength, o.generation, o.tick, reps));
                        }
                    }
                }
                if (remove) {
                    expectedRemoved.add(ks);
                }
                return remove;
            });
            assertThat(visited).as("the scan visits every object, %s", at()).isEqualTo(model.keySet());
            assertThat(removed).as("removed count, %s", at()).isEqualTo(expectedRemoved.size());
            for (String k : expectedRemoved) {
                forget(k);
            }
            if (kind == 0) {
                for (String k : model.keySet()) {
                    assertThat(k.startsWith(s(prefix))).as("prefix scan leaves no match, %s", at()).isFalse();
                }
            }
        }

        void forget(String k) {
            model.remove(k);
            pins.remove(k);
            wanted.remove(k);
        }

        void checkSlot(int slot, byte[] k, Obj o) {
            String at = at();
            assertThat(table.wanted(slot)).as("copies wanted, %s", at).isEqualTo(wanted.get(s(k)));
            assertThat(table.pinnedUntil(slot)).as("pin, %s", at).isEqualTo(pins.getOrDefault(s(k), 0L));
            assertThat(table.key(slot)).as("key bytes, %s", at).isEqualTo(k);
            assertThat(table.keyLength(slot)).as("key length, %s", at).isEqualTo(k.length);
            assertThat(table.hash(slot)).as("hash, %s", at).isEqualTo(hash(k));
            assertThat(table.valueLength(slot)).as("value length, %s", at).isEqualTo(o.valueLength);
            assertThat(table.generation(slot)).as("generation, %s", at).isEqualTo(o.generation);
            assertThat(table.lastAccess(slot)).as("last access, %s", at).isEqualTo(o.tick);
            assertThat(table.replicas(slot)).as("replica count, %s", at).isEqualTo(o.replicas.size());
            for (int i = 0; i < o.replicas.size(); i++) {
                assertThat(table.segment(slot, i)).as("segment of replica %d, %s", i, at).isEqualTo((int) o.replicas.get(i)[0]);
                assertThat(table.offset(slot, i)).as("offset of replica %d, %s", i, at).isEqualTo(o.replicas.get(i)[1]);
            }
        }

        void check() {
            try {
                table.checkInvariants();
            } catch (IllegalStateException e) {
                throw new AssertionError("invariant broken, " + at() + ": " + e.getMessage(), e);
            }
            assertThat(table.size()).as("size, %s", at()).isEqualTo(model.size());
            long pinned = 0;
            for (var e : pins.entrySet()) {
                Obj o = model.get(e.getKey());
                pinned += ObjectLayout.regionLength(e.getKey().length(), o.valueLength) * wanted.get(e.getKey());
            }
            assertThat(table.pinnedBytes()).as("pinned bytes, %s", at()).isEqualTo(pinned);
            assertThat(poolPinned.get()).as("the pool's pinned bytes, %s", at()).isEqualTo(pinned);
            Set<String> inTable = new HashSet<>();
            for (int slot = 0; slot < table.size(); slot++) {
                inTable.add(s(table.key(slot)));
            }
            assertThat(inTable).as("the slots hold exactly the model's keys, %s", at()).isEqualTo(model.keySet());
            for (byte[] k : keys) {
                Obj o = model.get(s(k));
                int slot = table.find(k, hash(k));
                assertThat(slot >= 0).as("presence, %s", at()).isEqualTo(o != null);
                if (o != null) {
                    checkSlot(slot, k, o);
                }
            }
            // space is given back: few slab bytes beyond the live keys, a table sized to its contents
            long live = table.liveKeyBytes();
            assertThat(table.slabBytes()).as("slab bytes against %d live, %s", live, at())
                    .isLessThanOrEqualTo(Math.max(64 * 1024, 2 * live + 2 * KeySlabs.MAX_SLAB));
            assertThat(table.tableCapacity()).as("table capacity for %d objects, %s", table.size(), at())
                    .isLessThanOrEqualTo(Math.max(64, 16 * table.size()));
        }
    }

    @Test
    void compactionAndShrinkHappenOnTheirOwn() {
        ObjectTable t = new ObjectTable();
        List<byte[]> keys = new ArrayList<>();
        for (int i = 0; i < 20_000; i++) {
            byte[] k = ("llama3-8b@v7/tp0/" + "%064x".formatted(i)).getBytes(StandardCharsets.UTF_8);
            keys.add(k);
            t.insert(k, Key.hash(k), i, i, 0, new int[]{1}, new long[]{64L * i}, 1);
        }
        int grown = t.tableCapacity();
        long slabs = t.slabBytes();
        for (int i = 0; i < 19_900; i++) {
            byte[] k = keys.get(i);
            t.remove(t.find(k, Key.hash(k)));
        }
        t.checkInvariants();
        assertThat(t.size()).isEqualTo(100);
        assertThat(t.tableCapacity()).isLessThan(grown / 16);
        assertThat(t.slabBytes()).isLessThan(slabs / 16);
        for (int i = 19_900; i < 20_000; i++) {
            byte[] k = keys.get(i);
            int slot = t.find(k, Key.hash(k));
            assertThat(slot).isNotNegative();
            assertThat(t.generation(slot)).isEqualTo(i);
            assertThat(t.offset(slot, 0)).isEqualTo(64L * i);
        }
    }

    /**
     * A lookup by digest compares the stored hash and the stored high half, never the key: keys made
     * to share one table hash (so one probe run) are each found by their own digest, a digest of an
     * absent key with that hash is not found, and the answers survive swap-removes and a compaction
     * that move records and keys.
     */
    @Test
    void aLookupByDigestFindsEachKeyAmongKeysOfTheSameHashAndNoOther() {
        ObjectTable t = new ObjectTable();
        int hash = 0x1234_5678;
        List<byte[]> keys = new ArrayList<>();
        for (int i = 0; i < 300; i++) {
            byte[] k = ("model/w1/tp0/" + "%064x".formatted(i * 7919L)).getBytes(StandardCharsets.UTF_8);
            keys.add(k);
            t.insert(k, hash, i, i, 0, new int[]{1}, new long[]{64L * i}, 1);
        }
        for (int i = 0; i < 300; i += 3) {
            t.remove(t.find(keys.get(i), hash));
        }
        t.compactKeys();
        t.checkInvariants();
        for (int i = 0; i < 300; i++) {
            long[] d = KeyDigest.of(keys.get(i));
            int slot = t.findDigest(d[0], d[1], hash);
            if (i % 3 == 0) {
                assertThat(slot).as("removed key %d", i).isEqualTo(-1);
            } else {
                assertThat(slot).as("key %d", i).isNotNegative();
                assertThat(t.key(slot)).isEqualTo(keys.get(i));
            }
        }
        long[] absent = KeyDigest.of("model/w1/tp0/absent".getBytes(StandardCharsets.UTF_8));
        assertThat(t.findDigest(absent[0], absent[1], hash)).isEqualTo(-1);
    }

    @Test
    void oversizedKeysAreRefusedAndNeverFound() {
        ObjectTable t = new ObjectTable();
        byte[] big = new byte[ObjectTable.MAX_KEY + 1];
        assertThat(t.find(big, Key.hash(big))).isEqualTo(-1);
        assertThatThrownBy(() -> t.insert(big, Key.hash(big), 1, 1, 0, new int[]{1}, new long[]{0}, 1))
                .isInstanceOf(IllegalArgumentException.class);
        byte[] largest = new byte[ObjectTable.MAX_KEY];
        Arrays.fill(largest, (byte) 7);
        int slot = t.insert(largest, Key.hash(largest), 1, 2, 0, new int[]{1}, new long[]{0}, 1);
        assertThat(t.find(largest, Key.hash(largest))).isEqualTo(slot);
        t.checkInvariants();
    }

    @Test
    void hashSpreadsEngineKeysEvenlyOverShards() {
        int[] perShard = new int[ObjectIndex.SHARDS];
        int n = 640_000;
        for (int i = 0; i < n; i++) {
            byte[] k = IndexFootprint.key(i);
            perShard[ObjectIndex.shardOf(Key.hash(k))]++;
        }
        int mean = n / ObjectIndex.SHARDS;
        // binomial with sd ~ 99: 5 sd either side
        assertThat(Arrays.stream(perShard).min().orElseThrow()).isGreaterThan(mean - 500);
        assertThat(Arrays.stream(perShard).max().orElseThrow()).isLessThan(mean + 500);
    }
}

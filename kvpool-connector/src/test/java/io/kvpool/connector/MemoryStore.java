package io.kvpool.connector;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.protocol.KeyDigest;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;

/**
 * A pool in a map, for {@link PoolConnector} under test: the real connector over a test double of
 * the store. It answers as the pool does (a put of a present key is ALREADY_EXISTS, a prefix match
 * stops at the first absent key, a miss reads {@link KvPoolClient#MISS}), records what lookups asked,
 * and can be told to fail: the next call of a kind throws, chosen keys read short, chosen keys'
 * puts answer a status and store nothing. Thread-safe (the connector loads and saves on its threads).
 */
final class MemoryStore implements PoolStore {

    /** The calls a fault can target. */
    enum Call { LOOKUP, LOAD, SAVE, RESET }

    private final Map<String, byte[]> objects = new ConcurrentHashMap<>();
    private final Map<Digest, String> byDigest = new ConcurrentHashMap<>();
    private final Set<Call> failNext = EnumSet.noneOf(Call.class);
    private final Set<String> shortReads = ConcurrentHashMap.newKeySet();
    private final Map<String, PutStatus> putAnswers = new ConcurrentHashMap<>();
    private final List<long[]> probes = new ArrayList<>();
    /** Runs at the start of each putBatch (a gate for tests that hold a save). */
    volatile Consumer<List<String>> beforePut = k -> { };
    /** Runs at the start of each getIntoBatch (a gate for tests that hold a load). */
    volatile Consumer<List<String>> beforeGet = k -> { };

    private record Digest(long lo, long hi) {
        static Digest of(String key) {
            long[] d = KeyDigest.of(key.getBytes(StandardCharsets.UTF_8));
            return new Digest(d[0], d[1]);
        }
    }

    synchronized void failNext(Call call) {
        failNext.add(call);
    }

    void readShort(String key) {
        shortReads.add(key);
    }

    void answerPut(String key, PutStatus status) {
        putAnswers.put(key, status);
    }

    private synchronized void maybeFail(Call call) {
        if (failNext.remove(call)) {
            throw new IllegalStateException("test store: " + call.name().toLowerCase() + " failed as told");
        }
    }

    /** The digests (lo, hi) every lookup asked about since the last call, in order. */
    synchronized List<long[]> takeProbes() {
        List<long[]> out = new ArrayList<>(probes);
        probes.clear();
        return out;
    }

    byte[] get(String key) {
        return objects.get(key);
    }

    Set<String> keys() {
        return Set.copyOf(objects.keySet());
    }

    boolean remove(String key) {
        byDigest.remove(Digest.of(key));
        return objects.remove(key) != null;
    }

    @Override
    public int prefixMatchDigests(long[] digests, int from, int to) {
        maybeFail(Call.LOOKUP);
        int present = 0;
        boolean stopped = false;
        for (int i = from; i < to; i++) {
            synchronized (this) {
                probes.add(new long[]{digests[2 * i], digests[2 * i + 1]});
            }
            if (!stopped && byDigest.containsKey(new Digest(digests[2 * i], digests[2 * i + 1]))) {
                present++;
            } else {
                stopped = true;
            }
        }
        return present;
    }

    @Override
    public long[] getIntoBatch(List<String> keys, List<MemorySegment> dsts) {
        beforeGet.accept(keys);
        maybeFail(Call.LOAD);
        long[] got = new long[keys.size()];
        for (int i = 0; i < keys.size(); i++) {
            byte[] v = objects.get(keys.get(i));
            if (v == null) {
                got[i] = KvPoolClient.MISS;
                continue;
            }
            int n = shortReads.contains(keys.get(i)) ? v.length / 2 : v.length;
            MemorySegment.copy(MemorySegment.ofArray(v), 0, dsts.get(i), 0, n);
            got[i] = n;
        }
        return got;
    }

    @Override
    public List<PutStatus> putBatch(List<String> keys, List<MemorySegment> values) {
        beforePut.accept(keys);
        maybeFail(Call.SAVE);
        List<PutStatus> out = new ArrayList<>(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            out.add(store(keys.get(i), values.get(i).toArray(ValueLayout.JAVA_BYTE)));
        }
        return out;
    }

    /** Stores {@code value} under {@code k} as the pool would (or answers what the test told it to). */
    private PutStatus store(String k, byte[] value) {
        PutStatus told = putAnswers.get(k);
        if (told != null) {
            return told;
        }
        if (objects.putIfAbsent(k, value) == null) {
            byDigest.put(Digest.of(k), k);
            return PutStatus.OK;
        }
        return PutStatus.ALREADY_EXISTS;
    }

    /** Ranged reads of what was stored when located (a later removal makes them miss, as in the pool). */
    @Override
    public Ranges locate(List<String> keys) {
        beforeGet.accept(keys);
        maybeFail(Call.LOAD);
        byte[][] at = new byte[keys.size()][];
        for (int i = 0; i < at.length; i++) {
            at[i] = objects.get(keys.get(i));
        }
        return new Ranges() {
            @Override
            public long valueLength(int i) {
                return at[i] == null ? KvPoolClient.MISS : at[i].length;
            }

            @Override
            public long[] read(long[] offsets, List<MemorySegment> dsts) {
                long[] got = new long[at.length];
                for (int i = 0; i < at.length; i++) {
                    String k = keys.get(i);
                    long n = dsts.get(i).byteSize();
                    boolean shortened = shortReads.contains(k) && offsets[i] + n > at[i].length / 2;
                    if (at[i] == null || objects.get(k) != at[i] || shortened) {
                        got[i] = KvPoolClient.MISS;
                        continue;
                    }
                    MemorySegment.copy(MemorySegment.ofArray(at[i]), offsets[i], dsts.get(i), 0, n);
                    got[i] = n;
                }
                return got;
            }
        };
    }

    /** A put in parts: each item's bytes gathered, stored at the finish only if every byte was written. */
    @Override
    public Parts beginPut(List<String> keys, long[] valueLengths) {
        beforePut.accept(keys);
        maybeFail(Call.SAVE);
        byte[][] values = new byte[keys.size()][];
        long[] written = new long[keys.size()];
        for (int i = 0; i < values.length; i++) {
            values[i] = new byte[Math.toIntExact(valueLengths[i])];
        }
        return new Parts() {
            @Override
            public synchronized boolean[] write(int[] items, long[] offsets, List<MemorySegment> srcs) {
                boolean[] ok = new boolean[items.length];
                for (int j = 0; j < items.length; j++) {
                    MemorySegment.copy(srcs.get(j), 0, MemorySegment.ofArray(values[items[j]]), offsets[j],
                            srcs.get(j).byteSize());
                    written[items[j]] += srcs.get(j).byteSize();
                    ok[j] = true;
                }
                return ok;
            }

            @Override
            public synchronized List<PutStatus> finish() {
                List<PutStatus> out = new ArrayList<>(values.length);
                for (int i = 0; i < values.length; i++) {
                    boolean whole = written[i] == values[i].length || putAnswers.containsKey(keys.get(i));
                    out.add(whole ? store(keys.get(i), values[i]) : PutStatus.FAILED);
                }
                return out;
            }

            @Override
            public void abandon() {
            }
        };
    }

    @Override
    public long removeAll(boolean force) {
        maybeFail(Call.RESET);
        long n = objects.size();
        objects.clear();
        byDigest.clear();
        return n;
    }

    @Override
    public long removeByPrefix(String prefix) {
        maybeFail(Call.RESET);
        long n = 0;
        for (String k : new ArrayList<>(objects.keySet())) {
            if (k.startsWith(prefix) && remove(k)) {
                n++;
            }
        }
        return n;
    }
}

package io.kvpool.master;

import io.kvpool.protocol.KeyDigest;
import io.kvpool.protocol.ObjectLayout;

import java.util.Arrays;
import java.util.HashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One shard's complete objects, stored without an object per entry: primitive arrays whose size
 * depends only on the number of objects and their key bytes. Per object: a 56-byte record, the key
 * bytes ({@link KeySlabs}), and 4 to 8 bytes of hash table; at 10 million objects under 81-byte keys
 * the master's heap grew by about 137 bytes per object with 48-byte records (with a {@code HashMap}
 * of entry objects it was about 255); the digest word adds 8.
 * Not thread-safe: the owning {@link ObjectIndex.Shard}'s lock guards every call.
 *
 * <h2>Layout</h2>
 * <pre>
 *  hash table: 2^k int cells (in pages of 32 Ki cells), linear probing, load at most 0.7
 *  +--------------+--------------------------+
 *  | tag (8 bits) | slot + 1 (24 bits)       |   0 = empty cell; tag = 8 more bits of the key's hash,
 *  +--------------+--------------------------+   so a probe rarely reads a record it does not want
 *         |
 *         v
 *  records: pages of 1024 records, 7 longs (56 bytes) each, slots 0 .. size-1 all live (dense)
 *  +------+--------------------------------------------------------------------+
 *  | word | content                                                            |
 *  +------+--------------------------------------------------------------------+
 *  |  0   | key address (below)                                                |
 *  |  1   | key hash (high 32 bits) | last access tick (low 32 bits)           |
 *  |  2   | value length                                                       |
 *  |  3   | generation                                                         |
 *  |  4   | copies wanted (bits 40-47) | replica count (bits 32-39) | segment id of replica 0 (low 32) |
 *  |  5   | region offset of replica 0                                         |
 *  |  6   | hi: the high half of the key's 128-bit digest (KeyDigest)          |
 *  +------+--------------------------------------------------------------------+
 *  replicas 1..n-1 (rare): extras.get(slot) = {segment 1, offset 1, segment 2, offset 2, ...}
 *  pinned objects (rare):  SlotPins, slot to the pin's deadline
 *  key address: where the key's bytes are in the shard's KeySlabs (drawn there)
 * </pre>
 * The key hash is the low half of the key's digest's {@code lo}, so with word 6 a record holds 96 of
 * the digest's 128 bits: a lookup by digest ({@link #findDigest}) compares those and never reads the
 * key (it used to digest the stored key for every candidate, most of a 1,024-key prefix match).
 *
 * <h2>Invariants</h2>
 * <ul>
 *   <li>Records are dense: slots {@code 0..size-1} are exactly the live objects. Removing slot s moves
 *       the record in the last slot into s and repoints its table cell ("swap-remove"), so there is no
 *       free list, scans touch no holes, and record pages past the end can be released.</li>
 *   <li>Every live slot is referenced by exactly one table cell, reachable from its home cell
 *       ({@code hash & mask}) without crossing an empty cell. Deletion shifts the following cells of
 *       the run back (backward-shift deletion), so there are no tombstones and no probe run ever
 *       gets longer through churn.</li>
 *   <li>{@code liveKeyBytes} is the sum of live key lengths; everything else written to the slabs is
 *       garbage. When garbage exceeds half the slab bytes, the keys are copied to fresh slabs
 *       ({@link #compactKeys}): the cost is proportional to the bytes freed since the last time, so
 *       it is amortized O(1) per removal, and it is per shard (under that shard's lock only).</li>
 * </ul>
 * Lookups allocate nothing: keys are compared against the slab in place
 * ({@link Arrays#equals(byte[], int, int, byte[], int, int)}). The arrays that grow with the number
 * of objects are at most 256 KiB each (record pages 56 KiB, table pages 128 KiB, slabs 256 KiB), so
 * none is a G1 humongous object, which would waste the rest of its heap regions.
 *
 * <p>Limits: {@value #MAX_SIZE} objects per table (a billion over 64 shards), keys of at most
 * {@value #MAX_KEY} bytes.
 */
final class ObjectTable {

    // record words
    private static final int KEY = 0;
    private static final int META = 1;
    private static final int LENGTH = 2;
    private static final int GEN = 3;
    private static final int SEG = 4;
    private static final int OFFSET = 5;
    private static final int DIGEST_HI = 6;
    private static final int WORDS = 7;

    private static final int PAGE_SHIFT = 10;
    private static final int PAGE_RECORDS = 1 << PAGE_SHIFT;
    private static final int PAGE_MASK = PAGE_RECORDS - 1;
    private static final int FIRST_PAGE_RECORDS = 16;

    // table cells
    private static final int SLOT_BITS = 24;
    private static final int SLOT_MASK = (1 << SLOT_BITS) - 1;
    /** Slots per table, so that slot + 1 fits in a cell: 16.7 M per shard, a billion objects in all. */
    static final int MAX_SIZE = SLOT_MASK - 1;
    private static final int MIN_TABLE = 16;
    private static final int CELL_PAGE_SHIFT = 15;
    /**
     * Cells per table page: 128 KiB, under G1's smallest humongous threshold (half a 1 MiB region), so
     * a big table is never a humongous object that wastes the rest of its regions.
     */
    static final int CELL_PAGE = 1 << CELL_PAGE_SHIFT;
    private static final int CELL_PAGE_MASK = CELL_PAGE - 1;
    private static final float MAX_LOAD = 0.7f;

    /** Longest key the table stores (the wire allows {@value io.kvpool.protocol.Keys#MAX_KEY_BYTES}). */
    static final int MAX_KEY = KeySlabs.MAX_KEY;

    /** The hash table, in pages of {@link #CELL_PAGE} cells (one page when smaller): no humongous array. */
    private int[][] cells = newCells(MIN_TABLE);
    private int capacity = MIN_TABLE;
    private int growAt = (int) (MIN_TABLE * MAX_LOAD);
    private long[][] pages = new long[1][];
    private int size;
    /** Replicas after the first, for the few objects that have more than one. */
    private final HashMap<Integer, long[]> extras = new HashMap<>();
    private final SlotPins pins;
    /** Told of every change of a key's media (KV events for routers; {@link ObjectEvents} draws the hooks). */
    final ObjectEvents.Shard events;

    ObjectTable() {
        this(new AtomicLong(), ObjectEvents.Shard.off());
    }

    ObjectTable(AtomicLong poolPinned, ObjectEvents.Shard events) {
        this.pins = new SlotPins(poolPinned);
        this.events = events;
    }

    private KeySlabs keys = new KeySlabs();
    /** Scratch for {@link #insert}'s digest (the table is used under one lock at a time). */
    private final long[] digest = new long[2];
    /** Set during {@link #removeIf}: shrink and compaction wait until the scan is over. */
    private boolean scanning;

    int size() {
        return size;
    }

    // ================================================================== lookup

    /** The slot holding {@code key} (whose hash is {@code hash}), or -1. */
    int find(byte[] key, int hash) {
        if (key.length > MAX_KEY) {
            return -1;
        }
        return probe(hash, (page, r) -> keys.equals(page[r + KEY], key));
    }

    /** Decides whether a candidate record ({@code page}, from index {@code r}) is the one looked for. */
    @FunctionalInterface
    private interface RecordMatch {
        boolean matches(long[] page, int r);
    }

    /**
     * Walks {@code hash}'s run of cells and returns the first slot whose record has this hash and
     * whose stored key {@code match} accepts, or -1 at the first empty cell.
     */
    private int probe(int hash, RecordMatch match) {
        int[][] t = cells;
        int mask = capacity - 1;
        int tag = tag(hash);
        for (int i = hash & mask; ; i = (i + 1) & mask) {
            int c = t[i >>> CELL_PAGE_SHIFT][i & CELL_PAGE_MASK];
            if (c == 0) {
                return -1;
            }
            if ((c & ~SLOT_MASK) == tag) {
                int slot = (c & SLOT_MASK) - 1;
                long[] page = pages[slot >>> PAGE_SHIFT];
                int r = (slot & PAGE_MASK) * WORDS;
                if ((int) (page[r + META] >>> 32) == hash && match.matches(page, r)) {
                    return slot;
                }
            }
        }
    }

    /**
     * Looks up a group of keys at once: {@code slots[j]} gets the slot of {@code keys[order[j]]} (hash
     * {@code hashes[order[j]]}), or -1, for {@code j} in {@code [from, to)}. The same answers as
     * {@link #find}, computed level by level: first every key's table cell, then every candidate's
     * record, then every candidate's key bytes. The loads of one level do not depend on each other, so
     * the CPU overlaps their cache misses (and page walks) instead of taking them one key after
     * another, which is most of the cost of a lookup in a big table. A candidate that fails (a tag
     * that matched by chance) falls back to {@link #find}.
     */
    void findAll(byte[][] keys, int[] hashes, int[] order, int from, int to, int[] slots) {
        int[][] t = cells;
        int mask = capacity - 1;
        // level 1: the first cell of each key's run with the key's tag (-1: an empty cell came first)
        for (int j = from; j < to; j++) {
            int h = hashes[order[j]];
            int tag = tag(h);
            int slot = -1;
            for (int i = h & mask; ; i = (i + 1) & mask) {
                int c = t[i >>> CELL_PAGE_SHIFT][i & CELL_PAGE_MASK];
                if (c == 0) {
                    break;
                }
                if ((c & ~SLOT_MASK) == tag) {
                    slot = (c & SLOT_MASK) - 1;
                    break;
                }
            }
            slots[j] = slot;
        }
        // level 2: the candidate's record: same hash, same key length (else -2: look again)
        long sink = 0;
        for (int j = from; j < to; j++) {
            int slot = slots[j];
            if (slot >= 0) {
                long[] page = pages[slot >>> PAGE_SHIFT];
                int r = (slot & PAGE_MASK) * WORDS;
                // the record's last word may be on the next cache line: a read of the object will want it
                sink += page[r + OFFSET];
                if ((int) (page[r + META] >>> 32) != hashes[order[j]]
                        || KeySlabs.length(page[r + KEY]) != keys[order[j]].length) {
                    slots[j] = -2;
                }
            }
        }
        // level 3: touch both ends of each candidate's key, then compare (now from the cache)
        for (int j = from; j < to; j++) {
            int slot = slots[j];
            if (slot >= 0) {
                sink += this.keys.touch(word(slot, KEY));
            }
        }
        touchSink = sink;
        for (int j = from; j < to; j++) {
            int slot = slots[j];
            byte[] key = keys[order[j]];
            if (slot == -2 || (slot >= 0 && !this.keys.equals(word(slot, KEY), key))) {
                slots[j] = find(key, hashes[order[j]]);
            }
        }
    }

    /**
     * The slot of the object whose key has the digest {@code (lo, hi)}, or -1. {@code hash} is the
     * index's hash of that key ({@code (int) lo}, masked as the index masks it). A candidate matches
     * when its stored hash and its stored {@code hi} are the digest's: 96 of its 128 bits, so a 32-bit
     * hash collision is never taken for a match, and the key bytes are not read.
     */
    int findDigest(long lo, long hi, int hash) {
        return probe(hash, (page, r) -> page[r + DIGEST_HI] == hi);
    }

    /** Written by {@link #findAll}, so the JIT cannot drop loads made only to fill the cache. */
    @SuppressWarnings("unused")
    private long touchSink;

    // ================================================================== fields

    private long word(int slot, int w) {
        return pages[slot >>> PAGE_SHIFT][(slot & PAGE_MASK) * WORDS + w];
    }

    private void setWord(int slot, int w, long v) {
        pages[slot >>> PAGE_SHIFT][(slot & PAGE_MASK) * WORDS + w] = v;
    }

    int hash(int slot) {
        return (int) (word(slot, META) >>> 32);
    }

    int lastAccess(int slot) {
        return (int) word(slot, META);
    }

    /** Stamps a read (eviction is by last read). */
    void touch(int slot, int tick) {
        long m = word(slot, META);
        setWord(slot, META, (m & 0xFFFF_FFFF_0000_0000L) | (tick & 0xFFFF_FFFFL));
    }

    long valueLength(int slot) {
        return word(slot, LENGTH);
    }

    long generation(int slot) {
        return word(slot, GEN);
    }

    int keyLength(int slot) {
        return KeySlabs.length(word(slot, KEY));
    }

    /** A copy of the key (for tests and rare paths; lookups never need one). */
    byte[] key(int slot) {
        return keys.copy(word(slot, KEY));
    }

    boolean keyStartsWith(int slot, byte[] prefix) {
        return keys.startsWith(word(slot, KEY), prefix);
    }

    int replicas(int slot) {
        return (int) (word(slot, SEG) >>> 32) & 0xFF;
    }

    /**
     * Copies the object's put asked for (at least its replica count once stored; a rebuilt object's
     * count is the copies the nodes reported). Below it, the object is under-replicated ({@link Repair}).
     */
    int wanted(int slot) {
        return (int) (word(slot, SEG) >>> 40) & 0xFF;
    }

    /** Raises or lowers the copies wanted (never below 1). */
    void setWanted(int slot, int wanted) {
        if (wanted < 1 || wanted > 0xFF) {
            throw new IllegalArgumentException("copies wanted " + wanted);
        }
        pins.reweigh(slot, regionLength(slot) * (wanted - wanted(slot)));
        setWord(slot, SEG, (word(slot, SEG) & ~(0xFFL << 40)) | ((long) wanted << 40));
        events.restated(this, slot);
    }

    /** True when the object has fewer copies than its put asked for. */
    boolean underReplicated(int slot) {
        return replicas(slot) < wanted(slot);
    }

    // ================================================================== pins (SlotPins)

    /** Whether the object is pinned with a deadline after {@code nowMillis}. */
    boolean pinned(int slot, long nowMillis) {
        return pins.pinned(slot, nowMillis);
    }

    /** The pin's deadline, or 0 when the object is not pinned. */
    long pinnedUntil(int slot) {
        return pins.until(slot);
    }

    /** Pins the object until {@code untilMillis} (Long.MAX_VALUE: until removed), or unpins it with 0. */
    void pin(int slot, long untilMillis) {
        if (pins.until(slot) != untilMillis) {
            pins.set(slot, untilMillis, pinWeight(slot));
            events.restated(this, slot);
        }
    }

    private long pinWeight(int slot) {
        return regionLength(slot) * wanted(slot);
    }

    /** Region bytes held by pins (each pinned object's region times its wanted copies), expired pins included. */
    long pinnedBytes() {
        return pins.bytes();
    }

    /** Drops the pins whose deadline passed; returns how many. */
    int expirePins(long nowMillis) {
        return pins.expire(nowMillis, this::pinWeight);
    }

    int segment(int slot, int replica) {
        if (replica == 0) {
            return (int) word(slot, SEG);
        }
        return (int) extras.get(slot)[2 * (replica - 1)];
    }

    long offset(int slot, int replica) {
        if (replica == 0) {
            return word(slot, OFFSET);
        }
        return extras.get(slot)[2 * (replica - 1) + 1];
    }

    // ================================================================== replicas by tier ({@link StoredSegment})

    /** Which replica of the object in {@code slot} is on segment {@code segmentId} (either tier), or -1. */
    int replicaOn(int slot, int segmentId) {
        for (int i = 0, n = replicas(slot); i < n; i++) {
            if (StoredSegment.id(segment(slot, i)) == segmentId) {
                return i;
            }
        }
        return -1;
    }

    /** The region the object takes on each of its memory replicas (header, key and value). */
    long regionLength(int slot) {
        return ObjectLayout.regionLength(keyLength(slot), valueLength(slot));
    }

    // ================================================================== mutation

    /**
     * Adds an object whose key is not present (the caller looked it up under the same lock) and returns
     * its slot. {@code n >= 1} replicas are taken from {@code segs} and {@code offs}.
     */
    int insert(byte[] key, int hash, long valueLength, long generation, int tick, int[] segs, long[] offs, int n) {
        if (key.length > MAX_KEY) {
            throw new IllegalArgumentException("key of " + key.length + " bytes; at most " + MAX_KEY);
        }
        if (size >= MAX_SIZE) {
            throw new IllegalStateException("index shard full (" + size + " objects)");
        }
        if (size >= growAt) {
            rehash(capacity * 2);
        }
        int slot = size;
        ensureRecord(slot);
        long[] page = pages[slot >>> PAGE_SHIFT];
        int r = (slot & PAGE_MASK) * WORDS;
        page[r + KEY] = keys.append(key, 0, key.length);
        page[r + META] = ((long) hash << 32) | (tick & 0xFFFF_FFFFL);
        KeyDigest.digest(key, 0, key.length, digest, 0);
        page[r + DIGEST_HI] = digest[1];
        size++;
        setVersion(slot, valueLength, generation, segs, offs, n);
        placeCell(hash, slot);
        events.changed(this, slot, 0);
        return slot;
    }

    /** Replaces an object's version in place (same key): value length, generation and replicas; unpinned. */
    void replace(int slot, long valueLength, long generation, int tick, int[] segs, long[] offs, int n) {
        long was = events.state(this, slot);
        touch(slot, tick);
        pin(slot, 0);
        setVersion(slot, valueLength, generation, segs, offs, n);
        events.changed(this, slot, was);
    }

    private void setVersion(int slot, long valueLength, long generation, int[] segs, long[] offs, int n) {
        if (n < 1) {
            throw new IllegalArgumentException("an object needs a replica");
        }
        if (n > 0xFF) {
            throw new IllegalArgumentException(n + " replicas");
        }
        setWord(slot, LENGTH, valueLength);
        setWord(slot, GEN, generation);
        setWord(slot, SEG, ((long) n << 40) | ((long) n << 32) | (segs[0] & 0xFFFF_FFFFL));
        setWord(slot, OFFSET, offs[0]);
        if (n > 1) {
            long[] x = new long[2 * (n - 1)];
            for (int i = 1; i < n; i++) {
                x[2 * (i - 1)] = segs[i];
                x[2 * (i - 1) + 1] = offs[i];
            }
            extras.put(slot, x);
        } else {
            extras.remove(slot);
        }
    }

    /**
     * Appends a replica (a copy of the same version: found while rebuilding, or made by a repair). The
     * copies wanted rise with it when it is one more than they were.
     */
    void addReplica(int slot, int segment, long offset) {
        int n = replicas(slot);
        long was = events.state(this, slot);
        if (n >= 0xFF) {
            throw new IllegalStateException("slot " + slot + " has " + n + " replicas");
        }
        long[] x = n == 1 ? new long[2] : Arrays.copyOf(extras.get(slot), 2 * n);
        x[2 * (n - 1)] = segment;
        x[2 * (n - 1) + 1] = offset;
        extras.put(slot, x);
        int wanted = Math.max(wanted(slot), n + 1);
        if (wanted != wanted(slot)) {
            setWanted(slot, wanted);
        }
        setWord(slot, SEG, ((long) wanted << 40) | ((long) (n + 1) << 32) | (word(slot, SEG) & 0xFFFF_FFFFL));
        events.changed(this, slot, was);
    }

    /** Removes replica {@code replica} of an object that has at least two, keeping the others' order. */
    void removeReplica(int slot, int replica) {
        int n = replicas(slot);
        if (n < 2) {
            throw new IllegalStateException("the last replica goes with its object (remove it instead)");
        }
        long was = events.state(this, slot);
        long[] x = extras.get(slot);
        long seg0 = word(slot, SEG) & 0xFFFF_FFFFL;
        if (replica == 0) {
            seg0 = x[0] & 0xFFFF_FFFFL;
            setWord(slot, OFFSET, x[1]);
        }
        int drop = replica == 0 ? 0 : replica - 1;
        if (n == 2) {
            extras.remove(slot);
        } else {
            long[] y = new long[2 * (n - 2)];
            System.arraycopy(x, 0, y, 0, 2 * drop);
            System.arraycopy(x, 2 * drop + 2, y, 2 * drop, x.length - 2 * drop - 2);
            extras.put(slot, y);
        }
        setWord(slot, SEG, ((long) wanted(slot) << 40) | ((long) (n - 1) << 32) | seg0);
        events.changed(this, slot, was);
    }

    /**
     * Removes the object in {@code slot}. The object that was in the last slot now lives in
     * {@code slot} (unless {@code slot} was the last).
     */
    void remove(int slot) {
        if (slot < 0 || slot >= size) {
            throw new IndexOutOfBoundsException("slot " + slot + " of " + size);
        }
        events.removed(this, slot);
        deleteCell(cellOf(slot));
        pins.set(slot, 0, pinWeight(slot)); // not pin(): the feed already heard the removal
        keys.release(word(slot, KEY));
        if (replicas(slot) > 1) {
            extras.remove(slot);
        }
        int last = size - 1;
        if (slot != last) {
            int cell = cellOf(last);
            setCell(cell, (cell(cell) & ~SLOT_MASK) | (slot + 1));
            System.arraycopy(pages[last >>> PAGE_SHIFT], (last & PAGE_MASK) * WORDS,
                    pages[slot >>> PAGE_SHIFT], (slot & PAGE_MASK) * WORDS, WORDS);
            if (replicas(slot) > 1) {
                extras.put(slot, extras.remove(last));
            }
            pins.moved(last, slot);
        }
        size = last;
        if (size == 0) {
            clear();
            return;
        }
        // keep at most one empty page past the end
        int keep = (size >>> PAGE_SHIFT) + 2;
        if (keep < pages.length && pages[keep] != null) {
            pages[keep] = null;
        }
        if (!scanning) {
            tidy();
        }
    }

    /** What {@link #removeIf} tests on each object; it may read the object, and change its replicas. */
    @FunctionalInterface
    interface SlotPredicate {
        boolean test(int slot);
    }

    /**
     * Tests every object once and removes those that pass; returns how many. Scans from the last slot
     * down, so the object a removal moves into the current slot (from the last) was already tested.
     */
    int removeIf(SlotPredicate p) {
        int removed = 0;
        scanning = true;
        try {
            for (int s = size - 1; s >= 0; s--) {
                if (s < size && p.test(s)) {
                    remove(s);
                    removed++;
                }
            }
        } finally {
            scanning = false;
        }
        if (removed > 0) {
            tidy();
        }
        return removed;
    }

    /** Drops every object and gives back the memory. */
    void clear() {
        cells = newCells(MIN_TABLE);
        capacity = MIN_TABLE;
        growAt = (int) (MIN_TABLE * MAX_LOAD);
        pages = new long[1][];
        size = 0;
        extras.clear();
        pins.clear();
        keys = new KeySlabs();
        events.cleared();
    }

    /** After removals: a smaller table when it is mostly empty, a key compaction when mostly garbage. */
    private void tidy() {
        if (capacity > MIN_TABLE && size < capacity * MAX_LOAD / 8) {
            rehash(tableFor(size));
        }
        if (keys.wantsCompaction()) {
            compactKeys();
        }
    }

    // ================================================================== hash table

    private static int tag(int hash) {
        // 8 bits that do not depend on which low bits index the table: a multiplicative mix of all 32
        return ((hash * 0x9E3779B1) >>> 24) << SLOT_BITS;
    }

    /** Smallest table that holds {@code n} objects at most half full. */
    private static int tableFor(int n) {
        int cap = MIN_TABLE;
        while (cap * 0.5 < n) {
            cap <<= 1;
        }
        return cap;
    }

    private static int[][] newCells(int capacity) {
        int[][] c = new int[Math.max(1, capacity >>> CELL_PAGE_SHIFT)][];
        for (int p = 0; p < c.length; p++) {
            c[p] = new int[Math.min(capacity, CELL_PAGE)];
        }
        return c;
    }

    private int cell(int i) {
        return cells[i >>> CELL_PAGE_SHIFT][i & CELL_PAGE_MASK];
    }

    private void setCell(int i, int c) {
        cells[i >>> CELL_PAGE_SHIFT][i & CELL_PAGE_MASK] = c;
    }

    private void placeCell(int hash, int slot) {
        int mask = capacity - 1;
        int i = hash & mask;
        while (cell(i) != 0) {
            i = (i + 1) & mask;
        }
        setCell(i, tag(hash) | (slot + 1));
    }

    /** The index of the table cell that references {@code slot}. */
    private int cellOf(int slot) {
        int mask = capacity - 1;
        int want = slot + 1;
        for (int i = hash(slot) & mask; ; i = (i + 1) & mask) {
            int c = cell(i);
            if ((c & SLOT_MASK) == want) {
                return i;
            }
            if (c == 0) {
                throw new IllegalStateException("slot " + slot + " is not in the table");
            }
        }
    }

    /**
     * Empties cell {@code i} and moves later cells of its run back into the hole when their home
     * cell is not after the hole, so every cell stays reachable from its home.
     */
    private void deleteCell(int i) {
        int mask = capacity - 1;
        int j = i;
        while (true) {
            j = (j + 1) & mask;
            int c = cell(j);
            if (c == 0) {
                break;
            }
            int home = hash((c & SLOT_MASK) - 1) & mask;
            // distance from home to j, against distance from the hole to j: home at or before the hole
            if (((j - home) & mask) >= ((j - i) & mask)) {
                setCell(i, c);
                i = j;
            }
        }
        setCell(i, 0);
    }

    private void rehash(int newCapacity) {
        cells = newCells(newCapacity);
        capacity = newCapacity;
        growAt = (int) (newCapacity * MAX_LOAD);
        for (int s = 0; s < size; s++) {
            placeCell(hash(s), s);
        }
    }

    // ================================================================== records

    private void ensureRecord(int slot) {
        int p = slot >>> PAGE_SHIFT;
        if (p >= pages.length) {
            pages = Arrays.copyOf(pages, Math.max(p + 1, pages.length * 2));
        }
        long[] page = pages[p];
        int need = ((slot & PAGE_MASK) + 1) * WORDS;
        if (page == null) {
            pages[p] = new long[(p == 0 ? FIRST_PAGE_RECORDS : PAGE_RECORDS) * WORDS];
        } else if (page.length < need) {
            // only the first page starts small and grows, so a nearly empty shard stays small
            pages[p] = Arrays.copyOf(page, Math.min(PAGE_RECORDS * WORDS, page.length * 2));
        }
    }

    // ================================================================== key slabs

    /** Copies the live keys to fresh slabs, dropping the garbage. Also a test hook. */
    void compactKeys() {
        KeySlabs fresh = keys.fresh();
        for (int s = 0; s < size; s++) {
            setWord(s, KEY, keys.compactInto(fresh, word(s, KEY)));
        }
        keys = fresh;
    }

    // ================================================================== for tests and gauges

    /** Bytes written to key slabs (live and garbage) and still free in the current one. */
    long slabBytes() {
        return keys.slabBytes();
    }

    long liveKeyBytes() {
        return keys.liveBytes();
    }

    int tableCapacity() {
        return capacity;
    }

    /** Checks the invariants in the class comment; throws if one is broken. For tests. */
    void checkInvariants() {
        int cells = 0;
        int mask = capacity - 1;
        boolean[] seen = new boolean[size];
        for (int i = 0; i < capacity; i++) {
            int c = cell(i);
            if (c == 0) {
                continue;
            }
            cells++;
            int slot = (c & SLOT_MASK) - 1;
            if (slot < 0 || slot >= size || seen[slot]) {
                throw new IllegalStateException("cell " + i + " references slot " + slot + " (size " + size + ")");
            }
            seen[slot] = true;
            int h = hash(slot);
            if ((c & ~SLOT_MASK) != tag(h)) {
                throw new IllegalStateException("cell " + i + " has a wrong tag");
            }
            for (int k = h & mask; k != i; k = (k + 1) & mask) {
                if (cell(k) == 0) {
                    throw new IllegalStateException("slot " + slot + " unreachable from its home cell");
                }
            }
        }
        if (cells != size) {
            throw new IllegalStateException(cells + " cells for " + size + " objects");
        }
        if (size > growAt) {
            throw new IllegalStateException("load above the maximum");
        }
        long live = 0;
        int multi = 0;
        for (int s = 0; s < size; s++) {
            live += keyLength(s);
            int n = replicas(s);
            if (n < 1) {
                throw new IllegalStateException("slot " + s + " has no replica");
            }
            if (n > 1) {
                multi++;
                if (extras.get(s) == null || extras.get(s).length != 2 * (n - 1)) {
                    throw new IllegalStateException("slot " + s + ": extras do not match " + n + " replicas");
                }
            }
        }
        pins.check(size, this::pinWeight);
        if (multi != extras.size()) {
            throw new IllegalStateException(extras.size() + " extras for " + multi + " multi-replica objects");
        }
        if (live != keys.liveBytes()) {
            throw new IllegalStateException("live key bytes " + keys.liveBytes() + ", counted " + live);
        }
    }
}

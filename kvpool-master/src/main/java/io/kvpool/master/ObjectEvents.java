package io.kvpool.master;

import io.kvpool.master.events.KvEventSink;
import io.kvpool.master.events.Medium;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Where the index tells a {@link KvEventSink} what it lists, in which medium (KV events for routers,
 * {@link io.kvpool.master.events}).
 *
 * <h2>One place for every change</h2>
 * A key's media are read off its replicas in the {@link ObjectTable}: a memory copy is
 * {@link Medium#CPU}, an SSD-tier copy {@link Medium#STORAGE}. The table calls its {@link Shard} in
 * each method that changes them (insert, replace, add or remove a replica, remove), before and after,
 * and the shard tells the sink the difference: a medium the key entered is {@code stored}, one it left
 * {@code removed}. So every path that changes the index says what it changed without a call of its
 * own: a put's commit, a write lease's commit, an upsert, eviction, removal by key or prefix, a node's
 * loss, a node's inventory after a master restart, a repair copy, and the SSD tier's flows. A spill is
 * a removal from CPU at eviction (the object is a miss until the node reports it on disk) and a store
 * to STORAGE when NODE_DISK_ADD lists it again; a promotion (a conditional upsert from the node) is a
 * removal from STORAGE and a store to CPU in one replace. Objects in flight (pending puts) are not
 * listed and say nothing. The same hook revokes lost copies ({@link LostCopies}): a key that changes in
 * the table was stored since any loss of it, so no copy lost earlier may come back.
 *
 * <p>Two removals clear a whole table without visiting its objects ({@link ObjectTable#clear}): a
 * reset ({@link Epoch#reset}, under the epoch write lock, so nothing else happens meanwhile) says
 * {@link #allCleared}; so does a remove_all without force, which needs the mark below to stay exact.
 *
 * <h2>remove_all without force: exact under concurrent puts</h2>
 * It clears the shards one after another under the epoch read lock, while puts keep landing. It says
 * {@code AllBlocksCleared} first ({@link #allCleared}, which returns a mark), then clears each shard
 * under its lock ({@link Shard#clearing}). A put that lands in a shard after the announcement and
 * before that shard's turn would be announced stored after the clear and then cleared without a word;
 * so each shard remembers the mark current when it last said {@code stored}, and a shard that said
 * {@code stored} at or after this clear's mark says {@code removed} for every key it clears. The mark
 * is read after the sink took the event and raised before it takes the clear, and the sink is
 * linearizable, so a store the router hears after the clear always carries this clear's mark or a
 * later one.
 *
 * <h2>Tenants</h2>
 * The same hooks count what each namespace holds ({@link Tenants}): an object's regions in memory and on
 * the SSD tier, before and after a change, go to its namespace's count in this shard. A clear zeroes the
 * shard's counts; a new tenant configuration re-counts the shard ({@link Shard#recount}).
 *
 * <p>Cost: with events off ({@link KvEventSink#enabled()} false) and no tenants each hook is two volatile
 * reads. With events on, a change copies the key once (under the shard's lock) and offers one event to
 * the sink, which never waits; with tenants, it matches the key against their prefixes in place.
 */
final class ObjectEvents {

    /** Bits of a key's media. */
    private static final int CPU = 1;
    private static final int STORAGE = 2;

    private volatile KvEventSink sink = KvEventSink.NONE;
    /** The change feed standby masters follow (off until one asks; {@link ChangeFeed}). */
    final ChangeFeed feed;
    /** Shards made so far: the next one's index. */
    private int shards;
    /** Namespaces and their quotas; the shards count for it. */
    final Tenants tenants = new Tenants();
    /** Objects lost with a dropped segment that its node may bring back; a store of the key revokes one. */
    final LostCopies lost = new LostCopies();
    /** Raised by every {@link #allCleared}: the announcements a store may come after. */
    private final AtomicLong clears = new AtomicLong();

    ObjectEvents() {
        this(new ChangeFeed(ChangeFeed.DEFAULT_MAX_BYTES));
    }

    ObjectEvents(ChangeFeed feed) {
        this.feed = feed;
    }

    /** From now on tell {@code s} (KvEventSink.NONE: nobody). */
    void publishTo(KvEventSink s) {
        sink = s;
    }

    /** Everything is gone: returns this announcement's mark (for {@link Shard#clearing}). */
    long allCleared() {
        long mark = clears.incrementAndGet();
        sink.allCleared();
        return mark;
    }

    /** A table's hooks; each table has its own (its mark is that shard's). */
    Shard newShard() {
        Shard s = new Shard(this, shards++);
        tenants.register(s);
        return s;
    }

    /** The hooks of one shard's table, called under that shard's lock. */
    static final class Shard {
        private final ObjectEvents hub;
        /** Which shard of its index (the order shards were made in). */
        private final int index;
        /** The mark current when this shard last said stored (under the shard's lock). */
        private long storedMark;

        private Shard(ObjectEvents hub, int index) {
            this.hub = hub;
            this.index = index;
        }

        /** The object's pin or copies wanted changed: only the change feed cares. */
        void restated(ObjectTable t, int slot) {
            if (hub.feed.on()) {
                hub.feed.append(FeedRecords.object(t, slot));
            }
        }

        /** Hooks that tell nobody: a table outside an index (tests). */
        static Shard off() {
            return new ObjectEvents().newShard();
        }

        /**
         * What the object in {@code slot} holds, to compare after a change: its region in 64-byte units (bits 16 and
         * up), its memory copies (bits 8..15) and its SSD-tier copies (bits 0..7); 0 when nobody listens and no
         * tenant counts (nothing to compare).
         */
        long state(ObjectTable t, int slot) {
            if (!hub.sink.enabled() && !hub.tenants.active()) {
                return 0;
            }
            int memory = 0;
            int disk = 0;
            for (int i = 0, n = t.replicas(slot); i < n; i++) {
                if (StoredSegment.onDisk(t.segment(slot, i))) {
                    disk++;
                } else {
                    memory++;
                }
            }
            return (t.regionLength(slot) + 63) / 64 << 16 | (long) memory << 8 | disk;
        }

        private static int media(long state) {
            return ((state >>> 8 & 0xFF) != 0 ? CPU : 0) | ((state & 0xFF) != 0 ? STORAGE : 0);
        }

        private static long memoryBytes(long state) {
            return (state >>> 16) * 64 * (state >>> 8 & 0xFF);
        }

        private static long diskBytes(long state) {
            return (state >>> 16) * 64 * (state & 0xFF);
        }

        /** The object in {@code slot} held {@code before} and changed: counts it, and says what it entered and left. */
        void changed(ObjectTable t, int slot, long before) {
            if (hub.lost.any()) {
                // the key is in the table, so it was stored since any loss of it: no lost copy of it comes back
                hub.lost.revoke(t.key(slot), t.hash(slot));
            }
            restated(t, slot);
            long after = state(t, slot);
            count(t, slot, before, after);
            KvEventSink s = hub.sink;
            if (!s.enabled()) {
                return;
            }
            int left = media(before) & ~media(after);
            int entered = media(after) & ~media(before);
            if ((left | entered) == 0) {
                return;
            }
            List<byte[]> key = List.of(t.key(slot));
            say(s, key, left, false);
            say(s, key, entered, true);
        }

        /** The object in {@code slot} is about to leave the table. */
        void removed(ObjectTable t, int slot) {
            if (hub.feed.on()) {
                hub.feed.append(FeedRecords.removed(t.key(slot)));
            }
            long before = state(t, slot);
            count(t, slot, before, 0);
            KvEventSink s = hub.sink;
            if (s.enabled()) {
                say(s, List.of(t.key(slot)), media(before), false);
            }
        }

        // ---- tenants: what each namespace holds in this shard (under the shard's lock; read without it)

        private long[] memory = new long[1];
        private long[] disk = new long[1];

        private void count(ObjectTable t, int slot, long before, long after) {
            Tenants ten = hub.tenants;
            if (before == after || !ten.active()) {
                return;
            }
            int ns = ten.namespace(t, slot);
            if (ns < memory.length) {
                memory[ns] += memoryBytes(after) - memoryBytes(before);
                disk[ns] += diskBytes(after) - diskBytes(before);
            }
        }

        long memoryOf(int ns) {
            long[] m = memory;
            return ns < m.length ? m[ns] : 0;
        }

        long diskOf(int ns) {
            long[] d = disk;
            return ns < d.length ? d[ns] : 0;
        }

        /** The table was emptied at once (a reset, a remove_all). */
        void cleared() {
            if (hub.feed.on()) {
                hub.feed.append(FeedRecords.cleared(index));
            }
            memory = new long[memory.length];
            disk = new long[disk.length];
        }

        /** Counts the table again for {@code tenants}' namespaces (a new configuration). */
        void recount(ObjectTable t, Tenants tenants) {
            long[] m = new long[tenants.namespaces()];
            long[] d = new long[m.length];
            if (tenants.active()) {
                for (int slot = 0; slot < t.size(); slot++) {
                    long st = state(t, slot);
                    int ns = tenants.namespace(t, slot);
                    m[ns] += memoryBytes(st);
                    d[ns] += diskBytes(st);
                }
            }
            memory = m;
            disk = d;
        }

        /**
         * The whole table is about to be cleared by the remove_all that announced {@code mark}: says
         * {@code removed} for every key in it if this shard said {@code stored} since (see the class note).
         */
        void clearing(ObjectTable t, long mark) {
            KvEventSink s = hub.sink;
            if (!s.enabled() || storedMark < mark) {
                return;
            }
            List<byte[]> cpu = new ArrayList<>();
            List<byte[]> storage = new ArrayList<>();
            for (int slot = 0; slot < t.size(); slot++) {
                int m = media(state(t, slot));
                byte[] key = (m & (CPU | STORAGE)) != 0 ? t.key(slot) : null;
                if ((m & CPU) != 0) {
                    cpu.add(key);
                }
                if ((m & STORAGE) != 0) {
                    storage.add(key);
                }
            }
            if (!cpu.isEmpty()) {
                s.removed(cpu, Medium.CPU);
            }
            if (!storage.isEmpty()) {
                s.removed(storage, Medium.STORAGE);
            }
        }

        private void say(KvEventSink s, List<byte[]> key, int media, boolean stored) {
            for (int bit = CPU; bit <= STORAGE; bit <<= 1) {
                if ((media & bit) == 0) {
                    continue;
                }
                Medium m = bit == CPU ? Medium.CPU : Medium.STORAGE;
                if (stored) {
                    s.stored(key, m);
                    // read after the sink took it: a clear announced before it has this mark or a lower one
                    storedMark = hub.clears.get();
                } else {
                    s.removed(key, m);
                }
            }
        }
    }
}

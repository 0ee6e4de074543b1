package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.SocketTimeoutException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

/**
 * The read path: where each key is (remembered under the read lease, or asked of the master in one
 * batch), then one read per segment (a memory copy from a segment on this host, else NODE_READ over
 * TCP; disk-tier objects under the client's disk load budget), trying replicas in turn (local first).
 *
 * <h2>Remembered locations</h2>
 * A read first makes sure the read lease runs, then notes {@link LocationCache#snapshot()}; only
 * then does it look up remembered locations or ask the master. A copy from a remembered location
 * counts only if {@link LocationCache#confirm} passes after it; otherwise, and for a remembered
 * location that missed, the key is asked of the master once more. See {@link LocationCache} for why
 * this makes removals absolute.
 *
 * <p>Reads served from remembered locations are reported to the master in the background
 * ({@link #reportCachedReads}), which keeps the master's LRU right and refreshes the entries.
 */
final class ObjectReads {

    private static final Logger log = LoggerFactory.getLogger(ObjectReads.class);

    private final ClientConfig config;
    private final MasterChannel master;
    private final SegmentAccess segments;
    private final PerSegment tasks;
    private final LocationCache locations;
    /** Null when the location cache is off. */
    private final LeaseKeeper lease;
    /** The disk load budget in KiB permits, fair so that a large piece is not starved by small ones. */
    private final Semaphore diskLoads;

    ObjectReads(ClientConfig config, MasterChannel master, SegmentAccess segments, PerSegment tasks,
                LocationCache locations, LeaseKeeper lease) {
        this.config = config;
        this.master = master;
        this.segments = segments;
        this.tasks = tasks;
        this.locations = locations;
        this.lease = lease;
        this.diskLoads = new Semaphore(budgetPermits(config.diskLoadBudget()), true);
    }

    /** Supplies where item i's value of {@code len} bytes goes. */
    interface Destination {
        MemorySegment of(int item, long len);
    }

    /**
     * One object read: which item, from which replica, how long, and which range of its value (the
     * whole value unless the caller asked for a range, {@link RangeReads}).
     */
    private record ReadSlot(int item, long offset, long generation, long length, Tier tier, long rangeOffset,
                            long rangeLength) {
        boolean whole() {
            return rangeOffset == 0 && rangeLength == length;
        }
    }

    /**
     * Reads {@code keys} into the destinations {@code dest} supplies; element i of the result is the
     * length read for key i, or {@link KvPoolClient#KvPoolClient.MISS}.
     */
    long[] read(List<String> keys, boolean batch, Destination dest) {
        int n = keys.size();
        long[] lengths = new long[n];
        Arrays.fill(lengths, KvPoolClient.MISS);
        if (n == 0) {
            return lengths;
        }
        List<byte[]> k = Keys.encodeAll(keys);
        MasterMessages.ReplicaList[] where = new MasterMessages.ReplicaList[n];
        MemorySegment[] dsts = new MemorySegment[n];
        boolean[] cached = new boolean[n];
        long snapshot = locate(keys, k, batch, where, cached);
        for (int i = 0; i < n; i++) {
            // destinations are fixed before any byte moves, so a too-small one fails before I/O
            if (where[i].code() == ResultCode.OK && !where[i].replicas().isEmpty()) {
                dsts[i] = dest.of(i, where[i].valueLength());
            }
        }
        readRound(where, null, dsts, lengths, all(n));
        // a copy from a remembered location counts only if the lease still runs and nothing removed
        // or replaced the key meanwhile; a remembered location that missed: the object moved or went.
        // Either way, ask the master once more
        long now = System.nanoTime();
        List<Integer> retry = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            if (cached[i]) {
                if (lengths[i] != KvPoolClient.MISS && !locations.confirm(keys.get(i), snapshot, now)) {
                    lengths[i] = KvPoolClient.MISS;
                }
                if (lengths[i] == KvPoolClient.MISS) {
                    locations.invalidate(keys.get(i));
                    retry.add(i);
                } else {
                    locations.touched(keys.get(i));
                }
            }
        }
        if (!retry.isEmpty()) {
            lookup(keys, k, retry, true, where, locations.snapshot());
            List<Integer> again = new ArrayList<>();
            for (int i : retry) {
                if (where[i].code() == ResultCode.OK && !where[i].replicas().isEmpty()) {
                    if (dsts[i] == null || dsts[i].byteSize() != where[i].valueLength()) {
                        dsts[i] = dest.of(i, where[i].valueLength());
                    }
                    again.add(i);
                }
            }
            readRound(where, null, dsts, lengths, again);
        }
        if (config.tierLog()) {
            logTiers(where, lengths);
        }
        return lengths;
    }

    /**
     * Where each key is: remembered locations skip the master, under the read lease
     * ({@link LocationCache}); the rest are asked for in one batch. Fills {@code where} and marks the
     * remembered ones in {@code cached}; returns the cache snapshot taken before anything was looked up.
     */
    long locate(List<String> keys, List<byte[]> k, boolean batch, MasterMessages.ReplicaList[] where,
                boolean[] cached) {
        boolean leased = lease != null && lease.ensure();
        long snapshot = locations.snapshot(); // before any location is read or asked for
        List<Integer> ask = new ArrayList<>();
        for (int i = 0; i < keys.size(); i++) {
            where[i] = leased ? locations.get(keys.get(i)) : null;
            if (where[i] != null) {
                cached[i] = true;
            } else {
                ask.add(i);
            }
        }
        lookup(keys, k, ask, batch, where, snapshot);
        return snapshot;
    }

    private static final Logger tierLog = LoggerFactory.getLogger("io.kvpool.client.tiers");

    /**
     * The tier log: one line per batch load, with how many keys came from memory and from disk, were
     * missing (not in the pool), succeeded, or failed (listed but not readable), and bytes per tier.
     */
    private static void logTiers(MasterMessages.ReplicaList[] where, long[] lengths) {
        tierLog.info(tierLine(where, lengths));
    }

    /** The tier log line for a batch: where[i] is what the master listed for item i, lengths[i] what was read. */
    static String tierLine(MasterMessages.ReplicaList[] where, long[] lengths) {
        int memoryKeys = 0;
        int diskKeys = 0;
        int missing = 0;
        int success = 0;
        int failed = 0;
        long memoryBytes = 0;
        long diskBytes = 0;
        for (int i = 0; i < where.length; i++) {
            if (where[i].code() != ResultCode.OK || where[i].replicas().isEmpty()) {
                missing++;
                continue;
            }
            boolean disk = where[i].replicas().getFirst().onDisk();
            if (disk) {
                diskKeys++;
            } else {
                memoryKeys++;
            }
            if (lengths[i] == KvPoolClient.MISS) {
                failed++;
            } else {
                success++;
                if (disk) {
                    diskBytes += lengths[i];
                } else {
                    memoryBytes += lengths[i];
                }
            }
        }
        return "load batch: keys=" + where.length + " memory_keys=" + memoryKeys + " disk_keys=" + diskKeys
                + " missing_keys=" + missing + " success_keys=" + success + " failed_keys=" + failed
                + " bytes_memory=" + memoryBytes + " bytes_disk=" + diskBytes;
    }

    private static List<Integer> all(int n) {
        List<Integer> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(i);
        }
        return out;
    }

    /**
     * Asks the master where the given items are (one round trip per frame's worth of keys) and
     * remembers it, unless an invalidation applied since {@code snapshot} covers the key.
     */
    void lookup(List<String> keys, List<byte[]> k, List<Integer> items, boolean batch,
                        MasterMessages.ReplicaList[] where, long snapshot) {
        for (int from = 0; from < items.size(); from += KvPoolClient.MAX_KEYS_PER_FRAME) {
            int to = Math.min(items.size(), from + KvPoolClient.MAX_KEYS_PER_FRAME);
            List<byte[]> part = new ArrayList<>(to - from);
            for (int j = from; j < to; j++) {
                part.add(k.get(items.get(j)));
            }
            BodyWriter w = new BodyWriter(16 + part.size() * 64);
            new KeyList(part).write(w);
            MasterMessages.ReplicaListReply r = master.call(batch || part.size() > 1 ? Opcode.BATCH_GET_REPLICA_LIST
                    : Opcode.GET_REPLICA_LIST, w, MasterMessages.ReplicaListReply::read);
            for (int j = 0; j < r.items().size(); j++) {
                int i = items.get(from + j);
                where[i] = r.items().get(j);
                if (where[i].code() == ResultCode.OK) {
                    locations.remember(keys.get(i), where[i], snapshot);
                }
            }
        }
    }

    /**
     * Reads the given items, trying their replicas in order (local first); sets lengths[item] for each
     * hit. With {@code ranges} null each whole value is read into dsts[item]; otherwise the
     * {@code dsts[item].byteSize()} bytes from {@code ranges[item]} of it (the caller checked the range).
     */
    void readRound(MasterMessages.ReplicaList[] where, long[] ranges, MemorySegment[] dsts, long[] lengths,
                   List<Integer> items) {
        List<List<Replica>> order = new ArrayList<>(where.length);
        for (int i = 0; i < where.length; i++) {
            order.add(where[i] != null && where[i].code() == ResultCode.OK ? segments.localFirst(where[i].replicas())
                    : List.of());
        }
        for (int attempt = 0; ; attempt++) {
            Map<Integer, List<ReadSlot>> bySegment = new LinkedHashMap<>();
            for (int i : items) {
                if (lengths[i] == KvPoolClient.MISS && attempt < order.get(i).size()) {
                    Replica rep = order.get(i).get(attempt);
                    long length = where[i].valueLength();
                    bySegment.computeIfAbsent(rep.segmentId(), x -> new ArrayList<>()).add(new ReadSlot(i,
                            rep.offset(), where[i].generation(), length, rep.tier(), ranges == null ? 0 : ranges[i],
                            ranges == null ? length : dsts[i].byteSize()));
                }
            }
            if (bySegment.isEmpty()) {
                return;
            }
            tasks.run(bySegment, PerSegment.shareable(Arrays.asList(dsts)),
                    (segId, slots) -> readFromSegment(segId, slots, dsts, lengths));
        }
    }

    /** Reads the slots from one segment into their destinations, setting lengths[item] for each hit. */
    private void readFromSegment(int segId, List<ReadSlot> slots, MemorySegment[] dsts, long[] lengths) {
        SegmentDirectory.Entry seg = segments.resolve(segId);
        if (seg == null) {
            return;
        }
        MemorySegment shm = segments.mapping(seg);
        List<ReadSlot> memory = new ArrayList<>(slots.size());
        List<ReadSlot> disk = new ArrayList<>();
        for (ReadSlot slot : slots) {
            if (slot.tier == Tier.DISK) {
                disk.add(slot);
            } else if (shm == null || !SharedSegments.readRange(shm, slot.offset, slot.generation, slot.length,
                    slot.rangeOffset, dsts[slot.item])) {
                // same machine: copied straight from the node's memory above; what changed under the copy goes over TCP
                memory.add(slot);
            } else {
                lengths[slot.item] = slot.rangeLength;
            }
        }
        ConnectionPool pool = segments.pool(seg.address());
        readOverTcp(seg, pool, memory, config.limits().maxPayloadBytes(), dsts, lengths);
        // disk-tier objects go in pieces of at most the disk load budget, each holding its bytes of the
        // client-wide budget until received: the node stages each piece in memory, so a burst of disk
        // loads from all this client's threads cannot take more than the budget at once
        readOverTcp(seg, pool, disk, config.diskLoadBudget(), dsts, lengths);
    }

    /** Permits (KiB) of the disk load budget a piece takes: its bytes, at most the whole budget. */
    private int diskPermits(List<ReadSlot> slots, int start, int end) {
        long bytes = 0;
        for (int s = start; s < end; s++) {
            bytes += slots.get(s).length;
        }
        return (int) Math.max(1, Math.min(budgetPermits(config.diskLoadBudget()), (bytes + 1023) >> 10));
    }

    private static int budgetPermits(long budgetBytes) {
        return (int) Math.min(Integer.MAX_VALUE, budgetBytes >> 10);
    }

    private void readOverTcp(SegmentDirectory.Entry seg, ConnectionPool pool, List<ReadSlot> slots, long maxBytes,
                             MemorySegment[] dsts, long[] lengths) {
        boolean disk = !slots.isEmpty() && slots.getFirst().tier == Tier.DISK;
        int start = 0;
        while (start < slots.size()) {
            int end = PerSegment.frameEnd(slots, start, slot -> disk ? slot.length : slot.rangeLength, maxBytes);
            // whole values as NODE_READ; a frame with any range as NODE_READ_RANGE (version 11)
            boolean whole = true;
            for (int s = start; s < end; s++) {
                whole &= slots.get(s).whole();
            }
            List<NodeMessages.ReadItem> items = new ArrayList<>(end - start);
            List<NodeMessages.RangeItem> ranges = new ArrayList<>(whole ? 0 : end - start);
            for (int s = start; s < end; s++) {
                ReadSlot slot = slots.get(s);
                items.add(new NodeMessages.ReadItem(slot.offset, slot.generation, slot.length, slot.tier));
                if (!whole) {
                    ranges.add(new NodeMessages.RangeItem(items.getLast(), slot.rangeOffset, slot.rangeLength));
                }
            }
            Opcode op = whole ? Opcode.NODE_READ : Opcode.NODE_READ_RANGE;
            BodyWriter w = new BodyWriter(16 + items.size() * (whole ? 25 : NodeMessages.ReadRange.ITEM_BYTES));
            if (whole) {
                new NodeMessages.Read(items).write(w);
            } else {
                new NodeMessages.ReadRange(ranges).write(w);
            }
            FrameConnection c = null;
            int permits = 0;
            try {
                if (disk) {
                    permits = diskPermits(slots, start, end);
                    if (!diskLoads.tryAcquire(permits, config.requestTimeout().toNanos(), TimeUnit.NANOSECONDS)) {
                        log.debug("disk load of {} items from {} timed out waiting for the disk load budget",
                                end - start, seg.name());
                        permits = 0;
                        start = end;
                        continue; // misses: the caller recomputes
                    }
                }
                c = pool.borrow(config.requestTimeout());
                MasterMessages.Codes codes;
                try {
                    codes = MasterMessages.Codes.read(c.call(op, w, config.requestTimeout()).body());
                } catch (IOException stale) {
                    if (stale instanceof SocketTimeoutException) {
                        throw stale; // a node that does not answer: not asked twice
                    }
                    // a pooled connection left dead by a node that restarted (on the same address, with its
                    // objects): nothing was read yet, so ask once more on a fresh connection
                    pool.release(c);
                    c = null;
                    pool.drainIdle();
                    c = pool.borrow(config.requestTimeout());
                    codes = MasterMessages.Codes.read(c.call(op, w, config.requestTimeout()).body());
                }
                for (int s = start; s < end; s++) {
                    ReadSlot slot = slots.get(s);
                    if (codes.codes().get(s - start) == ResultCode.OK) {
                        c.readPayload(dsts[slot.item], config.requestTimeout());
                        lengths[slot.item] = slot.rangeLength;
                    }
                }
            } catch (IOException | RemoteException e) {
                log.debug("read from {} failed: {}", seg.name(), e.getMessage());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            } finally {
                if (c != null) {
                    pool.release(c);
                }
                diskLoads.release(permits);
            }
            start = end;
        }
    }

    /**
     * Tells the master about reads served from the location cache (a batched GET_REPLICA_LIST: the
     * master stamps them as read for its LRU) and refreshes or drops their entries with the answer.
     */
    void reportCachedReads() {
        List<String> keys = locations.drainTouched(KvPoolClient.MAX_KEYS_PER_FRAME);
        if (keys.isEmpty()) {
            return;
        }
        BodyWriter w = new BodyWriter(16 + keys.size() * 64);
        new KeyList(Keys.encodeAll(keys)).write(w);
        long snapshot = locations.snapshot();
        MasterMessages.ReplicaListReply r = master.call(Opcode.BATCH_GET_REPLICA_LIST, w, MasterMessages.ReplicaListReply::read);
        for (int i = 0; i < keys.size(); i++) {
            MasterMessages.ReplicaList rl = r.items().get(i);
            if (rl.code() == ResultCode.OK) {
                locations.remember(keys.get(i), rl, snapshot);
            } else {
                locations.invalidate(keys.get(i));
            }
        }
    }
}

package io.kvpool.client;

import io.kvpool.protocol.BlockInfo;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.KeyDigest;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.TierCounts;
import io.kvpool.protocol.msg.BlockInfoList;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;

/**
 * The kvpool client: what an inference engine embeds to save and load KV blocks.
 *
 * <h2>Semantics</h2>
 * <ul>
 *   <li>Puts are two-phase: reserve at the master, write straight to the nodes, complete at the
 *       master. An object is visible only once all its bytes are written. A put of an existing key
 *       returns {@link PutStatus#ALREADY_EXISTS}; {@link #upsert} replaces.</li>
 *   <li>A read returns exactly the object named, or a miss: never another object's bytes, never a
 *       partial object, even while eviction or removal reuses the space.</li>
 *   <li>Misses, "already exists" and "pool full" are values. A node that is down or slow makes its
 *       objects misses (other replicas are tried first). Exceptions are for bad arguments
 *       ({@link IllegalArgumentException}, naming the key) and for an unreachable master
 *       ({@link KvPoolException}, naming it).</li>
 *   <li>Every batch form is one round trip to the master (very large batches are split to fit a
 *       frame), plus one request per node involved, run in parallel.</li>
 * </ul>
 *
 * <h2>Placement</h2>
 * The preferred segment for a put is, in order: {@link PutOptions#preferredSegment()} of the call;
 * {@link ClientConfig#preferredSegment()}; the environment variable
 * {@value ClientConfig#PREFERRED_SEGMENT_ENV}; a segment whose node is on this host; otherwise the
 * master's strategy decides.
 *
 * <h2>Parts</h2>
 * {@link MasterChannel} (connections to the master), {@link SegmentAccess} (the segment table, the
 * same-machine mappings, connections to nodes), {@link ObjectReads} (the read path),
 * {@link LocationCache} and {@link LeaseKeeper} (remembered locations and the read lease that makes
 * them safe), {@link ObjectWrites} (the put path, with {@link WriteLeasePool} and {@link NodeWrites}),
 * {@link PerSegment} (work split by segment), {@link KeepAlive} (pings and background upkeep). This
 * class holds the API, probes and removals.
 *
 * <p>Thread-safe: share one client across an engine's threads.
 */
public final class KvPoolClient implements AutoCloseable {

    /** Returned by {@link #getInto} for a miss. */
    public static final long MISS = -1;
    /** Most keys in one master frame; larger batches are split (a 512-byte-key batch this size is ~8.5 MiB). */
    static final int MAX_KEYS_PER_FRAME = 16384;
    /** About how large one BLOCK_INFO frame grows before the next starts. */
    static final int BLOCK_INFO_FRAME_BYTES = 4 << 20;

    private final ClientConfig config;
    private final UUID clientId = UUID.randomUUID();
    private final MasterChannel master;
    private final SegmentAccess segments;
    private final PerSegment tasks = new PerSegment();
    private final LocationCache locations;
    /** Keeps the read lease under which remembered locations may be used; null when the cache is off. */
    private final LeaseKeeper lease;
    private final ObjectReads reads;
    private final RangeReads ranges;
    private final ObjectWrites writes;
    /** Write leases this client holds between puts; null when puts are two-phase only. */
    private final WriteLeasePool writeLeases;
    private final String envPreferred;
    private final KeepAlive keepAlive;
    private volatile boolean closed;

    private KvPoolClient(ClientConfig config) {
        this.config = config;
        String env = System.getenv(ClientConfig.PREFERRED_SEGMENT_ENV);
        this.envPreferred = env == null || env.isBlank() ? null : env.trim();
        this.locations = new LocationCache(config.locationCache());
        this.master = new MasterChannel(config, clientId, this::masterRestarted);
        this.segments = new SegmentAccess(config, master);
        this.lease = locations.enabled() ? new LeaseKeeper(config, locations, clientId, master) : null;
        this.reads = new ObjectReads(config, master, segments, tasks, locations, lease);
        this.ranges = new RangeReads(reads, locations);
        // write leases need the read lease: it is how a removeAll reaches this client before it returns
        this.writeLeases = lease != null && config.writeLeases() ? new WriteLeasePool(master,
                System::nanoTime, () -> locations.leaseValid(System.nanoTime()), segments::run) : null;
        if (writeLeases != null) {
            locations.onDropAll(writeLeases::doom);
        }
        this.writes = new ObjectWrites(config, master, segments, tasks, locations, writeLeases);
        this.keepAlive = new KeepAlive(config, clientId, master, segments, reads, writeLeases);
    }

    /**
     * Connects to the master and returns a ready client.
     *
     * @throws KvPoolException naming the master if it cannot be reached
     */
    public static KvPoolClient connect(ClientConfig config) {
        KvPoolClient c = new KvPoolClient(config);
        try {
            c.segments.refresh();
        } catch (RuntimeException e) {
            c.close();
            throw e;
        }
        c.keepAlive.start();
        if (c.lease != null) {
            c.lease.start();
        }
        return c;
    }

    /** Shorthand for {@code connect(ClientConfig.forMaster(hostPort))}. */
    public static KvPoolClient connect(String masterHostPort) {
        return connect(ClientConfig.forMaster(masterHostPort));
    }

    public ClientConfig config() {
        return config;
    }

    /** Largest value the master accepts. */
    public long maxValueBytes() {
        return master.maxValueBytes();
    }

    /** The master restarted: segment ids and remembered locations belong to its previous run. */
    private void masterRestarted() {
        segments.clear();
        locations.masterRestarted();
        if (writeLeases != null) {
            writeLeases.forgetAll();
        }
    }

    // ================================================================== put

    /** Stores {@code value} under {@code key}; ALREADY_EXISTS if the key is present. */
    public PutStatus put(String key, byte[] value) {
        return put(key, MemorySegment.ofArray(value), PutOptions.DEFAULT);
    }

    public PutStatus put(String key, byte[] value, PutOptions options) {
        return put(key, MemorySegment.ofArray(value), options);
    }

    public PutStatus put(String key, MemorySegment value) {
        return put(key, value, PutOptions.DEFAULT);
    }

    public PutStatus put(String key, MemorySegment value, PutOptions options) {
        return putInternal(List.of(key), List.of(value), options, false, false).getFirst();
    }

    /** Stores or replaces. Readers see the old value until the new one is complete. */
    public PutStatus upsert(String key, byte[] value) {
        return upsert(key, MemorySegment.ofArray(value), PutOptions.DEFAULT);
    }

    public PutStatus upsert(String key, MemorySegment value, PutOptions options) {
        return putInternal(List.of(key), List.of(value), options, true, false).getFirst();
    }

    /** Stores many objects: one PUT_START and one PUT_END round trip, one write per node, in parallel. */
    public List<PutStatus> putBatch(List<String> keys, List<MemorySegment> values) {
        return putBatch(keys, values, PutOptions.DEFAULT);
    }

    public List<PutStatus> putBatch(List<String> keys, List<MemorySegment> values, PutOptions options) {
        return putInternal(keys, values, options, false, true);
    }

    public List<PutStatus> upsertBatch(List<String> keys, List<MemorySegment> values, PutOptions options) {
        return putInternal(keys, values, options, true, true);
    }

    /**
     * Stores {@code value} under {@code key} and reports the outcome in full: the status, how many
     * copies were written against how many were asked for, and whether the pin was granted.
     */
    public PutResult putDetailed(String key, MemorySegment value, PutOptions options) {
        return putDetailed(List.of(key), List.of(value), options, false, false).getFirst();
    }

    public PutResult putDetailed(String key, byte[] value, PutOptions options) {
        return putDetailed(key, MemorySegment.ofArray(value), options);
    }

    /** {@link #putBatch(List, List, PutOptions)}, reporting each outcome in full ({@link PutResult}). */
    public List<PutResult> putBatchDetailed(List<String> keys, List<MemorySegment> values, PutOptions options) {
        return putDetailed(keys, values, options, false, true);
    }

    /** {@link #upsert(String, MemorySegment, PutOptions)}, reporting the outcome in full. */
    public PutResult upsertDetailed(String key, MemorySegment value, PutOptions options) {
        return putDetailed(List.of(key), List.of(value), options, true, false).getFirst();
    }

    private List<PutStatus> putInternal(List<String> keys, List<MemorySegment> values, PutOptions options,
                                        boolean upsert, boolean batch) {
        List<PutResult> results = putDetailed(keys, values, options, upsert, batch);
        List<PutStatus> out = new ArrayList<>(results.size());
        for (PutResult r : results) {
            out.add(r.status());
        }
        return out;
    }

    private List<PutResult> putDetailed(List<String> keys, List<MemorySegment> values, PutOptions options,
                                        boolean upsert, boolean batch) {
        if (keys.size() != values.size()) {
            throw new IllegalArgumentException(keys.size() + " keys but " + values.size() + " values");
        }
        if (keys.isEmpty()) {
            return List.of();
        }
        int replicas = options.replicas() > 0 ? options.replicas() : config.replicas();
        return writes.write(keys, values, preferredSegment(options), replicas, options.pinSeconds(), upsert, batch);
    }

    // ================================================================== get

    /** The value under {@code key}, or empty on a miss. */
    public Optional<byte[]> get(String key) {
        return getBatchInternal(List.of(key), false).getFirst();
    }

    /** Values for many keys (empty for misses): one master round trip, one read per node, in parallel. */
    public List<Optional<byte[]>> getBatch(List<String> keys) {
        return getBatchInternal(keys, true);
    }

    private List<Optional<byte[]>> getBatchInternal(List<String> keys, boolean batch) {
        byte[][] out = new byte[keys.size()][];
        long[] lengths = reads.read(keys, batch, (i, len) -> {
            out[i] = new byte[Math.toIntExact(len)];
            return MemorySegment.ofArray(out[i]);
        });
        List<Optional<byte[]>> res = new ArrayList<>(keys.size());
        for (int i = 0; i < out.length; i++) {
            // a buffer was allocated for every key the master listed; only those actually read are hits
            res.add(lengths[i] == MISS ? Optional.empty() : Optional.of(out[i]));
        }
        return res;
    }

    /**
     * Reads the value under {@code key} straight from the socket into {@code dst} (no intermediate
     * copy). Returns the value's length, or {@link #MISS}. On a miss, {@code dst}'s contents are
     * unspecified.
     *
     * @throws IllegalArgumentException if {@code dst} is smaller than the value (naming both)
     */
    public long getInto(String key, MemorySegment dst) {
        return getIntoInternal(List.of(key), List.of(dst), false)[0];
    }

    /** {@link #getInto} for many keys: element i is the length read into {@code dsts[i]}, or {@link #MISS}. */
    public long[] getIntoBatch(List<String> keys, List<MemorySegment> dsts) {
        if (keys.size() != dsts.size()) {
            throw new IllegalArgumentException(keys.size() + " keys but " + dsts.size() + " destinations");
        }
        return getIntoInternal(keys, dsts, true);
    }

    private long[] getIntoInternal(List<String> keys, List<MemorySegment> dsts, boolean batch) {
        return reads.read(keys, batch, (i, len) -> {
            MemorySegment d = dsts.get(i);
            if (d.byteSize() < len) {
                throw new IllegalArgumentException("destination for key '" + Keys.abbreviate(keys.get(i)) + "' has "
                        + d.byteSize() + " bytes; the value has " + len);
            }
            return d.asSlice(0, len);
        });
    }

    // ================================================================== ranges and parts

    /**
     * Looks {@code keys} up once (remembered locations under the read lease, the rest in one master
     * round trip), for {@link #getRangesInto} to read ranges of them as often as needed. Does not
     * count as a read for eviction; the ranged reads do.
     */
    public Located locate(List<String> keys) {
        return ranges.locate(keys);
    }

    /**
     * Reads, for each located object i, {@code dsts.get(i).byteSize()} bytes from {@code rangeOffsets[i]}
     * of its value into {@code dsts.get(i)}: element i of the result is the bytes read, or {@link #MISS}
     * (missing when located, removed or replaced since, or its node unreachable; never other bytes).
     * Same-machine objects are copied from the node's shared memory; the rest take one
     * NODE_READ_RANGE per node.
     *
     * @throws IllegalArgumentException when a range lies outside its object's value (naming the key)
     *                                  or the lists' sizes differ
     */
    public long[] getRangesInto(Located objects, long[] rangeOffsets, List<MemorySegment> dsts) {
        return ranges.read(objects, rangeOffsets, dsts);
    }

    /** {@link #getRangesInto} of one key, located first: the bytes read into {@code dst}, or {@link #MISS}. */
    public long getRangeInto(String key, long rangeOffset, MemorySegment dst) {
        return ranges.read(ranges.locate(List.of(key)), new long[]{rangeOffset}, List.of(dst))[0];
    }

    /**
     * Begins a put whose values are written in parts ({@link PutInParts}): reserves an object of
     * {@code valueLengths[i]} bytes under each key, written with {@link PutInParts#write} and made
     * visible by {@link PutInParts#finish}. A key that is taken is refused at once
     * ({@link PutInParts#status} ALREADY_EXISTS).
     */
    public PutInParts beginPut(List<String> keys, long[] valueLengths, PutOptions options) {
        int replicas = options.replicas() > 0 ? options.replicas() : config.replicas();
        return writes.beginParts(keys, valueLengths, preferredSegment(options), replicas, options.pinSeconds());
    }

    // ================================================================== probes

    /** True if a complete object is stored under {@code key}. Does not count as a read for eviction. */
    public boolean exists(String key) {
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        return master.call(Opcode.EXIST_KEY, w, MasterMessages.Flags::read).values()[0];
    }

    /**
     * Presence of each key, in one round trip. Does not count as a read for eviction. The keys travel
     * as 16-byte digests (BATCH_EXIST_DIGEST): a key present reads {@code true}; a key absent reads
     * {@code false} unless another stored key has the same 128-bit digest (never by chance; see
     * {@link io.kvpool.protocol.KeyDigest}), and a read by key is exact either way.
     */
    public boolean[] batchExists(List<String> keys) {
        long[] digests = Keys.digests(keys, 0, keys.size());
        boolean[] out = new boolean[keys.size()];
        for (int from = 0; from < keys.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(keys.size(), from + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(4 + (to - from) * KeyDigest.BYTES);
            DigestList.write(w, digests, from, to - from);
            boolean[] part = master.call(Opcode.BATCH_EXIST_DIGEST, w, MasterMessages.Flags::read).values();
            System.arraycopy(part, 0, out, from, part.length);
        }
        return out;
    }

    /**
     * How many of {@code keys}, in order, are present before the first absent one: the prefix lookup
     * an engine runs for every request. One round trip, the keys as 16-byte digests
     * (PREFIX_MATCH_DIGEST; see {@link #batchExists} for what a digest answer means). Does not count
     * as a read for eviction.
     */
    public int prefixMatch(List<String> keys) {
        return prefixMatchDigests(Keys.digests(keys, 0, keys.size()), 0, keys.size());
    }

    /**
     * {@link #prefixMatch} of keys the caller digested already ({@link KeyDigest}): {@code digests}
     * holds lo and hi of each key, and keys {@code [from, to)} are asked. For callers that ask about the
     * same keys again and again, such as a connector answering the scheduler for a waiting request: the
     * digests are computed once, not per call.
     */
    public int prefixMatchDigests(long[] digests, int from, int to) {
        if (from < 0 || to < from || 2L * to > digests.length) {
            throw new IllegalArgumentException("keys [" + from + ", " + to + ") are not in " + digests.length / 2
                    + " digests");
        }
        int matched = 0;
        for (int f = from; f < to; f += MAX_KEYS_PER_FRAME) {
            int t = Math.min(to, f + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(4 + (t - f) * KeyDigest.BYTES);
            DigestList.write(w, digests, f, t - f);
            int m = master.call(Opcode.PREFIX_MATCH_DIGEST, w, r -> r.i32("matched"));
            matched += m;
            if (m < t - f) {
                break;
            }
        }
        return matched;
    }

    /**
     * Of {@code keys} (a prompt's block keys, in order): how many leading ones the pool holds, and how many of those
     * are in memory and how many on the SSD tier only (TIER_LOOKUP): what a router without an event stream asks.
     * One round trip per 16,384 keys; does not count as a read for eviction.
     */
    public TierCounts tierLookup(List<String> keys) {
        List<byte[]> k = Keys.encodeAll(keys);
        byte[] codes = new byte[k.size()];
        for (int f = 0; f < k.size(); f += MAX_KEYS_PER_FRAME) {
            int t = Math.min(k.size(), f + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter();
            new KeyList(k.subList(f, t)).write(w);
            byte[] part = master.call(Opcode.TIER_LOOKUP, w, MasterMessages.TierCodes::read).codes();
            System.arraycopy(part, 0, codes, f, part.length);
            if (TierCounts.of(part).prefixBlocks() < part.length) {
                break; // the prefix ended in this frame: the keys after it change nothing
            }
        }
        return TierCounts.of(codes);
    }

    /**
     * Tells the master what the engine knows of the blocks it is about to save under {@code keys} (BLOCK_INFO): their
     * tokens, block size, parent hash, LoRA and salt, which the master's KV events then carry in each key's
     * {@code BlockStored}, so routers that hash tokens themselves (Dynamo, llm-d) can use them. Send it before the
     * puts. Returns how many infos the master kept: 0 when its events are off. Frames of at most 16,384 infos and
     * about {@value #BLOCK_INFO_FRAME_BYTES} bytes.
     */
    public int describeBlocks(List<String> keys, List<BlockInfo> infos) {
        if (keys.size() != infos.size()) {
            throw new IllegalArgumentException("describeBlocks: " + keys.size() + " keys but " + infos.size() + " infos");
        }
        List<byte[]> k = Keys.encodeAll(keys);
        int kept = 0;
        for (int f = 0; f < k.size(); ) {
            int t = f;
            long bytes = 0;
            while (t < k.size() && t - f < MAX_KEYS_PER_FRAME && (t == f || bytes < BLOCK_INFO_FRAME_BYTES)) {
                bytes += k.get(t).length + 4L * infos.get(t).tokenIds().length + 64;
                t++;
            }
            BodyWriter w = new BodyWriter((int) Math.min(bytes + 16, Integer.MAX_VALUE));
            new BlockInfoList(k.subList(f, t), infos.subList(f, t)).write(w);
            kept += master.call(Opcode.BLOCK_INFO, w, r -> r.i32("kept count"));
            f = t;
        }
        return kept;
    }

    /** The value length stored under {@code key}, or empty. Does not count as a read for eviction. */
    public OptionalLong size(String key) {
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        long s = master.call(Opcode.OBJECT_SIZE, w, MasterMessages.Sizes::read).values()[0];
        return s < 0 ? OptionalLong.empty() : OptionalLong.of(s);
    }

    // ================================================================== removal

    /** Removes {@code key}; false if it was not there. */
    public boolean remove(String key) {
        locations.invalidate(key);
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        return master.call(Opcode.REMOVE, w, MasterMessages.Codes::read).codes().getFirst() == ResultCode.OK;
    }

    /** Removes many keys in one round trip; returns how many were there. */
    public int removeBatch(List<String> keys) {
        List<byte[]> k = Keys.encodeAll(keys);
        for (String key : keys) {
            locations.invalidate(key);
        }
        int removed = 0;
        for (int from = 0; from < k.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(k.size(), from + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(16 + (to - from) * 64);
            new KeyList(k.subList(from, to)).write(w);
            for (ResultCode c : master.call(Opcode.BATCH_REMOVE, w, MasterMessages.Codes::read).codes()) {
                removed += c == ResultCode.OK ? 1 : 0;
            }
        }
        return removed;
    }

    /** Removes every object whose key starts with {@code prefix}; returns how many. */
    public long removeByPrefix(String prefix) {
        if (prefix == null || prefix.isEmpty()) {
            throw new IllegalArgumentException("removeByPrefix needs a non-empty prefix; use removeAll to empty the pool");
        }
        byte[] p = prefix.getBytes(StandardCharsets.UTF_8);
        if (p.length > Keys.MAX_KEY_BYTES) {
            throw new IllegalArgumentException("prefix '" + Keys.abbreviate(prefix) + "' is longer than any key ("
                    + p.length + " > " + Keys.MAX_KEY_BYTES + " bytes)");
        }
        locations.invalidatePrefix(prefix);
        BodyWriter w = new BodyWriter();
        new MasterMessages.Prefix(p).write(w);
        return master.call(Opcode.REMOVE_BY_PREFIX, w, MasterMessages.Removed::read).count();
    }

    /**
     * Empties the pool. With {@code force}, also fences every put in flight: none of them can become
     * visible afterwards (use this on an RL weight update). Returns how many objects were removed.
     */
    public long removeAll(boolean force) {
        locations.clear();
        BodyWriter w = new BodyWriter();
        new MasterMessages.RemoveAll(force).write(w);
        return master.call(Opcode.REMOVE_ALL, w, MasterMessages.Removed::read).count();
    }

    // ================================================================== stats

    /** The cluster as the master sees it now. Also refreshes this client's segment table. */
    public PoolStats stats() {
        return segments.refresh();
    }

    /** The segment this client would place puts in first, or null (see the class comment for the order). */
    public String preferredSegment() {
        return preferredSegment(PutOptions.DEFAULT);
    }

    private String preferredSegment(PutOptions options) {
        return PreferredSegment.choose(options.preferredSegment(), config.preferredSegment(), envPreferred,
                config.autoDetectLocal(), segments::localSegmentNames, clientId);
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        if (lease != null) {
            lease.close(); // first: it tells the master, through an ordinary connection, that the lease ended
        }
        if (writeLeases != null) {
            writeLeases.close(); // before the master channel closes: gives back the space leased and not used
        }
        closed = true;
        keepAlive.close();
        tasks.close();
        master.close();
        segments.close();
    }
}

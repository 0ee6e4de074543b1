package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.config.LocalHost;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Channels;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.LeaseMessages;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

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
 * <p>Thread-safe: share one client across an engine's threads.
 */
public final class KvPoolClient implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(KvPoolClient.class);
    /** Returned by {@link #getInto} for a miss. */
    public static final long MISS = -1;
    /** Most keys in one master frame; larger batches are split (a 512-byte-key batch this size is ~8.5 MiB). */
    static final int MAX_KEYS_PER_FRAME = 16384;
    /** Most objects in one node frame. */
    static final int MAX_ITEMS_PER_NODE_FRAME = 4096;

    private final ClientConfig config;
    private final UUID clientId = UUID.randomUUID();
    private final ConnectionPool master;
    private final Map<HostPort, ConnectionPool> nodes = new ConcurrentHashMap<>();
    private final SegmentDirectory directory = new SegmentDirectory();
    private final SharedSegments shared;
    private final LocationCache locations;
    /** Keeps the read lease under which remembered locations may be used; null when the cache is off. */
    private final LeaseKeeper lease;
    private final ExecutorService workers = Executors.newVirtualThreadPerTaskExecutor();
    /** The disk load budget in KiB permits, fair so that a large piece is not starved by small ones. */
    private final Semaphore diskLoads;
    private final String envPreferred;
    private final String localHost;
    private final Thread pinger;
    private volatile long masterIncarnation;
    private volatile long maxValueBytes = Long.MAX_VALUE;
    private volatile boolean closed;
    private volatile boolean pingFailing;

    private KvPoolClient(ClientConfig config) {
        this.config = config;
        String env = System.getenv(ClientConfig.PREFERRED_SEGMENT_ENV);
        this.envPreferred = env == null || env.isBlank() ? null : env.trim();
        this.localHost = LocalHost.defaultAdvertiseAddress();
        this.shared = new SharedSegments(config.sharedMemory());
        this.locations = new LocationCache(config.locationCache());
        this.diskLoads = new Semaphore(budgetPermits(config.diskLoadBudget()), true);
        this.master = new ConnectionPool(config.master(), config.maxConnections(), config.connectTimeout(),
                config.limits(), this::hello);
        this.pinger = Thread.ofVirtual().name("kvpool-client-ping").unstarted(this::pingLoop);
        this.lease = locations.enabled() ? new LeaseKeeper(config, locations, clientId, this::renewLease) : null;
    }

    /**
     * Connects to the master and returns a ready client.
     *
     * @throws KvPoolException naming the master if it cannot be reached
     */
    public static KvPoolClient connect(ClientConfig config) {
        KvPoolClient c = new KvPoolClient(config);
        try {
            c.refreshDirectory();
        } catch (RuntimeException e) {
            c.close();
            throw e;
        }
        c.pinger.start();
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
        return maxValueBytes;
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

    /** One replica write: which item (index within the chunk), which of its replicas, where, which version. */
    private record WriteSlot(int item, int replica, long offset, long generation) {
    }

    private List<PutStatus> putInternal(List<String> keys, List<MemorySegment> values, PutOptions options,
                                        boolean upsert, boolean batch) {
        if (keys.size() != values.size()) {
            throw new IllegalArgumentException(keys.size() + " keys but " + values.size() + " values");
        }
        int n = keys.size();
        byte[][] k = new byte[n][];
        for (int i = 0; i < n; i++) {
            k[i] = Keys.encode(keys.get(i));
            long len = values.get(i).byteSize();
            if (len > maxValueBytes) {
                throw new IllegalArgumentException("value for key '" + Keys.abbreviate(keys.get(i)) + "' is " + len
                        + " bytes; the pool accepts at most " + maxValueBytes);
            }
        }
        if (n == 0) {
            return List.of();
        }
        String preferred = preferredSegment(options);
        int replicas = options.replicas() > 0 ? options.replicas() : config.replicas();
        for (String key : keys) {
            locations.invalidate(key);
        }
        PutStatus[] status = new PutStatus[n];
        for (int from = 0; from < n; from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(n, from + MAX_KEYS_PER_FRAME);
            putChunk(k, values, from, to, preferred, replicas, upsert, batch, status);
        }
        return Arrays.asList(status);
    }

    private void putChunk(byte[][] k, List<MemorySegment> values, int from, int to, String preferred, int replicas,
                          boolean upsert, boolean batch, PutStatus[] status) {
        List<MasterMessages.PutStartItem> items = new ArrayList<>(to - from);
        for (int i = from; i < to; i++) {
            items.add(new MasterMessages.PutStartItem(k[i], values.get(i).byteSize()));
        }
        BodyWriter w = new BodyWriter(64 + items.size() * 64);
        new MasterMessages.PutStart(upsert, replicas, preferred == null ? "" : preferred, items).write(w);
        MasterMessages.PutStartReply reply = masterCall(batch ? Opcode.BATCH_PUT_START : Opcode.PUT_START, w,
                MasterMessages.PutStartReply::read);

        // group replica writes by segment
        Map<Integer, List<WriteSlot>> bySegment = new LinkedHashMap<>();
        int[] crcs = new int[to - from];
        List<MasterMessages.PutStartResult> results = reply.results();
        for (int j = 0; j < results.size(); j++) {
            MasterMessages.PutStartResult r = results.get(j);
            int i = from + j;
            switch (r.code()) {
                case OK -> {
                    crcs[j] = ObjectLayout.valueCrc(values.get(i));
                    for (int rep = 0; rep < r.replicas().size(); rep++) {
                        Replica replica = r.replicas().get(rep);
                        bySegment.computeIfAbsent(replica.segmentId(), x -> new ArrayList<>())
                                .add(new WriteSlot(j, rep, replica.offset(), r.generation()));
                    }
                }
                case ALREADY_EXISTS -> status[i] = PutStatus.ALREADY_EXISTS;
                case POOL_FULL -> status[i] = PutStatus.POOL_FULL;
                case NO_SEGMENT -> status[i] = PutStatus.NO_SEGMENT;
                case TOO_LARGE -> throw new IllegalArgumentException("value for key '" + Keys.decode(k[i]) + "' of "
                        + values.get(i).byteSize() + " bytes exceeds the master's max value size");
                default -> status[i] = PutStatus.FAILED;
            }
        }
        if (bySegment.isEmpty()) {
            return;
        }
        // write every replica; failed[j] has a bit per replica whose write failed
        long[] failed = new long[to - from];
        boolean[] fenced = new boolean[to - from];
        runPerSegment(bySegment, shareable(values.subList(from, to)), (segId, slots) -> {
            ResultCode[] codes = writeToSegment(segId, slots, k, values, from, crcs, reply.epoch());
            synchronized (failed) {
                for (int s = 0; s < slots.size(); s++) {
                    if (codes[s] != ResultCode.OK) {
                        failed[slots.get(s).item] |= 1L << slots.get(s).replica;
                        fenced[slots.get(s).item] |= codes[s] == ResultCode.FENCED;
                    }
                }
            }
        });
        // complete what landed at least once; revoke what landed nowhere
        List<MasterMessages.PutEndItem> ends = new ArrayList<>();
        List<Integer> endIdx = new ArrayList<>();
        List<MasterMessages.PutEndItem> revokes = new ArrayList<>();
        for (int j = 0; j < results.size(); j++) {
            MasterMessages.PutStartResult r = results.get(j);
            if (r.code() != ResultCode.OK) {
                continue;
            }
            long all = r.replicas().size() >= 64 ? -1L : (1L << r.replicas().size()) - 1;
            MasterMessages.PutEndItem item = new MasterMessages.PutEndItem(k[from + j], r.generation(), failed[j]);
            if ((failed[j] & all) == all) {
                revokes.add(new MasterMessages.PutEndItem(k[from + j], r.generation(), 0));
                status[from + j] = fenced[j] ? PutStatus.FENCED : PutStatus.FAILED;
            } else {
                ends.add(item);
                endIdx.add(from + j);
            }
        }
        if (!revokes.isEmpty()) {
            BodyWriter rw = new BodyWriter(16 + revokes.size() * 64);
            new MasterMessages.PutEnd(revokes).write(rw);
            try {
                masterCall(revokes.size() == 1 && !batch ? Opcode.PUT_REVOKE : Opcode.BATCH_PUT_REVOKE, rw,
                        MasterMessages.Codes::read);
            } catch (KvPoolException e) {
                log.debug("revoke failed; the master reclaims the space at the put timeout: {}", e.getMessage());
            }
        }
        if (!ends.isEmpty()) {
            BodyWriter ew = new BodyWriter(16 + ends.size() * 64);
            new MasterMessages.PutEnd(ends).write(ew);
            MasterMessages.Codes codes = masterCall(ends.size() == 1 && !batch ? Opcode.PUT_END : Opcode.BATCH_PUT_END,
                    ew, MasterMessages.Codes::read);
            for (int e = 0; e < ends.size(); e++) {
                status[endIdx.get(e)] = switch (codes.codes().get(e)) {
                    case OK -> PutStatus.OK;
                    case FENCED -> PutStatus.FENCED;
                    default -> PutStatus.FAILED;
                };
            }
        }
    }

    /** Writes the given replica slots to one segment; returns a code per slot. Never throws for node failures. */
    private ResultCode[] writeToSegment(int segId, List<WriteSlot> slots, byte[][] k, List<MemorySegment> values,
                                        int from, int[] crcs, long epoch) {
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        SegmentDirectory.Entry seg = resolve(segId);
        if (seg == null) {
            return codes;
        }
        MemorySegment shm = shared.mapping(seg);
        if (shm != null) {
            writeShared(seg, shm, slots, k, values, from, crcs, epoch, codes);
            return codes;
        }
        ConnectionPool pool = nodePool(seg.address());
        int start = 0;
        while (start < slots.size()) {
            int end = frameEnd(slots, start, slot -> values.get(from + slot.item).byteSize());
            List<NodeMessages.WriteItem> items = new ArrayList<>(end - start);
            List<ByteBuffer> views = new ArrayList<>(end - start);
            for (int s = start; s < end; s++) {
                WriteSlot slot = slots.get(s);
                MemorySegment v = values.get(from + slot.item);
                items.add(new NodeMessages.WriteItem(slot.offset, slot.generation, k[from + slot.item], v.byteSize(),
                        crcs[slot.item]));
                Channels.addViews(views, v);
            }
            BodyWriter w = new BodyWriter(16 + items.size() * 64);
            new NodeMessages.Write(epoch, items).write(w);
            FrameConnection c = null;
            try {
                c = pool.borrow(config.requestTimeout());
                MasterMessages.Codes reply = MasterMessages.Codes.read(
                        c.call(Opcode.NODE_WRITE, w, config.requestTimeout(), views.toArray(ByteBuffer[]::new)).body());
                for (int s = start; s < end; s++) {
                    codes[s] = reply.codes().get(s - start);
                }
            } catch (IOException | RemoteException e) {
                log.debug("write to {} failed: {}", seg.name(), e.getMessage());
            } finally {
                if (c != null) {
                    pool.release(c);
                }
            }
            start = end;
        }
        return codes;
    }

    /**
     * The same-machine write: the node admits the writes (NODE_SHM_WRITE_BEGIN), this thread copies
     * the values into the mapped segment, and NODE_SHM_WRITE_END makes them readable. See
     * {@link SharedSegments}.
     */
    private void writeShared(SegmentDirectory.Entry seg, MemorySegment shm, List<WriteSlot> slots, byte[][] k,
                             List<MemorySegment> values, int from, int[] crcs, long epoch, ResultCode[] codes) {
        ConnectionPool pool = nodePool(seg.address());
        int start = 0;
        while (start < slots.size()) {
            int end = frameEnd(slots, start, slot -> values.get(from + slot.item).byteSize());
            List<NodeMessages.WriteItem> items = new ArrayList<>(end - start);
            for (int s = start; s < end; s++) {
                WriteSlot slot = slots.get(s);
                items.add(new NodeMessages.WriteItem(slot.offset, slot.generation, k[from + slot.item],
                        values.get(from + slot.item).byteSize(), crcs[slot.item]));
            }
            FrameConnection c = null;
            try {
                c = pool.borrow(config.requestTimeout());
                BodyWriter w = new BodyWriter(16 + items.size() * 64);
                new NodeMessages.Write(epoch, items).write(w);
                List<ResultCode> begun = MasterMessages.Codes.read(
                        c.call(Opcode.NODE_SHM_WRITE_BEGIN, w, config.requestTimeout()).body()).codes();
                List<NodeMessages.ShmWriteEndItem> ends = new ArrayList<>(items.size());
                List<Integer> endSlots = new ArrayList<>(items.size());
                for (int s = start; s < end; s++) {
                    ResultCode b = begun.get(s - start);
                    if (b != ResultCode.OK) {
                        codes[s] = b;
                        continue;
                    }
                    WriteSlot slot = slots.get(s);
                    MemorySegment v = values.get(from + slot.item);
                    long at = slot.offset + ObjectLayout.valueOffset(k[from + slot.item].length);
                    MemorySegment.copy(v, 0, shm, at, v.byteSize());
                    ends.add(new NodeMessages.ShmWriteEndItem(slot.offset, slot.generation, true));
                    endSlots.add(s);
                }
                if (!ends.isEmpty()) {
                    BodyWriter ew = new BodyWriter(16 + ends.size() * 17);
                    new NodeMessages.ShmWriteEnd(ends).write(ew);
                    List<ResultCode> done = MasterMessages.Codes.read(
                            c.call(Opcode.NODE_SHM_WRITE_END, ew, config.requestTimeout()).body()).codes();
                    for (int e = 0; e < endSlots.size(); e++) {
                        codes[endSlots.get(e)] = done.get(e);
                    }
                }
            } catch (IOException | RemoteException e) {
                // begun writes of a connection that fails are dropped by the node when it closes
                log.debug("same-machine write to {} failed: {}", seg.name(), e.getMessage());
            } finally {
                if (c != null) {
                    pool.release(c);
                }
            }
            start = end;
        }
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
        long[] lengths = readInternal(keys, batch, (i, len) -> {
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
        return readInternal(keys, batch, (i, len) -> {
            MemorySegment d = dsts.get(i);
            if (d.byteSize() < len) {
                throw new IllegalArgumentException("destination for key '" + Keys.abbreviate(keys.get(i)) + "' has "
                        + d.byteSize() + " bytes; the value has " + len);
            }
            return d.asSlice(0, len);
        });
    }

    /** Supplies where item i's value of {@code len} bytes goes. */
    private interface Destination {
        MemorySegment of(int item, long len);
    }

    /** One object read: which item, from which replica, how long. */
    private record ReadSlot(int item, long offset, long generation, long length, int tier) {
    }

    private long[] readInternal(List<String> keys, boolean batch, Destination dest) {
        int n = keys.size();
        long[] lengths = new long[n];
        Arrays.fill(lengths, MISS);
        if (n == 0) {
            return lengths;
        }
        List<byte[]> k = encodeAll(keys);
        MasterMessages.ReplicaList[] where = new MasterMessages.ReplicaList[n];
        MemorySegment[] dsts = new MemorySegment[n];
        // locations remembered from earlier reads skip the master, under the read lease (LocationCache);
        // the rest are asked for in one batch
        boolean leased = lease != null && lease.ensure();
        long snapshot = locations.snapshot(); // before any location is read or asked for
        boolean[] cached = new boolean[n];
        List<Integer> ask = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            where[i] = leased ? locations.get(keys.get(i)) : null;
            if (where[i] != null) {
                cached[i] = true;
            } else {
                ask.add(i);
            }
        }
        lookup(keys, k, ask, batch, where, snapshot);
        for (int i = 0; i < n; i++) {
            // destinations are fixed before any byte moves, so a too-small one fails before I/O
            if (where[i].code() == ResultCode.OK && !where[i].replicas().isEmpty()) {
                dsts[i] = dest.of(i, where[i].valueLength());
            }
        }
        readRound(where, dsts, lengths, all(n));
        // a copy from a remembered location counts only if the lease still runs and nothing removed
        // or replaced the key meanwhile; a remembered location that missed: the object moved or went.
        // Either way, ask the master once more
        long now = System.nanoTime();
        List<Integer> retry = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            if (cached[i]) {
                if (lengths[i] != MISS && !locations.confirm(keys.get(i), snapshot, now)) {
                    lengths[i] = MISS;
                }
                if (lengths[i] == MISS) {
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
            readRound(where, dsts, lengths, again);
        }
        if (config.tierLog()) {
            logTiers(where, lengths);
        }
        return lengths;
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
            if (lengths[i] == MISS) {
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
    private void lookup(List<String> keys, List<byte[]> k, List<Integer> items, boolean batch,
                        MasterMessages.ReplicaList[] where, long snapshot) {
        for (int from = 0; from < items.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(items.size(), from + MAX_KEYS_PER_FRAME);
            List<byte[]> part = new ArrayList<>(to - from);
            for (int j = from; j < to; j++) {
                part.add(k.get(items.get(j)));
            }
            BodyWriter w = new BodyWriter(16 + part.size() * 64);
            new KeyList(part).write(w);
            MasterMessages.ReplicaListReply r = masterCall(batch || part.size() > 1 ? Opcode.BATCH_GET_REPLICA_LIST
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

    /** Reads the given items, trying their replicas in order (local first); sets lengths[item] for each hit. */
    private void readRound(MasterMessages.ReplicaList[] where, MemorySegment[] dsts, long[] lengths, List<Integer> items) {
        List<List<Replica>> order = new ArrayList<>(where.length);
        for (int i = 0; i < where.length; i++) {
            order.add(where[i].code() == ResultCode.OK ? localFirst(where[i].replicas()) : List.of());
        }
        for (int attempt = 0; ; attempt++) {
            Map<Integer, List<ReadSlot>> bySegment = new LinkedHashMap<>();
            for (int i : items) {
                if (lengths[i] == MISS && attempt < order.get(i).size()) {
                    Replica rep = order.get(i).get(attempt);
                    bySegment.computeIfAbsent(rep.segmentId(), x -> new ArrayList<>())
                            .add(new ReadSlot(i, rep.offset(), where[i].generation(), where[i].valueLength(), rep.tier()));
                }
            }
            if (bySegment.isEmpty()) {
                return;
            }
            runPerSegment(bySegment, shareable(Arrays.asList(dsts)),
                    (segId, slots) -> readFromSegment(segId, slots, dsts, lengths));
        }
    }

    /** Reads the slots from one segment into their destinations, setting lengths[item] for each hit. */
    private void readFromSegment(int segId, List<ReadSlot> slots, MemorySegment[] dsts, long[] lengths) {
        SegmentDirectory.Entry seg = resolve(segId);
        if (seg == null) {
            return;
        }
        MemorySegment shm = shared.mapping(seg);
        List<ReadSlot> memory = new ArrayList<>(slots.size());
        List<ReadSlot> disk = new ArrayList<>();
        for (ReadSlot slot : slots) {
            if (slot.tier == Tier.DISK) {
                disk.add(slot);
            } else if (shm == null
                    || !SharedSegments.read(shm, slot.offset, slot.generation, slot.length, dsts[slot.item])) {
                // same machine: copied straight from the node's memory above; what changed under the copy goes over TCP
                memory.add(slot);
            } else {
                lengths[slot.item] = slot.length;
            }
        }
        ConnectionPool pool = nodePool(seg.address());
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
            int end = frameEnd(slots, start, slot -> slot.length, maxBytes);
            List<NodeMessages.ReadItem> items = new ArrayList<>(end - start);
            for (int s = start; s < end; s++) {
                ReadSlot slot = slots.get(s);
                items.add(new NodeMessages.ReadItem(slot.offset, slot.generation, slot.length, slot.tier));
            }
            BodyWriter w = new BodyWriter(16 + items.size() * 24);
            new NodeMessages.Read(items).write(w);
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
                MasterMessages.Codes codes = MasterMessages.Codes.read(
                        c.call(Opcode.NODE_READ, w, config.requestTimeout()).body());
                for (int s = start; s < end; s++) {
                    ReadSlot slot = slots.get(s);
                    if (codes.codes().get(s - start) == ResultCode.OK) {
                        c.readPayload(dsts[slot.item], config.requestTimeout());
                        lengths[slot.item] = slot.length;
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
     * Where the node frame starting at {@code start} ends: at most {@link #MAX_ITEMS_PER_NODE_FRAME}
     * items and the payload limit (a single value over the limit still goes, alone).
     */
    private <T> int frameEnd(List<T> slots, int start, java.util.function.ToLongFunction<T> length) {
        return frameEnd(slots, start, length, config.limits().maxPayloadBytes());
    }

    private <T> int frameEnd(List<T> slots, int start, java.util.function.ToLongFunction<T> length, long maxBytes) {
        int end = start;
        long payload = 0;
        while (end < slots.size() && end - start < MAX_ITEMS_PER_NODE_FRAME) {
            long len = length.applyAsLong(slots.get(end));
            if (end > start && payload + len > maxBytes) {
                break;
            }
            payload += len;
            end++;
        }
        return end;
    }

    private List<Replica> localFirst(List<Replica> replicas) {
        if (replicas.size() < 2) {
            return replicas;
        }
        List<Replica> out = new ArrayList<>(replicas.size());
        for (Replica r : replicas) {
            SegmentDirectory.Entry e = directory.get(r.segmentId());
            if (e != null && e.local()) {
                out.add(r);
            }
        }
        for (Replica r : replicas) {
            if (!out.contains(r)) {
                out.add(r);
            }
        }
        return out;
    }

    // ================================================================== probes

    /** True if a complete object is stored under {@code key}. Does not count as a read for eviction. */
    public boolean exists(String key) {
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        return masterCall(Opcode.EXIST_KEY, w, MasterMessages.Flags::read).values()[0];
    }

    /** Presence of each key, in one round trip. Does not count as a read for eviction. */
    public boolean[] batchExists(List<String> keys) {
        List<byte[]> k = encodeAll(keys);
        boolean[] out = new boolean[k.size()];
        for (int from = 0; from < k.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(k.size(), from + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(16 + (to - from) * 64);
            new KeyList(k.subList(from, to)).write(w);
            boolean[] part = masterCall(Opcode.BATCH_EXIST_KEY, w, MasterMessages.Flags::read).values();
            System.arraycopy(part, 0, out, from, part.length);
        }
        return out;
    }

    /**
     * How many of {@code keys}, in order, are present before the first absent one: the prefix lookup
     * an engine runs for every request. One round trip. Does not count as a read for eviction.
     */
    public int prefixMatch(List<String> keys) {
        List<byte[]> k = encodeAll(keys);
        int matched = 0;
        for (int from = 0; from < k.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(k.size(), from + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(16 + (to - from) * 64);
            new KeyList(k.subList(from, to)).write(w);
            int m = masterCall(Opcode.PREFIX_MATCH, w, r -> r.i32("matched"));
            matched += m;
            if (m < to - from) {
                break;
            }
        }
        return matched;
    }

    /** The value length stored under {@code key}, or empty. Does not count as a read for eviction. */
    public OptionalLong size(String key) {
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        long s = masterCall(Opcode.OBJECT_SIZE, w, MasterMessages.Sizes::read).values()[0];
        return s < 0 ? OptionalLong.empty() : OptionalLong.of(s);
    }

    // ================================================================== removal

    /** Removes {@code key}; false if it was not there. */
    public boolean remove(String key) {
        locations.invalidate(key);
        BodyWriter w = new BodyWriter();
        new KeyList(List.of(Keys.encode(key))).write(w);
        return masterCall(Opcode.REMOVE, w, MasterMessages.Codes::read).codes().getFirst() == ResultCode.OK;
    }

    /** Removes many keys in one round trip; returns how many were there. */
    public int removeBatch(List<String> keys) {
        List<byte[]> k = encodeAll(keys);
        for (String key : keys) {
            locations.invalidate(key);
        }
        int removed = 0;
        for (int from = 0; from < k.size(); from += MAX_KEYS_PER_FRAME) {
            int to = Math.min(k.size(), from + MAX_KEYS_PER_FRAME);
            BodyWriter w = new BodyWriter(16 + (to - from) * 64);
            new KeyList(k.subList(from, to)).write(w);
            for (ResultCode c : masterCall(Opcode.BATCH_REMOVE, w, MasterMessages.Codes::read).codes()) {
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
        return masterCall(Opcode.REMOVE_BY_PREFIX, w, MasterMessages.Removed::read).count();
    }

    /**
     * Empties the pool. With {@code force}, also fences every put in flight: none of them can become
     * visible afterwards (use this on an RL weight update). Returns how many objects were removed.
     */
    public long removeAll(boolean force) {
        locations.clear();
        BodyWriter w = new BodyWriter();
        new MasterMessages.RemoveAll(force).write(w);
        return masterCall(Opcode.REMOVE_ALL, w, MasterMessages.Removed::read).count();
    }

    // ================================================================== stats

    /** The cluster as the master sees it now. Also refreshes this client's segment table. */
    public PoolStats stats() {
        return refreshDirectory();
    }

    private PoolStats refreshDirectory() {
        MasterMessages.ClusterStats s = masterCall(Opcode.CLUSTER_STATS, new BodyWriter(0), MasterMessages.ClusterStats::read);
        List<PoolStats.SegmentStats> segs = new ArrayList<>(s.segments().size());
        for (MasterMessages.SegmentInfo i : s.segments()) {
            segs.add(new PoolStats.SegmentStats(i.id(), i.name(), i.host(), i.port(), i.capacity(), i.used(), i.objects(),
                    i.state() == MasterMessages.SegmentInfo.STATE_ACTIVE, i.heartbeatAgeMillis(), i.shmPath(),
                    i.tiers().diskCapacity(), i.tiers().diskUsed(), i.tiers().diskObjects()));
        }
        directory.replace(segs);
        shared.retain(directory.ids());
        return new PoolStats(s.epoch(), s.keys(), s.pendingPuts(), s.allocatedBytes(), s.capacityBytes(),
                s.activeClients(), List.copyOf(segs));
    }

    /** The segment this client would place puts in first, or null (see the class comment for the order). */
    public String preferredSegment() {
        return preferredSegment(PutOptions.DEFAULT);
    }

    private String preferredSegment(PutOptions options) {
        return PreferredSegment.choose(options.preferredSegment(), config.preferredSegment(), envPreferred,
                config.autoDetectLocal(), this::localSegmentNames, clientId);
    }

    /** Names of active segments on this host, from a segment table at most 10 s old. */
    private List<String> localSegmentNames() {
        if (directory.ageNanos() > Duration.ofSeconds(10).toNanos()) {
            try {
                refreshDirectory();
            } catch (KvPoolException e) {
                return List.of();
            }
        }
        List<String> names = new ArrayList<>();
        for (SegmentDirectory.Entry e : directory.localSegments()) {
            names.add(e.name());
        }
        return names;
    }

    // ================================================================== plumbing

    private SegmentDirectory.Entry resolve(int segmentId) {
        SegmentDirectory.Entry e = directory.get(segmentId);
        if (e == null) {
            try {
                refreshDirectory();
            } catch (KvPoolException ex) {
                return null;
            }
            e = directory.get(segmentId);
        }
        return e;
    }

    private ConnectionPool nodePool(HostPort address) {
        return nodes.computeIfAbsent(address, a -> new ConnectionPool(a, config.maxConnections(), config.connectTimeout(),
                config.limits(), null));
    }

    private void hello(FrameConnection c) throws IOException {
        BodyWriter w = new BodyWriter();
        new MasterMessages.Hello(MasterMessages.Role.CLIENT, clientId, localHost, ProcessHandle.current().pid()).write(w);
        MasterMessages.HelloReply r = MasterMessages.HelloReply.read(c.call(Opcode.HELLO, w, config.requestTimeout()).body());
        maxValueBytes = r.maxValueBytes();
        if (masterIncarnation != 0 && masterIncarnation != r.incarnation()) {
            log.info("master {} restarted; refreshing the segment table and forgetting remembered locations",
                    config.master());
            directory.clear();
            locations.masterRestarted();
        }
        masterIncarnation = r.incarnation();
    }

    /**
     * One request to the master. A connection-level failure is retried once on a fresh connection
     * (covers idle connections left dead by a master restart); a timeout is not retried.
     */
    private <T> T masterCall(Opcode op, BodyWriter body, Function<BodyReader, T> parse) {
        if (closed) {
            throw new IllegalStateException("client is closed");
        }
        IOException last = null;
        for (int attempt = 0; attempt < 2; attempt++) {
            FrameConnection c = null;
            try {
                c = master.borrow(config.requestTimeout());
                FrameConnection.Reply reply = c.call(op, body, config.requestTimeout());
                return parse.apply(reply.body());
            } catch (RemoteException e) {
                if (e.status() == FrameStatus.BAD_REQUEST) {
                    throw new IllegalArgumentException(e.getMessage(), e);
                }
                throw new KvPoolException(e.getMessage(), e);
            } catch (SocketTimeoutException e) {
                throw new KvPoolException("master " + config.master() + " did not answer " + op.metricName + " within "
                        + config.requestTimeout().toMillis() + " ms", e);
            } catch (IOException e) {
                last = e;
                master.drainIdle();
            } finally {
                if (c != null) {
                    master.release(c);
                }
            }
        }
        throw new KvPoolException("master " + config.master() + " unreachable for " + op.metricName + ": "
                + last.getMessage(), last);
    }

    private interface SegmentTask<T> {
        void run(int segmentId, List<T> slots);
    }

    /** A thread that never runs: a segment accessible by it is accessible by any worker thread. */
    private static final Thread ANY_OTHER_THREAD = Thread.ofVirtual().unstarted(() -> { });

    /** True when every segment can be touched by worker threads (heap, global, auto and shared arenas). */
    private static boolean shareable(List<MemorySegment> segments) {
        for (MemorySegment s : segments) {
            if (s != null && !s.isAccessibleBy(ANY_OTHER_THREAD)) {
                return false;
            }
        }
        return true;
    }

    /**
     * Runs one task per segment: on virtual threads when there are several and the caller's memory
     * allows it, otherwise one after another on the calling thread (memory from a confined arena can
     * only be touched by its owner).
     */
    private <T> void runPerSegment(Map<Integer, List<T>> bySegment, boolean parallelOk, SegmentTask<T> task) {
        if (bySegment.size() == 1 || !parallelOk) {
            for (Map.Entry<Integer, List<T>> e : bySegment.entrySet()) {
                task.run(e.getKey(), e.getValue());
            }
            return;
        }
        List<Future<?>> futures = new ArrayList<>(bySegment.size());
        for (Map.Entry<Integer, List<T>> e : bySegment.entrySet()) {
            futures.add(workers.submit(() -> task.run(e.getKey(), e.getValue())));
        }
        for (Future<?> f : futures) {
            try {
                f.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new KvPoolException("interrupted", e);
            } catch (ExecutionException e) {
                if (e.getCause() instanceof RuntimeException re) {
                    throw re;
                }
                throw new KvPoolException(e.getCause().toString(), e.getCause());
            }
        }
    }

    private static List<byte[]> encodeAll(List<String> keys) {
        List<byte[]> k = new ArrayList<>(keys.size());
        for (String s : keys) {
            k.add(Keys.encode(s));
        }
        return k;
    }

    /**
     * Tells the master about reads served from the location cache (a batched GET_REPLICA_LIST: the
     * master stamps them as read for its LRU) and refreshes or drops their entries with the answer.
     */
    private void reportCachedReads() {
        List<String> keys = locations.drainTouched(MAX_KEYS_PER_FRAME);
        if (keys.isEmpty()) {
            return;
        }
        BodyWriter w = new BodyWriter(16 + keys.size() * 64);
        new KeyList(encodeAll(keys)).write(w);
        long snapshot = locations.snapshot();
        MasterMessages.ReplicaListReply r = masterCall(Opcode.BATCH_GET_REPLICA_LIST, w, MasterMessages.ReplicaListReply::read);
        for (int i = 0; i < keys.size(); i++) {
            MasterMessages.ReplicaList rl = r.items().get(i);
            if (rl.code() == ResultCode.OK) {
                locations.remember(keys.get(i), rl, snapshot);
            } else {
                locations.invalidate(keys.get(i));
            }
        }
    }

    /** One LEASE exchange on an ordinary master connection (answered at once: hold 0, or an end). */
    private LeaseMessages.LeaseReply renewLease(LeaseMessages.LeaseRequest req) {
        BodyWriter w = new BodyWriter(48);
        req.write(w);
        return masterCall(Opcode.LEASE, w, LeaseMessages.LeaseReply::read);
    }

    private void pingLoop() {
        int pings = 0;
        while (!closed) {
            try {
                Thread.sleep(config.pingInterval());
            } catch (InterruptedException e) {
                return;
            }
            if (closed) {
                return;
            }
            try {
                reportCachedReads();
                BodyWriter w = new BodyWriter(16);
                new MasterMessages.Ping(clientId).write(w);
                masterCall(Opcode.PING, w, r -> r.i64("epoch"));
                if (++pings % 5 == 0) {
                    refreshDirectory();
                }
                if (pingFailing) {
                    log.info("master {} reachable again", config.master());
                    pingFailing = false;
                }
            } catch (RuntimeException e) {
                if (!pingFailing && !closed) {
                    log.warn("cannot reach master {}: {}", config.master(), e.getMessage());
                    pingFailing = true;
                }
            }
        }
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        if (lease != null) {
            lease.close(); // before closed is set: it tells the master through an ordinary connection
        }
        closed = true;
        pinger.interrupt();
        workers.shutdownNow();
        master.close();
        for (ConnectionPool p : nodes.values()) {
            p.close();
        }
    }
}

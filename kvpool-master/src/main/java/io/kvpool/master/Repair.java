package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.NodeMessages.ReplicateItem;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.random.RandomGenerator;

/**
 * Background repair: brings objects that lost copies (a node died, a disk copy was dropped, a put
 * landed on fewer segments than it asked for) back to the number of copies their put asked for, when
 * there is room for them.
 *
 * <h2>A round</h2>
 * <ol>
 *   <li><b>Plan</b>, under the epoch read lock: scan the index shard by shard, count the objects below
 *       their copies (the {@code master_objects_under_replicated} gauge), and for up to
 *       {@link #MAX_PER_ROUND} of them pick a source copy (a memory copy when there is one, else a disk
 *       copy) and reserve a region for one more copy on a segment that holds none, on a host that holds
 *       none where one has room ({@link Placement#oneMore}). A repair never evicts: without room, the
 *       object waits for a later round.</li>
 *   <li><b>Copy</b>, with no lock held: one NODE_REPLICATE per (source, target) pair, in parallel. The
 *       source node reads its copy (checked by generation) and writes it to the target with NODE_WRITE
 *       under this master's epoch and term, so the target fences it exactly as it fences a client's
 *       write: a copy from a deposed master, or from before a removeAll(force), is refused there.</li>
 *   <li><b>Commit</b>, under the epoch read lock and each key's shard lock: a copy that landed becomes a
 *       replica only if the object is still there at the same generation (not removed, evicted or
 *       replaced meanwhile), the target segment is still registered and holds no copy yet, and the
 *       epoch did not move. Otherwise its region is given back (and the node told to drop it); after an
 *       epoch change there is nothing to give back, the reset reclaimed everything.</li>
 * </ol>
 *
 * <h2>Invariants</h2>
 * <ul>
 *   <li>A reader never sees a copy that is not complete: a replica is added only after its node
 *       acknowledged the whole write, and the copy carries the object's generation, so a read of it
 *       is checked like any other.</li>
 *   <li>A round makes at most one new copy per object; an object missing two gets the second in the
 *       next round (rounds follow each other while there is work).</li>
 *   <li>Nothing is counted or scanned while nothing changed: a round runs when marked dirty (a copy
 *       was lost, a put fell short, a segment joined) or, while objects stay below their copies for
 *       want of room, every {@link #RETRY_MILLIS}.</li>
 * </ul>
 * Objects rebuilt by a new master after a failover want the copies the nodes reported: the count a
 * put asked for lives in the leader's memory only (docs/architecture.md, "Replicas").
 */
final class Repair {

    private static final Logger log = LoggerFactory.getLogger(Repair.class);

    /** Most objects one round copies. */
    static final int MAX_PER_ROUND = 4096;
    /** Most value bytes in one NODE_REPLICATE (the source node stages nothing: it streams from its segment). */
    static final long MAX_BYTES_PER_CALL = 64L << 20;
    /** Most items in one NODE_REPLICATE. */
    static final int MAX_ITEMS_PER_CALL = 1024;
    /** While objects wait for room, rounds are retried this often. */
    static final long RETRY_MILLIS = 5_000;
    /** Parallel NODE_REPLICATE calls in one round. */
    static final int PARALLEL_CALLS = 8;

    private final InstantSource clock;
    private final Epoch epoch;
    private final ObjectIndex index;
    private final Segments segments;
    private final NodeNotifier nodes;
    private final RandomGenerator random;

    private volatile boolean dirty;
    /** No round before this ({@link #holdOff}). */
    private volatile long notBeforeMillis;
    private volatile long lastRoundMillis;

    /** Objects below their copies at the end of the last plan (a gauge). */
    final AtomicLong underReplicated = new AtomicLong();
    /** Copies made and made visible. */
    final AtomicLong copiesMade = new AtomicLong();
    /** Copies that did not land (source gone, target refused or unreachable) or were dropped at commit. */
    final AtomicLong copiesFailed = new AtomicLong();
    /** Objects that had to wait because no segment without a copy had room. */
    final AtomicLong noRoom = new AtomicLong();

    Repair(InstantSource clock, Epoch epoch, ObjectIndex index, Segments segments, NodeNotifier nodes,
           RandomGenerator random) {
        this.clock = clock;
        this.epoch = epoch;
        this.index = index;
        this.segments = segments;
        this.nodes = nodes;
        this.random = random;
    }

    /** Something may have left objects below their copies: the next round scans. */
    void markDirty() {
        dirty = true;
    }

    /**
     * A master that just took over from a standby's copy: the first round scans, but not before {@code
     * millis} from now. Its nodes come back one by one in its first second, each marking the repair dirty, and a
     * scan of ten million objects then took a core for two seconds just when clients and nodes reconnect; what the
     * old leader left below its copies waits a few seconds more.
     */
    void holdOff(long millis) {
        notBeforeMillis = clock.millis() + millis;
        dirty = true;
    }

    /** One planned copy: the object, where it is read from, and the region reserved for the new copy. */
    private record Task(byte[] key, int hash, long generation, long valueLength, long regionLength,
                        Segment source, Tier sourceTier, long sourceOffset, Segment target, long targetOffset) {
        ReplicateItem item() {
            return new ReplicateItem(key, generation, valueLength, sourceTier, sourceOffset, targetOffset);
        }
    }

    /** An object below its copies, as seen by the plan's scan. */
    private record Candidate(byte[] key, int hash, long generation, long valueLength, long regionLength,
                             int[] stored, long[] offsets) {
    }

    /**
     * Runs one round if there is reason to (see the class comment). Returns the copies made visible.
     * Called by the master's repair thread, and directly by tests.
     */
    int runOnce() {
        long now = clock.millis();
        if (now < notBeforeMillis) {
            return 0;
        }
        if (!dirty && (underReplicated.get() == 0 || now - lastRoundMillis < RETRY_MILLIS)) {
            return 0;
        }
        dirty = false;
        lastRoundMillis = now;
        long ep;
        List<Task> tasks;
        epoch.shared().lock();
        try {
            ep = epoch.current();
            tasks = plan();
        } finally {
            epoch.shared().unlock();
        }
        if (tasks.isEmpty()) {
            return 0;
        }
        long t0 = System.nanoTime();
        ResultCode[] codes = copy(tasks, ep);
        int made = commit(tasks, codes, ep);
        log.info("repair: {} of {} objects below their copies got one more in {} ms ({} did not land)",
                made, underReplicated.get(), (System.nanoTime() - t0) / 1_000_000, tasks.size() - made);
        // more may be waiting (past this round's cap, or a second missing copy): go on at once
        dirty = true;
        return made;
    }

    /** Counts the objects below their copies and reserves targets for up to {@link #MAX_PER_ROUND}. */
    @GuardedBy("epoch.shared()")
    private List<Task> plan() {
        List<Candidate> found = new ArrayList<>();
        long[] count = {0};
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> scan = shard -> {
            ObjectTable objects = shard.objects;
            for (int slot = 0, n = objects.size(); slot < n; slot++) {
                if (!objects.underReplicated(slot)) {
                    continue;
                }
                count[0]++;
                if (found.size() < MAX_PER_ROUND) {
                    int r = objects.replicas(slot);
                    int[] stored = new int[r];
                    long[] offs = new long[r];
                    for (int i = 0; i < r; i++) {
                        stored[i] = objects.segment(slot, i);
                        offs[i] = objects.offset(slot, i);
                    }
                    byte[] key = objects.key(slot);
                    found.add(new Candidate(key, objects.hash(slot), objects.generation(slot),
                            objects.valueLength(slot), objects.regionLength(slot), stored, offs));
                }
            }
        };
        index.forEachShard(scan);
        underReplicated.set(count[0]);
        List<Task> tasks = new ArrayList<>(found.size());
        for (Candidate c : found) {
            Segment source = null;
            Tier tier = Tier.MEMORY;
            long offset = 0;
            Set<Integer> holding = new HashSet<>();
            for (int i = 0; i < c.stored.length; i++) {
                int id = StoredSegment.id(c.stored[i]);
                holding.add(id);
                Segment s = segments.get(id);
                boolean disk = StoredSegment.onDisk(c.stored[i]);
                // a memory copy is the better source: no disk read on the way
                if (s != null && s.active && (source == null || tier == Tier.DISK && !disk)) {
                    source = s;
                    tier = disk ? Tier.DISK : Tier.MEMORY;
                    offset = c.offsets[i];
                }
            }
            if (source == null) {
                continue; // its copies are on segments still joining or already gone
            }
            Placement.Placed target = Placement.oneMore(segments, c.regionLength, holding, random);
            if (target == null) {
                noRoom.incrementAndGet();
                continue;
            }
            tasks.add(new Task(c.key, c.hash, c.generation, c.valueLength, c.regionLength, source, tier, offset,
                    target.segment(), target.offset()));
        }
        return tasks;
    }

    /** Sends the copies, one NODE_REPLICATE per (source, target) and size cap, in parallel; a code per task. */
    private ResultCode[] copy(List<Task> tasks, long ep) {
        ResultCode[] codes = new ResultCode[tasks.size()];
        Map<List<Integer>, List<Integer>> groups = new LinkedHashMap<>();
        for (int i = 0; i < tasks.size(); i++) {
            groups.computeIfAbsent(List.of(tasks.get(i).source.id, tasks.get(i).target.id), g -> new ArrayList<>()).add(i);
        }
        List<List<Integer>> calls = new ArrayList<>();
        for (List<Integer> group : groups.values()) {
            List<Integer> call = new ArrayList<>();
            long bytes = 0;
            for (int i : group) {
                long v = tasks.get(i).valueLength;
                if (!call.isEmpty() && (call.size() == MAX_ITEMS_PER_CALL || bytes + v > MAX_BYTES_PER_CALL)) {
                    calls.add(call);
                    call = new ArrayList<>();
                    bytes = 0;
                }
                call.add(i);
                bytes += v;
            }
            calls.add(call);
        }
        try (ExecutorService pool = Executors.newFixedThreadPool(Math.min(PARALLEL_CALLS, calls.size()),
                Thread.ofVirtual().name("kvpool-master-repair-", 0).factory())) {
            List<Future<?>> done = new ArrayList<>();
            for (List<Integer> call : calls) {
                done.add(pool.submit(() -> {
                    Task first = tasks.get(call.getFirst());
                    List<ReplicateItem> items = new ArrayList<>(call.size());
                    for (int i : call) {
                        items.add(tasks.get(i).item());
                    }
                    List<ResultCode> got = nodes.replicate(first.source, first.target, ep, items);
                    for (int j = 0; j < call.size(); j++) {
                        codes[call.get(j)] = j < got.size() ? got.get(j) : ResultCode.FAILED;
                    }
                }));
            }
            for (Future<?> f : done) {
                try {
                    f.get();
                } catch (ExecutionException e) {
                    // that call's tasks stay null: failed
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return codes;
    }

    /** Makes the copies that landed replicas, and gives back every region that did not become one. */
    private int commit(List<Task> tasks, ResultCode[] codes, long ep) {
        int made = 0;
        epoch.shared().lock();
        try {
            if (epoch.current() != ep) {
                // a reset came in between: every reservation of the old epoch was reclaimed with it
                copiesFailed.addAndGet(tasks.size());
                return 0;
            }
            for (int i = 0; i < tasks.size(); i++) {
                Task t = tasks.get(i);
                boolean landed = codes[i] == ResultCode.OK;
                @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
                Function<ObjectIndex.Shard, Boolean> addCopy = shard -> {
                    ObjectTable objects = shard.objects;
                    int slot = objects.find(t.key, t.hash);
                    if (slot < 0 || objects.generation(slot) != t.generation || segments.get(t.target.id) != t.target
                            || objects.replicaOn(slot, t.target.id) >= 0 || !objects.underReplicated(slot)) {
                        return false;
                    }
                    objects.addReplica(slot, t.target.id, t.targetOffset);
                    return true;
                };
                boolean kept = landed && index.withShard(t.hash, addCopy);
                if (kept) {
                    made++;
                    continue;
                }
                copiesFailed.incrementAndGet();
                if (segments.get(t.target.id) == t.target) {
                    t.target.allocator.free(t.targetOffset, t.regionLength);
                    if (landed) {
                        nodes.free(t.target, t.targetOffset, t.generation, Tier.MEMORY, false);
                    }
                }
            }
        } finally {
            epoch.shared().unlock();
        }
        copiesMade.addAndGet(made);
        return made;
    }
}

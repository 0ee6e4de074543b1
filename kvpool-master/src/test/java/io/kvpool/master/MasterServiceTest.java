package io.kvpool.master;

import io.kvpool.config.Size;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.LeaseMessages;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.UUID;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/** The master's state machine alone, driven by a manual clock: no sockets, no sleeping. */
class MasterServiceTest {

    /** Every test object: a 1000-byte value under a short key takes one 1088-byte region. */
    private static final int VALUE = 1000;
    private static final long REGION = ObjectLayout.regionLength(6, VALUE);

    private ManualClock clock;
    private MasterService svc;
    private long incarnations;
    private final List<int[]> joined = new ArrayList<>();

    @BeforeEach
    void setUp() {
        clock = new ManualClock(1_700_000_000_000L);
        svc = service(MasterConfig.defaults());
    }

    private MasterService service(MasterConfig config) {
        return new MasterService(config, clock, new SplittableRandom(7), NodeNotifier.NONE);
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** Registers a segment with no inventory and activates it; returns its id. */
    private int join(MasterService s, String name, long capacity) {
        long inc = ++incarnations;
        RegisterReply r = s.membership().registerNode(new RegisterNode(name, "10.0.0." + inc, 50052, capacity, s.epoch(), inc, 0, "", ControlToken.random()));
        s.membership().inventory(new Inventory(r.segmentId(), inc, true, List.of()));
        joined.add(new int[]{r.segmentId(), (int) inc});
        return r.segmentId();
    }

    /** Lets time pass second by second, with every joined node heartbeating and the timers running. */
    private void passTime(MasterService s, Duration d) {
        for (long t = 0; t < d.toSeconds(); t++) {
            clock.advance(Duration.ofSeconds(1));
            for (int[] seg : joined) {
                s.membership().heartbeat(seg[0], seg[1]);
            }
            s.tick();
        }
    }

    private PutStartResult start(MasterService s, String key, boolean upsert, String preferred, int replicas) {
        PutStartReply reply = s.putStart(new PutStart(upsert, replicas, preferred,
                List.of(new PutStartItem(k(key), VALUE))));
        return reply.results().getFirst();
    }

    private ResultCode end(MasterService s, String key, long generation) {
        return s.putEnd(List.of(new PutEndItem(k(key), generation, 0))).getFirst();
    }

    private ResultCode put(MasterService s, String key) {
        PutStartResult r = start(s, key, false, "", 1);
        return r.code() == ResultCode.OK ? end(s, key, r.generation()) : r.code();
    }

    private boolean exists(MasterService s, String key) {
        return s.probes().exists(List.of(k(key)))[0];
    }

    @Test
    void putIsInvisibleUntilItsEnd() {
        join(svc, "a:1", 1 << 20);
        PutStartResult r = start(svc, "key-01", false, "", 1);
        assertThat(r.code()).isEqualTo(ResultCode.OK);
        assertThat(exists(svc, "key-01")).isFalse();
        assertThat(svc.getReplicaList(List.of(k("key-01"))).getFirst().code()).isEqualTo(ResultCode.NOT_FOUND);
        assertThat(end(svc, "key-01", r.generation())).isEqualTo(ResultCode.OK);
        ReplicaList rl = svc.getReplicaList(List.of(k("key-01"))).getFirst();
        assertThat(rl.code()).isEqualTo(ResultCode.OK);
        assertThat(rl.valueLength()).isEqualTo(VALUE);
        assertThat(rl.generation()).isEqualTo(r.generation());
        assertThat(rl.replicas()).hasSize(1);
        // a second PUT_END of the same generation is answered OK (idempotent retry)
        assertThat(end(svc, "key-01", r.generation())).isEqualTo(ResultCode.OK);
    }

    /**
     * Removals, resets and upserts are absolute: each publishes an invalidation covering what it
     * changed and returns only once every client holding a read lease acknowledged it (the clock
     * does not move here, so no lease can run out instead).
     */
    @Test
    void removalsResetsAndUpsertsWaitUntilEveryLeasedClientAppliedThem() throws Exception {
        join(svc, "a:1", 1 << 20);
        assertThat(put(svc, "key-01")).isEqualTo(ResultCode.OK);
        UUID client = UUID.randomUUID();
        LeaseReply at = svc.renewLease(new LeaseRequest(client, 0, 0, 0, false));
        assertThat(svc.leaseSessions()).isOne();

        List<Callable<?>> operations = List.of(
                () -> svc.remove(List.of(k("key-01"))),
                () -> svc.removeByPrefix(k("key-")),
                () -> {
                    PutStartResult r = start(svc, "key-02", true, "", 1);
                    return end(svc, "key-02", r.generation());
                },
                () -> svc.removeAll(true));
        List<LeaseMessages.Kind> kinds = List.of(LeaseMessages.Kind.KEYS, LeaseMessages.Kind.PREFIX,
                LeaseMessages.Kind.KEYS, LeaseMessages.Kind.ALL);
        ExecutorService ops = Executors.newSingleThreadExecutor();
        try {
            for (int i = 0; i < operations.size(); i++) {
                Future<?> op = ops.submit(operations.get(i));
                // the client renews until its renewal brings the invalidation (the clock does not move, so
                // a held renewal would wait for good: ask without a hold)
                LeaseReply r = svc.renewLease(new LeaseRequest(client, at.incarnation(), at.seq(), 0, false));
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (r.records().isEmpty()) {
                    assertThat(System.nanoTime()).as("operation %d published nothing within 30 s", i).isLessThan(deadline);
                    if (op.isDone()) {
                        op.get(); // one that threw fails the test here
                    }
                    Thread.sleep(1);
                    r = svc.renewLease(new LeaseRequest(client, at.incarnation(), at.seq(), 0, false));
                }
                assertThat(r.records()).singleElement().extracting(LeaseMessages.Invalidation::kind).isEqualTo(kinds.get(i));
                assertThat(op.isDone()).as("operation %d returned before the client applied it", i).isFalse();
                at = svc.renewLease(new LeaseRequest(client, r.incarnation(), r.seq(), 0, false)); // the acknowledgement
                op.get(30, TimeUnit.SECONDS);
            }
        } finally {
            ops.shutdownNow();
        }
        // a client that says it is closing holds nothing up
        svc.renewLease(new LeaseRequest(client, at.incarnation(), at.seq(), 0, true));
        assertThat(svc.leaseSessions()).isZero();
        assertThat(svc.remove(List.of(k("key-02")))).containsExactly(ResultCode.NOT_FOUND);
    }

    @Test
    void putOfPresentOrPendingKeyIsAlreadyExistsAndUpsertReplaces() {
        join(svc, "a:1", 1 << 20);
        PutStartResult pending = start(svc, "key-01", false, "", 1);
        assertThat(start(svc, "key-01", false, "", 1).code()).isEqualTo(ResultCode.ALREADY_EXISTS);
        assertThat(end(svc, "key-01", pending.generation())).isEqualTo(ResultCode.OK);
        assertThat(put(svc, "key-01")).isEqualTo(ResultCode.ALREADY_EXISTS);
        long used = svc.allocated();

        PutStartResult up = start(svc, "key-01", true, "", 1);
        assertThat(up.code()).isEqualTo(ResultCode.OK);
        // readers still see the old version until the upsert completes
        assertThat(svc.getReplicaList(List.of(k("key-01"))).getFirst().generation()).isEqualTo(pending.generation());
        assertThat(end(svc, "key-01", up.generation())).isEqualTo(ResultCode.OK);
        assertThat(svc.getReplicaList(List.of(k("key-01"))).getFirst().generation()).isEqualTo(up.generation());
        assertThat(svc.allocated()).as("old version's space is freed").isEqualTo(used);
        assertThat(svc.keyCount()).isEqualTo(1);
    }

    @Test
    void revokeAndAbandonedPutsGiveSpaceBack() {
        join(svc, "a:1", 1 << 20);
        PutStartResult r = start(svc, "key-01", false, "", 1);
        assertThat(svc.allocated()).isEqualTo(REGION);
        assertThat(svc.putRevoke(List.of(new PutEndItem(k("key-01"), r.generation(), 0)))).containsExactly(ResultCode.OK);
        assertThat(svc.allocated()).isZero();

        PutStartResult abandoned = start(svc, "key-02", false, "", 1);
        passTime(svc, MasterConfig.DEFAULT_PUT_TIMEOUT.minusSeconds(1));
        assertThat(svc.allocated()).as("not yet past the put timeout").isEqualTo(REGION);
        passTime(svc, Duration.ofSeconds(2));
        assertThat(svc.allocated()).isZero();
        assertThat(svc.expiredPuts.get()).isEqualTo(1);
        assertThat(end(svc, "key-02", abandoned.generation())).isEqualTo(ResultCode.EXPIRED);
        assertThat(exists(svc, "key-02")).isFalse();
        // and the key is free for a new writer
        assertThat(put(svc, "key-02")).isEqualTo(ResultCode.OK);
    }

    @Test
    void silentNodeIsDroppedAndItsObjectsBecomeMisses() {
        int a = join(svc, "a:1", 1 << 20);
        int b = join(svc, "b:1", 1 << 20);
        List<String> onA = new ArrayList<>();
        List<String> onB = new ArrayList<>();
        for (int i = 0; i < 40; i++) {
            String key = "key-" + (10 + i);
            assertThat(put(svc, key)).isEqualTo(ResultCode.OK);
            int seg = svc.getReplicaList(List.of(k(key))).getFirst().replicas().getFirst().segmentId();
            (seg == a ? onA : onB).add(key);
        }
        assertThat(onA).isNotEmpty();
        assertThat(onB).isNotEmpty();
        for (int s = 0; s < 9; s++) {
            clock.advance(Duration.ofSeconds(1));
            svc.membership().heartbeat(a, 1);
            svc.membership().heartbeat(b, 2);
            svc.tick();
        }
        // b goes silent past the TTL; a keeps beating
        for (int s = 0; s < 11; s++) {
            clock.advance(Duration.ofSeconds(1));
            svc.membership().heartbeat(a, 1);
            svc.tick();
        }
        assertThat(svc.segmentInfos()).extracting(x -> x.id()).containsExactly(a);
        for (String key : onB) {
            assertThat(exists(svc, key)).as(key).isFalse();
        }
        for (String key : onA) {
            assertThat(exists(svc, key)).as(key).isTrue();
        }
        assertThat(svc.membership().heartbeat(b, 2).code()).as("b must register again").isEqualTo(ResultCode.NOT_FOUND);
    }

    @Test
    void evictionFollowsReadsAndIgnoresProbes() {
        MasterService s = service(MasterConfig.defaults().withEviction(0.9, 0.25));
        join(s, "a:1", 40 * REGION);
        for (int i = 0; i < 40; i++) {
            assertThat(put(s, "key-" + (10 + i))).isEqualTo(ResultCode.OK);
        }
        clock.advance(Duration.ofSeconds(1));
        // read keys 10..29; only probe keys 30..49, many times
        for (int i = 0; i < 20; i++) {
            s.getReplicaList(List.of(k("key-" + (10 + i))));
        }
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 20; i < 40; i++) {
                s.probes().exists(List.of(k("key-" + (10 + i))));
                s.probes().prefixMatch(List.of(k("key-" + (10 + i))));
                s.probes().sizes(List.of(k("key-" + (10 + i))));
            }
        }
        clock.advance(Duration.ofSeconds(1));
        // the pool is full: this put must evict (a quarter of capacity), not fail
        assertThat(put(s, "key-99")).isEqualTo(ResultCode.OK);
        assertThat(s.eviction().evictedKeys.get()).isGreaterThanOrEqualTo(10);
        for (int i = 0; i < 20; i++) {
            assertThat(exists(s, "key-" + (10 + i))).as("read recently: kept").isTrue();
        }
        int probedSurvivors = 0;
        for (int i = 20; i < 40; i++) {
            probedSurvivors += exists(s, "key-" + (10 + i)) ? 1 : 0;
        }
        assertThat(probedSurvivors).as("probed-only objects are the ones evicted").isLessThanOrEqualTo(10);
    }

    @Test
    void highWatermarkStartsEvictionOnTick() {
        MasterService s = service(MasterConfig.defaults());
        join(s, "a:1", 100 * REGION);
        for (int i = 0; i < 95; i++) {
            assertThat(put(s, "k" + (10000 + i))).isEqualTo(ResultCode.OK);
        }
        assertThat(s.allocated()).isEqualTo(95 * REGION);
        s.tick();
        assertThat(s.allocated()).as("a round brings usage down to watermark - ratio").isLessThanOrEqualTo(85 * REGION);
        assertThat(s.allocated()).as("and not much further").isGreaterThanOrEqualTo(80 * REGION);
        assertThat(s.eviction().successes.get()).isEqualTo(1);
        s.tick();
        assertThat(s.eviction().attempts.get()).as("below the watermark now: no more rounds").isEqualTo(1);
    }

    @Test
    void poolFullOnlyWhenNothingIsEvictable() {
        join(svc, "a:1", 4 * REGION);
        List<PutStartResult> pending = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            pending.add(start(svc, "key-" + (10 + i), false, "", 1));
        }
        // all space is held by puts in flight, which are never evicted
        assertThat(start(svc, "key-99", false, "", 1).code()).isEqualTo(ResultCode.POOL_FULL);
        for (int i = 0; i < 4; i++) {
            assertThat(end(svc, "key-" + (10 + i), pending.get(i).generation())).isEqualTo(ResultCode.OK);
        }
        assertThat(put(svc, "key-99")).isEqualTo(ResultCode.OK);
        assertThat(start(new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(1), NodeNotifier.NONE),
                "key-01", false, "", 1).code()).as("no segment at all").isEqualTo(ResultCode.NO_SEGMENT);
    }

    @Test
    void removeAllForceFencesPutsInFlight() {
        join(svc, "a:1", 1 << 20);
        assertThat(put(svc, "key-01")).isEqualTo(ResultCode.OK);
        PutStartResult inFlight = start(svc, "key-02", false, "", 1);
        long epoch = svc.epoch();
        assertThat(svc.removeAll(true)).isEqualTo(1);
        assertThat(svc.epoch()).isEqualTo(epoch + 1);
        assertThat(end(svc, "key-02", inFlight.generation())).isEqualTo(ResultCode.FENCED);
        assertThat(exists(svc, "key-01")).isFalse();
        assertThat(exists(svc, "key-02")).isFalse();
        assertThat(svc.allocated()).isZero();
        // the fenced put's stale reservation neither blocks the key nor frees space twice
        assertThat(put(svc, "key-02")).isEqualTo(ResultCode.OK);
        assertThat(svc.allocated()).isEqualTo(REGION);
    }

    @Test
    void staleReservationExpiringAfterResetDoesNotFreeNewSpace() {
        join(svc, "a:1", 1 << 20);
        start(svc, "key-01", false, "", 1);
        svc.removeAll(true);
        assertThat(put(svc, "key-02")).isEqualTo(ResultCode.OK);
        passTime(svc, MasterConfig.DEFAULT_PUT_TIMEOUT.plusSeconds(1));
        assertThat(svc.allocated()).isEqualTo(REGION);
        assertThat(exists(svc, "key-02")).isTrue();
    }

    @Test
    void removeAllWithoutForceLetsPutsInFlightLand() {
        join(svc, "a:1", 1 << 20);
        assertThat(put(svc, "key-01")).isEqualTo(ResultCode.OK);
        PutStartResult inFlight = start(svc, "key-02", false, "", 1);
        assertThat(svc.removeAll(false)).isEqualTo(1);
        assertThat(end(svc, "key-02", inFlight.generation())).isEqualTo(ResultCode.OK);
        assertThat(exists(svc, "key-02")).isTrue();
        assertThat(svc.allocated()).isEqualTo(REGION);
    }

    @Test
    void removeAndRemoveByPrefix() {
        join(svc, "a:1", 1 << 20);
        for (String key : List.of("m1/a", "m1/b", "m2/a")) {
            PutStartReply r = svc.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k(key), VALUE))));
            svc.putEnd(List.of(new PutEndItem(k(key), r.results().getFirst().generation(), 0)));
        }
        assertThat(svc.remove(List.of(k("m2/a"), k("nope")))).containsExactly(ResultCode.OK, ResultCode.NOT_FOUND);
        assertThat(svc.removeByPrefix(k("m1/"))).isEqualTo(2);
        assertThat(svc.keyCount()).isZero();
        assertThat(svc.allocated()).isZero();
    }

    @Test
    void prefixMatchCountsLeadingPresentKeys() {
        join(svc, "a:1", 1 << 20);
        for (String key : List.of("blk-00", "blk-01", "blk-03")) {
            assertThat(put(svc, key)).isEqualTo(ResultCode.OK);
        }
        List<byte[]> chain = List.of(k("blk-00"), k("blk-01"), k("blk-02"), k("blk-03"));
        assertThat(svc.probes().prefixMatch(chain)).isEqualTo(2);
        assertThat(svc.probes().prefixMatch(List.of(k("blk-02"), k("blk-00")))).isZero();
        assertThat(svc.probes().prefixMatch(List.of())).isZero();
        // the same by digest
        DigestList d = DigestList.of(chain, 0, chain.size());
        assertThat(svc.probes().prefixMatchDigests(d.digests(), d.count())).isEqualTo(2);
        assertThat(svc.probes().existsDigests(d.digests(), d.count())).containsExactly(true, true, false, true);
        assertThat(svc.probes().prefixMatchDigests(new long[0], 0)).isZero();
    }

    @Test
    void preferredSegmentFirstThenSpread() {
        join(svc, "a:1", 1 << 20);
        join(svc, "b:1", 1 << 20);
        int c = join(svc, "c:1", 1 << 20);
        for (int i = 0; i < 20; i++) {
            PutStartResult r = start(svc, "key-" + (10 + i), false, "c:1", 1);
            assertThat(r.replicas().getFirst().segmentId()).isEqualTo(c);
        }
        // an unknown preferred segment is only a hint
        assertThat(start(svc, "key-99", false, "zz:1", 1).code()).isEqualTo(ResultCode.OK);
    }

    @Test
    void freshEmptyNodeDoesNotAttractEveryWrite() {
        int[] old = {join(svc, "a:1", 200 * REGION), join(svc, "b:1", 200 * REGION), join(svc, "c:1", 200 * REGION)};
        for (int i = 0; i < 300; i++) {
            assertThat(put(svc, "old-" + (1000 + i))).isEqualTo(ResultCode.OK);
        }
        int fresh = join(svc, "d:1", 200 * REGION);
        int onFresh = 0;
        int n = 200;
        for (int i = 0; i < n; i++) {
            PutStartResult r = start(svc, "new-" + (1000 + i), false, "", 1);
            onFresh += r.replicas().getFirst().segmentId() == fresh ? 1 : 0;
        }
        // the freer of two random candidates: the empty node wins only when drawn (about half the time)
        assertThat(onFresh).isGreaterThan(n / 5).isLessThan(n * 3 / 4);
        assertThat(old).hasSize(3);
    }

    @Test
    void replicasGoToDistinctSegmentsAndFailedOnesAreDropped() {
        join(svc, "a:1", 1 << 20);
        join(svc, "b:1", 1 << 20);
        join(svc, "c:1", 1 << 20);
        PutStartResult r = start(svc, "key-01", false, "", 3);
        assertThat(r.replicas()).extracting(x -> x.segmentId()).doesNotHaveDuplicates().hasSize(3);
        long failSecond = 1L << 1;
        assertThat(svc.putEnd(List.of(new PutEndItem(k("key-01"), r.generation(), failSecond))))
                .containsExactly(ResultCode.OK);
        ReplicaList rl = svc.getReplicaList(List.of(k("key-01"))).getFirst();
        assertThat(rl.replicas()).hasSize(2).doesNotContain(r.replicas().get(1));
        assertThat(svc.allocated()).isEqualTo(2 * REGION);
        // best effort: more replicas than segments gives as many as there are
        assertThat(start(svc, "key-02", false, "", 5).replicas()).hasSize(3);
    }

    @Test
    void restartedMasterRebuildsFromInventories() {
        MasterService fresh = service(MasterConfig.defaults());
        long epoch = 7;
        RegisterReply a = fresh.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 1, 1 << 20, epoch, 11, 3, "", ControlToken.random()));
        assertThat(a.keepInventory()).isTrue();
        assertThat(a.epoch()).as("a fresh master adopts the epoch nodes report").isEqualTo(epoch);
        assertThat(fresh.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k("new"), VALUE))))
                .results().getFirst().code()).as("joining segments take no puts").isEqualTo(ResultCode.NO_SEGMENT);
        List<ResultCode> codes = fresh.membership().inventory(new Inventory(a.segmentId(), 11, true, List.of(
                new InventoryItem(0, 500, epoch, k("key-01"), VALUE),
                new InventoryItem(REGION, 501, epoch, k("key-02"), VALUE),
                new InventoryItem(2 * REGION, 502, epoch - 1, k("key-03"), VALUE))));
        assertThat(codes).containsExactly(ResultCode.OK, ResultCode.OK, ResultCode.ALREADY_EXISTS);
        // a second node holding a replica of key-01 (same generation) and an older copy of key-02
        RegisterReply b = fresh.membership().registerNode(new RegisterNode("b:1", "10.0.0.2", 1, 1 << 20, epoch, 12, 2, "", ControlToken.random()));
        assertThat(fresh.membership().inventory(new Inventory(b.segmentId(), 12, true, List.of(
                new InventoryItem(0, 500, epoch, k("key-01"), VALUE),
                new InventoryItem(REGION, 480, epoch, k("key-02"), VALUE)))))
                .containsExactly(ResultCode.OK, ResultCode.ALREADY_EXISTS);
        assertThat(fresh.keyCount()).isEqualTo(2);
        assertThat(fresh.getReplicaList(List.of(k("key-01"))).getFirst().replicas()).hasSize(2);
        assertThat(fresh.getReplicaList(List.of(k("key-02"))).getFirst().generation()).isEqualTo(501);
        assertThat(fresh.allocated()).isEqualTo(3 * REGION);
        // new puts never reuse an adopted region
        PutStartResult p = start(fresh, "key-09", false, "a:1", 1);
        assertThat(p.replicas().getFirst().offset()).isGreaterThanOrEqualTo(2 * REGION);
        assertThat(p.generation()).isGreaterThan(501);
        // a node that missed a reset (older epoch) must drop its objects
        RegisterReply c = fresh.membership().registerNode(new RegisterNode("c:1", "10.0.0.3", 1, 1 << 20, epoch - 2, 13, 5, "", ControlToken.random()));
        assertThat(c.keepInventory()).isFalse();
        assertThat(c.epoch()).isEqualTo(epoch);
    }

    /**
     * A node that must come back empty (it missed frees the master could not keep, or the leader before owed it
     * frees) lists its inventory and has every item refused, so it drops them: told only to skip its inventory, a
     * node of the master's epoch kept them, and the next master to rebuild from the nodes took removed objects back.
     */
    @Test
    void aNodeThatMustComeBackEmptyListsItsObjectsAndHasEveryOneRefused() {
        RecordingNotifier recording = new RecordingNotifier() {
            @Override
            public boolean mustComeBackEmpty(String segmentName) {
                return segmentName.equals("owed:1");
            }
        };
        MasterService fresh = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), recording);
        RegisterReply owed = fresh.membership().registerNode(new RegisterNode("owed:1", "10.0.0.1", 1, 1 << 20, 0, 11, 2,
                "", ControlToken.random()));
        assertThat(owed.keepInventory()).as("it lists what it holds, to be told to drop it").isTrue();
        assertThat(fresh.membership().inventory(new Inventory(owed.segmentId(), 11, false, List.of(
                new InventoryItem(0, 500, 0, k("removed-maybe"), VALUE)))))
                .containsExactly(ResultCode.ALREADY_EXISTS);
        assertThat(fresh.membership().inventory(new Inventory(owed.segmentId(), 11, true, List.of(
                new InventoryItem(REGION, 501, 0, k("removed-too"), VALUE)))))
                .containsExactly(ResultCode.ALREADY_EXISTS);
        RegisterReply other = fresh.membership().registerNode(new RegisterNode("other:1", "10.0.0.2", 1, 1 << 20, 0, 12, 1,
                "", ControlToken.random()));
        assertThat(fresh.membership().inventory(new Inventory(other.segmentId(), 12, true, List.of(
                new InventoryItem(0, 502, 0, k("kept"), VALUE))))).containsExactly(ResultCode.OK);
        assertThat(fresh.keyCount()).isEqualTo(1);
        // once its inventory is in, the segment is an ordinary one: it takes puts
        assertThat(start(fresh, "new", false, "owed:1", 1).replicas().getFirst().segmentId()).isEqualTo(owed.segmentId());
    }

    @Test
    void rebuildKeepsTheNewestVersionOfAKey() {
        MasterService fresh = service(MasterConfig.defaults());
        RegisterReply a = fresh.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 1, 1 << 20, 0, 11, 1, "", ControlToken.random()));
        fresh.membership().inventory(new Inventory(a.segmentId(), 11, true, List.of(new InventoryItem(0, 600, 0, k("key-04"), VALUE))));
        RegisterReply b = fresh.membership().registerNode(new RegisterNode("b:1", "10.0.0.2", 1, 1 << 20, 0, 12, 1, "", ControlToken.random()));
        // an upsert wrote generation 700 on b; the free of 600 on a never arrived before the restart
        assertThat(fresh.membership().inventory(new Inventory(b.segmentId(), 12, true,
                List.of(new InventoryItem(0, 700, 0, k("key-04"), VALUE))))).containsExactly(ResultCode.OK);
        ReplicaList rl = fresh.getReplicaList(List.of(k("key-04"))).getFirst();
        assertThat(rl.generation()).isEqualTo(700);
        assertThat(rl.replicas()).extracting(r -> r.segmentId()).containsExactly(b.segmentId());
        assertThat(fresh.allocated()).as("the older copy's space is freed").isEqualTo(REGION);
    }

    @Test
    void nodeReportingNewerEpochVoidsWhatWasRebuilt() {
        MasterService fresh = service(MasterConfig.defaults());
        RegisterReply a = fresh.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 1, 1 << 20, 3, 11, 1, "", ControlToken.random()));
        fresh.membership().inventory(new Inventory(a.segmentId(), 11, true, List.of(new InventoryItem(0, 500, 3, k("key-01"), VALUE))));
        assertThat(fresh.keyCount()).isEqualTo(1);
        RegisterReply b = fresh.membership().registerNode(new RegisterNode("b:1", "10.0.0.2", 1, 1 << 20, 4, 12, 0, "", ControlToken.random()));
        assertThat(b.epoch()).isEqualTo(4);
        assertThat(fresh.keyCount()).as("objects from epoch 3 are stale once a node saw epoch 4").isZero();
        assertThat(fresh.allocated()).isZero();
    }

    @Test
    void reRegistrationReplacesTheOldSegment() {
        int a = join(svc, "a:1", 1 << 20);
        assertThat(put(svc, "key-01")).isEqualTo(ResultCode.OK);
        RegisterReply again = svc.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 1, 1 << 20, svc.epoch(), 99, 0, "", ControlToken.random()));
        assertThat(again.segmentId()).isNotEqualTo(a);
        assertThat(exists(svc, "key-01")).as("objects come back only through the inventory").isFalse();
        assertThat(svc.segmentInfos()).hasSize(1);
    }

    @Test
    void tooLargeValueIsAValue() {
        MasterService s = service(MasterConfig.defaults().withMaxValueSize(Size.ofKiB(1)));
        join(s, "a:1", 1 << 20);
        PutStartReply r = s.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k("big"), 2048))));
        assertThat(r.results().getFirst().code()).isEqualTo(ResultCode.TOO_LARGE);
        assertThat(s.allocated()).isZero();
    }

    /** A free as a recording notifier saw it. */
    record Freed(int segment, long generation, Tier tier, boolean spill) {
    }

    /** Records frees; delivers nothing. */
    static class RecordingNotifier implements NodeNotifier {
        final List<Freed> freed = new ArrayList<>();

        @Override
        public void free(Segment segment, long offset, long generation, Tier tier, boolean spill) {
            freed.add(new Freed(segment.id, generation, tier, spill));
        }

        @Override
        public void flush() {
        }

        @Override
        public void reset(java.util.Collection<Segment> segments, long epoch) {
        }

        @Override
        public void forget(Segment segment) {
        }

        @Override
        public void close() {
        }
    }

    /**
     * The spill protocol: an eviction from a node with a disk tier frees with the spill flag and the
     * object is listed as a disk replica on that node at once (never a miss on its way); the node's
     * report that it is durable (NODE_DISK_ADD) confirms it, repeated or not; a remove while the spill
     * is on its way frees the disk copy (the node drops the spill) and the late report is refused; a
     * report of a generation never spilled is refused; NODE_DISK_DROP takes a disk replica out, also one
     * still on its way (the node could not keep it); a spill never reported leaves the index at its
     * deadline.
     */
    @Test
    void spillsAreListedOnDiskFromTheirEvictionUntilRemovedDroppedOrNeverReported() {
        RecordingNotifier recording = new RecordingNotifier();
        List<Freed> freed = recording.freed;
        MasterService s = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), recording);
        long inc = ++incarnations;
        int seg = s.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 50052, 16 * REGION, 0, inc, 0, "", ControlToken.random())).segmentId();
        s.membership().inventory(new Inventory(seg, inc, true, List.of()));
        MasterMessages.TierStats disk = new MasterMessages.TierStats(0, 0, 0, 1L << 30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        assertThat(s.membership().heartbeat(seg, inc, disk).code()).isEqualTo(ResultCode.OK);

        java.util.Map<String, Long> generations = new java.util.HashMap<>();
        for (int i = 0; i < 24; i++) {
            String key = "key-%02d".formatted(i);
            PutStartResult r = start(s, key, false, "", 1);
            assertThat(r.code()).as(key).isEqualTo(ResultCode.OK);
            assertThat(end(s, key, r.generation())).isEqualTo(ResultCode.OK);
            generations.put(key, r.generation());
        }
        List<Freed> spills = freed.stream().filter(Freed::spill).toList();
        assertThat(spills).hasSizeGreaterThanOrEqualTo(8).allMatch(f -> f.segment() == seg && f.tier() == Tier.MEMORY);
        assertThat(freed).allMatch(Freed::spill); // nothing else was freed

        assertThat(generations.keySet()).allMatch(k -> exists(s, k)); // no miss on the way to disk
        List<String> evicted = generations.keySet().stream().filter(k -> onDisk(s, k, seg)).sorted().toList();
        assertThat(evicted).hasSameSizeAs(spills);
        String a = evicted.get(0);
        String b = evicted.get(1);
        String c = evicted.get(2);
        String d = evicted.get(3);
        java.util.function.Function<String, Inventory> report = key -> new Inventory(seg, inc, true,
                List.of(new InventoryItem(0, generations.get(key), s.epoch(), k(key), VALUE, Tier.DISK)));

        assertThat(s.membership().diskAdd(report.apply(a))).containsExactly(ResultCode.OK);
        ReplicaList rl = s.getReplicaList(List.of(k(a))).getFirst();
        assertThat(rl.code()).isEqualTo(ResultCode.OK);
        assertThat(rl.generation()).isEqualTo(generations.get(a));
        assertThat(rl.replicas()).singleElement().matches(r -> r.onDisk() && r.segmentId() == seg);
        assertThat(s.membership().diskAdd(report.apply(a))).as("a repeated report (its reply was lost): a no-op")
                .containsExactly(ResultCode.OK);
        assertThat(s.getReplicaList(List.of(k(a))).getFirst().replicas()).hasSize(1);

        freed.clear();
        assertThat(s.remove(List.of(k(b)))).containsExactly(ResultCode.OK); // removed while on its way to disk
        assertThat(freed).containsExactly(new Freed(seg, generations.get(b), Tier.DISK, false));
        assertThat(s.membership().diskAdd(report.apply(b))).containsExactly(ResultCode.EXPIRED);
        assertThat(exists(s, b)).isFalse();

        String live = generations.keySet().stream().filter(k -> exists(s, k) && !onDisk(s, k, seg)).findFirst().orElseThrow();
        assertThat(s.membership().diskAdd(report.apply(live))).as("never spilled").containsExactly(ResultCode.EXPIRED);
        assertThat(s.getReplicaList(List.of(k(live))).getFirst().replicas()).noneMatch(r -> r.onDisk());

        assertThat(s.membership().diskDrop(report.apply(a))).containsExactly(ResultCode.OK);
        assertThat(exists(s, a)).isFalse();
        assertThat(s.membership().diskDrop(report.apply(a))).containsExactly(ResultCode.NOT_FOUND);

        assertThat(s.membership().diskDrop(report.apply(c))).as("a spill the node could not keep")
                .containsExactly(ResultCode.OK);
        assertThat(exists(s, c)).isFalse();
        assertThat(s.membership().diskAdd(report.apply(c))).containsExactly(ResultCode.EXPIRED);

        // d is never reported: it stays listed until its deadline, then leaves; a late report is refused
        String e = evicted.get(4);
        assertThat(s.membership().diskAdd(report.apply(e))).containsExactly(ResultCode.OK);
        long waited = 0;
        while (waited <= SpillLedger.TIMEOUT_MILLIS) {
            assertThat(exists(s, d)).as("listed %d ms after its eviction", waited).isTrue();
            clock.advance(Duration.ofSeconds(5));
            waited += 5_000;
            s.membership().heartbeat(seg, inc, disk);
            s.tick();
        }
        assertThat(exists(s, d)).isFalse();
        assertThat(onDisk(s, e, seg)).as("reported durable: kept").isTrue();
        assertThat(s.membership().diskAdd(report.apply(d))).containsExactly(ResultCode.EXPIRED);
    }

    /** Whether the key is listed with a single copy, on segment {@code seg}'s SSD tier. */
    private static boolean onDisk(MasterService s, String key, int seg) {
        ReplicaList rl = s.getReplicaList(List.of(k(key))).getFirst();
        return rl.code() == ResultCode.OK && rl.replicas().size() == 1 && rl.replicas().getFirst().onDisk()
                && rl.replicas().getFirst().segmentId() == seg;
    }

    /**
     * A removal racing the node's report that the object landed on disk: whichever goes first, the
     * removal succeeds and the key is gone afterwards (the report must never re-adopt a copy the
     * removal already missed). Many rounds on two threads released together; passes whatever the
     * interleaving, fails only if some interleaving resurrects the key.
     */
    @Test
    void aRemovalRacingADiskReportNeverLeavesTheKeyBehind() throws Exception {
        java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newFixedThreadPool(2);
        try {
            for (int round = 0; round < 60; round++) {
                boolean byPrefix = round % 2 == 1;
                MasterService s = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(round),
                        new RecordingNotifier());
                long inc = ++incarnations;
                int seg = s.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 50052, 16 * REGION, 0, inc, 0, "", ControlToken.random()))
                        .segmentId();
                s.membership().inventory(new Inventory(seg, inc, true, List.of()));
                MasterMessages.TierStats disk = new MasterMessages.TierStats(0, 0, 0, 1L << 30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
                s.membership().heartbeat(seg, inc, disk);
                java.util.Map<String, Long> generations = new java.util.HashMap<>();
                for (int i = 0; i < 24; i++) {
                    String key = "key-%02d".formatted(i);
                    PutStartResult r = start(s, key, false, "", 1);
                    end(s, key, r.generation());
                    generations.put(key, r.generation());
                }
                List<String> spilling = generations.keySet().stream().filter(k -> onDisk(s, k, seg)).sorted().toList();
                assertThat(spilling).isNotEmpty();
                for (String key : spilling) {
                    java.util.concurrent.CyclicBarrier go = new java.util.concurrent.CyclicBarrier(2);
                    var report = pool.submit(() -> {
                        go.await();
                        return s.membership().diskAdd(new Inventory(seg, inc, true,
                                List.of(new InventoryItem(0, generations.get(key), s.epoch(), k(key), VALUE, Tier.DISK))));
                    });
                    var removal = pool.submit(() -> {
                        go.await();
                        return byPrefix ? s.removeByPrefix(k(key)) : (s.remove(List.of(k(key))).getFirst() == ResultCode.OK ? 1L : 0L);
                    });
                    report.get();
                    assertThat(removal.get()).as("round %d, %s: the removal found the object or its spill", round, key)
                            .isEqualTo(1L);
                    assertThat(exists(s, key)).as("round %d, %s: removed, and not adopted from disk after", round, key)
                            .isFalse();
                }
            }
        } finally {
            pool.shutdownNow();
        }
    }

    /** Without a disk tier, eviction frees without the spill flag and keeps nothing for later. */
    @Test
    void withoutADiskTierEvictionDoesNotSpill() {
        RecordingNotifier recording = new RecordingNotifier();
        MasterService s = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), recording);
        long inc = ++incarnations;
        int seg = s.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 50052, 16 * REGION, 0, inc, 0, "", ControlToken.random())).segmentId();
        s.membership().inventory(new Inventory(seg, inc, true, List.of()));
        for (int i = 0; i < 24; i++) {
            assertThat(put(s, "key-%02d".formatted(i))).isEqualTo(ResultCode.OK);
        }
        assertThat(recording.freed).isNotEmpty().noneMatch(Freed::spill);
    }
}

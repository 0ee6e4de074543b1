package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Masters elected through a real etcd, every role its own process: the leader killed under traffic,
 * a leader paused past its lease (split brain), and etcd itself going away. Every check waits for a
 * condition (a new leader, a successful call), never for a time.
 */
class FailoverIT {

    private static final Duration T = Duration.ofSeconds(10);
    private static final int OBJECTS = 2000;

    /** The value stored under {@code key}: 4 KiB derived from the key, so any wrong byte shows. */
    static byte[] valueOf(String key) {
        byte[] v = new byte[4096];
        long seed = key.hashCode() * 0x9E3779B97F4A7C15L;
        for (int i = 0; i < v.length; i++) {
            seed = seed * 6364136223846793005L + 1442695040888963407L;
            v[i] = (byte) (seed >>> 56);
        }
        return v;
    }

    private static void putOriginals(KvPoolClient c, String prefix, int n) {
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            keys.add(prefix + i);
            values.add(MemorySegment.ofArray(valueOf(prefix + i)));
        }
        assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
    }

    private static void awaitSegments(KvPoolClient c, int n) throws InterruptedException {
        ProcessCluster.awaitStats(c, s -> s.segments().size() == n && s.segments().stream().allMatch(x -> x.active()),
                n + " active segments");
    }

    @Test
    void killingTheLeaderUnderTrafficLosesNoObjectAndShowsNoWrongOrHalfWrittenValue() throws Exception {
        try (HaCluster ha = new HaCluster("failover-kill", 2)) {
            ha.startNode("64MiB");
            ha.startNode("64MiB");
            LeaderRecord first = ha.leader();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url))) {
                awaitSegments(c, 2);
                putOriginals(c, "orig/", OBJECTS);
                ha.awaitNodesListed(2);

                AtomicBoolean stop = new AtomicBoolean();
                AtomicLong wrong = new AtomicLong();
                AtomicLong okAfterKill = new AtomicLong();
                AtomicBoolean killed = new AtomicBoolean();
                ConcurrentLinkedQueue<String> attempted = new ConcurrentLinkedQueue<>();
                ConcurrentLinkedQueue<String> acknowledged = new ConcurrentLinkedQueue<>();
                List<Thread> traffic = new ArrayList<>();
                for (int t = 0; t < 2; t++) {
                    int id = t;
                    traffic.add(Thread.ofPlatform().start(() -> {
                        for (int i = 0; !stop.get(); i++) {
                            String orig = "orig/" + ((i * 7 + id) % OBJECTS);
                            String live = "live/" + id + "/" + i;
                            try {
                                Optional<byte[]> got = c.get(orig);
                                if (got.isPresent() && !Arrays.equals(got.get(), valueOf(orig))) {
                                    wrong.incrementAndGet();
                                }
                                attempted.add(live);
                                if (c.put(live, valueOf(live)) == PutStatus.OK) {
                                    acknowledged.add(live);
                                    if (killed.get() && got.isPresent()) {
                                        okAfterKill.incrementAndGet();
                                    }
                                }
                            } catch (RuntimeException e) {
                                // a call that spans the failover may fail; what it left behind is checked below
                            }
                        }
                    }));
                }
                Await.until("20 puts acknowledged", () -> acknowledged.size() >= 20);
                ha.master(first.id()).kill9();
                killed.set(true);
                LeaderRecord next = ha.awaitLeader(r -> r.ready() && r.term() > first.term(), "a new leader");
                assertThat(next.id()).isNotEqualTo(first.id());
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                while (okAfterKill.get() < 20 && System.nanoTime() < deadline) {
                    Thread.sleep(10);
                }
                stop.set(true);
                for (Thread t : traffic) {
                    t.join();
                }
                assertThat(okAfterKill.get()).as("gets and puts that succeeded through the new leader").isGreaterThanOrEqualTo(20);
                assertThat(wrong.get()).as("reads that returned wrong bytes").isZero();

                int readable = 0;
                for (int i = 0; i < OBJECTS; i++) {
                    Optional<byte[]> got = c.get("orig/" + i);
                    if (got.isPresent()) {
                        assertThat(got.get()).as("orig/%d", i).isEqualTo(valueOf("orig/" + i));
                        readable++;
                    }
                }
                assertThat(readable).as("objects stored before the failover and readable after it").isEqualTo(OBJECTS);
                for (String k : acknowledged) {
                    assertThat(c.get(k)).as("acknowledged put %s", k).hasValueSatisfying(
                            v -> assertThat(v).isEqualTo(valueOf(k)));
                }
                for (String k : attempted) {
                    // a put that failed across the failover is a miss or whole: never part of a value
                    c.get(k).ifPresent(v -> assertThat(v).as("put %s", k).isEqualTo(valueOf(k)));
                }
            }
        }
    }

    /**
     * The soak's finding, across a failover: keys removed while their node was down must not come
     * back when it restarts, adopts its segment and registers with the next leader, which never saw
     * the removals. The leader lists the segments it owes frees to in etcd; the next one has them
     * come back empty, and the node drops what it held, so a third leader rebuilding from it finds none.
     */
    @Test
    void keysRemovedWhileTheirNodeWasDownStayRemovedUnderTheNextLeader(@TempDir Path shm) throws Exception {
        // a long node TTL: the dead node stays registered, so the removals reach the index and their frees fail
        try (HaCluster ha = new HaCluster("failover-owed", 2, "--node-ttl", "60s")) {
            int port = ProcessCluster.freePort();
            ProcessCluster.Managed node = ha.startNode("64MiB", shm.toString(), port);
            LeaderRecord first = ha.leader();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url).withRequestTimeout(T))) {
                awaitSegments(c, 1);
                putOriginals(c, "gone/", 300);
                ha.awaitNodesListed(1);
                node.kill9();
                for (int i = 0; i < 300; i++) {
                    assertThat(c.remove("gone/" + i)).as("removal of gone/" + i).isTrue();
                }
                ha.awaitOwedListed();
                ha.master(first.id()).kill9();
                ha.awaitLeader(r -> r.ready() && r.term() > first.term(), "the next leader");
                ha.startNode("64MiB", shm.toString(), port);
                // the node adopts its segment and registers with the next leader, which has it come back empty
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().active(),
                        "the node back, active");
                for (int i = 0; i < 300; i++) {
                    assertThat(c.get("gone/" + i)).as("removed gone/" + i).isEmpty();
                }
                assertThat(c.stats().segments().getFirst().objects()).isZero();

                // coming back empty means the node dropped them, not only that this leader did not take them: the
                // leader after this one, which owes nothing, rebuilds from the node and must not find them there
                // (the node used to keep them, as a reset to its own epoch drops nothing, and the soak read them).
                // No put in between: a write lease's range set aside on the node would drop them anyway
                LeaderRecord second = ha.leader();
                ha.awaitOwedCleared();
                ha.startMaster(first.id(), "--node-ttl", "60s");
                ha.master(second.id()).kill9();
                ha.awaitLeader(r -> r.ready() && r.term() > second.term(), "the leader after the next");
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().active(),
                        "the node registered with the third leader, active");
                for (int i = 0; i < 300; i++) {
                    assertThat(c.get("gone/" + i).isPresent()).as("removed gone/" + i + " read under the third leader")
                            .isFalse();
                }
                assertThat(c.stats().segments().getFirst().objects()).as("what the node listed to the third leader")
                        .isZero();
                // and it serves again
                putOriginals(c, "after/", 50);
            }
        }
    }

    @Test
    void aLeaderPausedPastItsLeaseCannotPlaceRemoveOrResetAnything() throws Exception {
        try (HaCluster ha = new HaCluster("failover-split", 2)) {
            ProcessCluster.Managed node = ha.startNode("64MiB");
            LeaderRecord old = ha.leader();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url))) {
                awaitSegments(c, 1);
                putOriginals(c, "before/", 200);
                ha.awaitNodesListed(1);
                ha.master(old.id()).freeze();
                LeaderRecord next = ha.awaitLeader(r -> r.ready() && r.term() > old.term(), "a new leader");
                putOriginals(c, "after/", 100);
                ha.master(old.id()).thaw();

                // the deposed leader answers nothing: every request closes its connection (or it no longer listens)
                HostPort oldAddress = HostPort.parse(old.address());
                for (int attempt = 0; attempt < 3; attempt++) {
                    assertThatThrownBy(() -> {
                        try (FrameConnection fc = FrameConnection.connect(oldAddress, T, Limits.DEFAULT)) {
                            BodyWriter w = new BodyWriter();
                            new MasterMessages.Hello(MasterMessages.Role.CLIENT, UUID.randomUUID(), "it", 1).write(w);
                            fc.call(Opcode.HELLO, w, T);
                        }
                    }).as("a request to the deposed leader").isInstanceOf(IOException.class);
                }

                // and the node refuses what a master of the old term would send it
                HostPort nodeAddress = HostPort.parse(node.name);
                try (FrameConnection fc = FrameConnection.connect(nodeAddress, T, Limits.DEFAULT)) {
                    BodyWriter reset = new BodyWriter();
                    new NodeMessages.Reset(1L << 40, old.term(), ControlToken.random()).write(reset);
                    assertThatThrownBy(() -> fc.call(Opcode.NODE_RESET, reset, T)).isInstanceOf(RemoteException.class)
                            .hasMessageContaining("term " + old.term()).hasMessageContaining("refused");
                }
                try (FrameConnection fc = FrameConnection.connect(nodeAddress, T, Limits.DEFAULT)) {
                    byte[] value = valueOf("forged");
                    BodyWriter w = new BodyWriter();
                    new NodeMessages.Write(0, old.term(), List.of(new NodeMessages.WriteItem(0, 1, "forged".getBytes(
                            StandardCharsets.UTF_8), value.length, ObjectLayout.valueCrc(MemorySegment.ofArray(value)),
                            WriteGrant.none())))
                            .write(w);
                    List<ResultCode> codes = MasterMessages.Codes.read(fc.call(Opcode.NODE_WRITE, w, T,
                            ByteBuffer.wrap(value)).body()).codes();
                    assertThat(codes).containsExactly(ResultCode.DEPOSED);
                }
                for (int i = 0; i < 200; i++) {
                    assertThat(c.get("before/" + i)).hasValueSatisfying(v -> assertThat(v).isNotEmpty());
                }
                for (int i = 0; i < 100; i++) {
                    String k = "after/" + i;
                    assertThat(c.get(k)).hasValueSatisfying(v -> assertThat(v).isEqualTo(valueOf(k)));
                }
                assertThat(ha.leader().term()).isEqualTo(next.term());
            }
        }
    }

    @Test
    void whenEtcdGoesAwayTheLeaderStopsAtItsLeaseAndTheClusterServesAgainWhenItReturns() throws Exception {
        try (HaCluster ha = new HaCluster("failover-etcd", 2)) {
            ha.startNode("64MiB");
            LeaderRecord old = ha.leader();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url).withRequestTimeout(T))) {
                awaitSegments(c, 1);
                putOriginals(c, "kept/", 100);
                ha.awaitNodesListed(1);
                ha.etcd.stop();
                // the leader cannot renew its lease: it steps down and answers nothing more
                HostPort oldAddress = HostPort.parse(old.address());
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                boolean refused = false;
                while (!refused && System.nanoTime() < deadline) {
                    try (FrameConnection fc = FrameConnection.connect(oldAddress, T, Limits.DEFAULT)) {
                        BodyWriter w = new BodyWriter();
                        new MasterMessages.Hello(MasterMessages.Role.CLIENT, UUID.randomUUID(), "it", 1).write(w);
                        fc.call(Opcode.HELLO, w, T);
                        Thread.sleep(100);
                    } catch (IOException e) {
                        refused = true;
                    }
                }
                assertThat(refused).as("the leader stopped serving once etcd was gone past its lease").isTrue();

                ha.etcd.start();
                ha.awaitLeader(r -> r.ready() && r.term() > old.term(), "a leader after etcd returned");
                for (int i = 0; i < 100; i++) {
                    String k = "kept/" + i;
                    Optional<byte[]> got = retry(() -> c.get(k));
                    assertThat(got).as(k).hasValueSatisfying(v -> assertThat(v).isEqualTo(valueOf(k)));
                }
                assertThat(retry(() -> c.put("new-after-etcd", valueOf("new-after-etcd")))).isEqualTo(PutStatus.OK);
            }
        }
    }

    /** Runs {@code call} until it does not throw (a client reattaching to a new leader), up to 60 s. */
    private static <V> V retry(Supplier<V> call) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (true) {
            try {
                return call.get();
            } catch (RuntimeException e) {
                if (System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
    }
}

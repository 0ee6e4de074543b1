package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * removeAll(force) must fence puts in flight: a put that started before it can never become visible
 * after it. The first tests drive the put protocol frame by frame so the reset lands at each point
 * of a put; the last races whole puts against resets.
 */
class FencingIT {

    private static final Duration T = Duration.ofSeconds(10);
    private static InProcessCluster cluster;
    private static KvPoolClient client;

    @BeforeAll
    static void start() throws Exception {
        cluster = new InProcessCluster(1, Size.ofMiB(256));
        client = cluster.client();
    }

    @AfterAll
    static void stop() {
        client.close();
        cluster.close();
    }

    private record Started(long epoch, long generation, Replica replica, HostPort node) {
    }

    private Started putStart(FrameConnection master, byte[] key, long len) throws Exception {
        BodyWriter w = new BodyWriter();
        new MasterMessages.PutStart(false, 1, "", List.of(new MasterMessages.PutStartItem(key, len))).write(w);
        MasterMessages.PutStartReply r = MasterMessages.PutStartReply.read(master.call(Opcode.PUT_START, w, T).body());
        MasterMessages.PutStartResult res = r.results().getFirst();
        assertThat(res.code()).isEqualTo(ResultCode.OK);
        Replica rep = res.replicas().getFirst();
        PoolStats.SegmentStats seg = client.stats().segments().stream().filter(s -> s.id() == rep.segmentId())
                .findFirst().orElseThrow();
        return new Started(r.epoch(), res.generation(), rep, new HostPort(seg.host(), seg.port()));
    }

    private ResultCode nodeWrite(Started s, byte[] key, byte[] value) throws Exception {
        try (FrameConnection node = FrameConnection.connect(s.node, T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new NodeMessages.Write(s.epoch, 0, List.of(new NodeMessages.WriteItem(s.replica.offset(), s.generation, key,
                    value.length, ObjectLayout.valueCrc(MemorySegment.ofArray(value)), WriteGrant.none()))).write(w);
            return MasterMessages.Codes.read(node.call(Opcode.NODE_WRITE, w, T, ByteBuffer.wrap(value)).body())
                    .codes().getFirst();
        }
    }

    private ResultCode putEnd(FrameConnection master, byte[] key, long generation) throws Exception {
        BodyWriter w = new BodyWriter();
        new MasterMessages.PutEnd(List.of(new MasterMessages.PutEndItem(key, generation, 0))).write(w);
        return MasterMessages.Codes.read(master.call(Opcode.PUT_END, w, T).body()).codes().getFirst();
    }

    @Test
    void resetBetweenReserveAndWrite() throws Exception {
        byte[] key = "fence/a".getBytes(StandardCharsets.UTF_8);
        byte[] value = Payloads.make("fence/a", 1, 5000);
        try (FrameConnection master = FrameConnection.connect(HostPort.parse(cluster.masterAddress()), T, Limits.DEFAULT)) {
            Started s = putStart(master, key, value.length);
            client.removeAll(true);
            assertThat(nodeWrite(s, key, value)).as("the node already refuses the old epoch").isEqualTo(ResultCode.FENCED);
            assertThat(putEnd(master, key, s.generation)).isEqualTo(ResultCode.FENCED);
        }
        assertThat(client.exists("fence/a")).isFalse();
        assertThat(client.get("fence/a")).isEmpty();
    }

    @Test
    void resetBetweenWriteAndComplete() throws Exception {
        byte[] key = "fence/b".getBytes(StandardCharsets.UTF_8);
        byte[] value = Payloads.make("fence/b", 1, 5000);
        try (FrameConnection master = FrameConnection.connect(HostPort.parse(cluster.masterAddress()), T, Limits.DEFAULT)) {
            Started s = putStart(master, key, value.length);
            assertThat(nodeWrite(s, key, value)).isEqualTo(ResultCode.OK);
            client.removeAll(true);
            assertThat(putEnd(master, key, s.generation)).isEqualTo(ResultCode.FENCED);
        }
        assertThat(client.exists("fence/b")).isFalse();
        assertThat(client.get("fence/b")).isEmpty();
        // the key is free in the new epoch
        assertThat(client.put("fence/b", value)).isEqualTo(PutStatus.OK);
        assertThat(client.get("fence/b")).hasValueSatisfying(b -> assertThat(b).isEqualTo(value));
    }

    /**
     * A writer keeps a write lease between puts (on the same machine, with its range set aside on the
     * node). A removeAll(force) by another client must retire it before it returns: the writer's next
     * put gets a lease of the new epoch, and a put by anyone into the space the reset freed does not
     * wait for the idle writer's range. The node here waits only 100 ms for a busy range, and the
     * writer's ping loop (which also releases idle leases) is slowed to minutes, so a range left set
     * aside would fail that put rather than be rescued.
     */
    @Test
    void aResetByOneClientRetiresTheWriteLeasesOfAnother() throws Exception {
        try (InProcessCluster own = new InProcessCluster(1, Size.ofMiB(64), m -> m,
                n -> n.withRegionWait(Duration.ofMillis(100)));
             KvPoolClient writer = own.client(c -> c.withPingInterval(Duration.ofMinutes(10)));
             KvPoolClient trainer = own.client()) {
            byte[] value = Payloads.make("lease/a", 1, 5000);
            assertThat(writer.put("lease/a", value)).isEqualTo(PutStatus.OK);
            // the writer now keeps a lease with room for many more puts, granted in this epoch
            trainer.removeAll(true);
            assertThat(writer.exists("lease/a")).isFalse();
            // the reset freed the writer's range at the master, which places the next lease there
            assertThat(trainer.put("lease/t", value)).isEqualTo(PutStatus.OK);
            // removeAll returned: the writer's next put goes under a lease of the new epoch, not FENCED
            assertThat(writer.put("lease/b", value)).isEqualTo(PutStatus.OK);
            assertThat(trainer.get("lease/b")).hasValueSatisfying(b -> assertThat(b).isEqualTo(value));
            assertThat(writer.put("lease/a", value)).isEqualTo(PutStatus.OK);
        }
    }

    @Test
    void resetsRacingWholePuts() throws Exception {
        AtomicLong clock = new AtomicLong();
        // a reset's [start, end] stamps; a put's [start, end] stamps and its status
        List<long[]> resets = new ArrayList<>();
        Map<String, long[]> puts = new ConcurrentHashMap<>();
        ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();
        AtomicBoolean done = new AtomicBoolean();
        List<Thread> writers = new ArrayList<>();
        for (int w = 0; w < 3; w++) {
            int id = w;
            writers.add(Thread.ofPlatform().start(() -> {
                try (KvPoolClient c = cluster.client()) {
                    for (int i = 0; !done.get() || i < 50; i++) {
                        String key = "race/" + id + "/" + i;
                        long s = clock.incrementAndGet();
                        PutStatus st = c.put(key, Payloads.make(key, 1, 20_000));
                        long e = clock.incrementAndGet();
                        puts.put(key, new long[]{s, e, st.ordinal()});
                        if (st != PutStatus.OK && st != PutStatus.FENCED) {
                            errors.add(key + ": " + st);
                        }
                    }
                } catch (RuntimeException e) {
                    errors.add("writer " + id + ": " + e);
                }
            }));
        }
        try (KvPoolClient c = cluster.client()) {
            for (int r = 0; r < 15; r++) {
                Thread.onSpinWait();
                long s = clock.incrementAndGet();
                c.removeAll(true);
                long e = clock.incrementAndGet();
                resets.add(new long[]{s, e});
                // let some puts complete between resets
                long target = clock.get() + 40;
                while (clock.get() < target && errors.isEmpty()) {
                    Thread.onSpinWait();
                }
            }
        }
        done.set(true);
        for (Thread t : writers) {
            t.join();
        }
        assertThat(errors).isEmpty();
        long lastResetEnd = resets.getLast()[1];
        int mustBeGone = 0;
        int mustBePresent = 0;
        int fenced = 0;
        int clear = 0;
        for (Map.Entry<String, long[]> e : puts.entrySet()) {
            long[] q = e.getValue();
            boolean overlapsAReset = false;
            for (long[] r : resets) {
                overlapsAReset |= r[0] < q[1] && q[0] < r[1];
            }
            if (!overlapsAReset) {
                // began after a reset returned and ended before the next began: a write lease granted
                // before that reset must not have been used for it
                clear++;
                assertThat(PutStatus.values()[(int) q[2]]).as(e.getKey() + " overlapped no reset").isEqualTo(PutStatus.OK);
            }
        }
        assertThat(clear).as("some puts overlapped no reset").isPositive();
        for (Map.Entry<String, long[]> e : puts.entrySet()) {
            long[] p = e.getValue();
            boolean ok = p[2] == PutStatus.OK.ordinal();
            fenced += p[2] == PutStatus.FENCED.ordinal() ? 1 : 0;
            boolean present = client.exists(e.getKey());
            boolean completedBeforeSomeReset = false;
            for (long[] r : resets) {
                completedBeforeSomeReset |= p[1] < r[0];
            }
            if (completedBeforeSomeReset || !ok) {
                mustBeGone++;
                assertThat(present).as(e.getKey() + " finished before a reset began, or was not stored").isFalse();
            } else if (p[0] > lastResetEnd) {
                mustBePresent++;
                assertThat(present).as(e.getKey() + " was stored after the last reset").isTrue();
            }
        }
        assertThat(mustBeGone).as("some puts were reset away").isPositive();
        assertThat(mustBePresent).as("some puts came after the last reset").isPositive();
        // only a put that straddled a reset may be FENCED (zero is fine: none may have straddled one)
        assertThat(fenced).as("FENCED puts, of %d that overlapped a reset", puts.size() - clear)
                .isLessThanOrEqualTo(puts.size() - clear);
    }
}

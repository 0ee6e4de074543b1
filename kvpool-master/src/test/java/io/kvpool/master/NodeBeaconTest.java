package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Heartbeat;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.Ping;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.MasterMessages.TierStats;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.UUID;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * NODE_BEACON through a master's port (protocol section 4.42): handled as a heartbeat, answered only with news,
 * and the answers come back in order before the reply to a later request. The master serves these connections in
 * its frame loop, so this is the loop's path too.
 */
@Timeout(60)
class NodeBeaconTest {

    private static final Duration T = Duration.ofSeconds(10);
    private static final long INCARNATION = 42;

    @Test
    void aBeaconIsHandledAsAHeartbeatAndAnsweredOnlyWithNews() throws Exception {
        MasterConfig cfg = MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withNodeTtl(Duration.ofHours(1))
                .withSummaryInterval(Duration.ZERO);
        try (MasterServer m = new MasterServer(cfg);
             FrameConnection c = FrameConnection.connect(new HostPort("127.0.0.1", m.port()), T, cfg.limits())) {
            MasterService svc = m.service();
            RegisterReply r = svc.membership().registerNode(new RegisterNode("n1:1", "127.0.0.1", 1, 1L << 30,
                    svc.epoch(), INCARNATION, 0, "", ControlToken.random(), ControlToken.NONE));
            svc.membership().inventory(new Inventory(r.segmentId(), INCARNATION, true, List.of()));
            int seg = r.segmentId();
            long epoch = svc.epoch();
            long term = cfg.term();

            // nothing new: no answer at all, and the beacons still count as the node's heartbeats (its statistics)
            for (int i = 1; i <= 3; i++) {
                c.notify(Opcode.NODE_BEACON, beacon(seg, INCARNATION, epoch, term, 1000L * i), T);
            }
            ping(c);
            assertThat(c.notices(T)).as("beacons with nothing new are not answered").isEmpty();
            assertThat(segment(svc, seg).tiers().diskCapacity()).isEqualTo(3000);

            // news: a node following another term, then a registration the master does not know
            c.notify(Opcode.NODE_BEACON, beacon(seg, INCARNATION, epoch, term + 7, 4000), T);
            c.notify(Opcode.NODE_BEACON, beacon(seg, INCARNATION, epoch, term, 5000), T);
            c.notify(Opcode.NODE_BEACON, beacon(seg, INCARNATION + 1, epoch, term, 6000), T);
            ping(c); // its reply comes after the answers, which the connection set aside in order
            List<FrameConnection.Reply> news = c.notices(T);
            assertThat(news).hasSize(2);
            assertThat(news.get(0).header().opcode()).isEqualTo(Opcode.NODE_BEACON.code);
            assertThat(HeartbeatReply.read(news.get(0).body())).isEqualTo(new HeartbeatReply(ResultCode.OK, epoch, term));
            assertThat(HeartbeatReply.read(news.get(1).body()).code()).isEqualTo(ResultCode.NOT_FOUND);
            assertThat(c.notices(T)).as("each answer is handed over once").isEmpty();
            assertThat(segment(svc, seg).tiers().diskCapacity()).as("the unknown registration's beacon changed nothing")
                    .isEqualTo(5000);

            // a full heartbeat is answered as always
            HeartbeatReply full = HeartbeatReply.read(c.call(Opcode.NODE_HEARTBEAT,
                    beacon(seg, INCARNATION, epoch, term, 7000), T).body());
            assertThat(full).isEqualTo(new HeartbeatReply(ResultCode.OK, epoch, term));
            assertThat(c.isBroken()).isFalse();
        }
    }

    @Test
    void newsIsWhatANodeActsOn() {
        Heartbeat hb = new Heartbeat(1, 2, 5, 0, TierStats.NONE, 3);
        assertThat(new HeartbeatReply(ResultCode.OK, 5, 3).newsFor(hb)).isFalse();
        assertThat(new HeartbeatReply(ResultCode.OK, 4, 3).newsFor(hb)).as("an older epoch: the node ignores it").isFalse();
        assertThat(new HeartbeatReply(ResultCode.OK, 6, 3).newsFor(hb)).as("a reset the node missed").isTrue();
        assertThat(new HeartbeatReply(ResultCode.OK, 5, 4).newsFor(hb)).as("a newer term").isTrue();
        assertThat(new HeartbeatReply(ResultCode.OK, 5, 2).newsFor(hb)).as("an older term").isTrue();
        assertThat(new HeartbeatReply(ResultCode.NOT_FOUND, 5, 3).newsFor(hb)).isTrue();
    }

    private static BodyWriter beacon(int seg, long incarnation, long epoch, long term, long diskCapacity) {
        BodyWriter w = new BodyWriter(152);
        new Heartbeat(seg, incarnation, epoch, 0, new TierStats(0, 0, 0, diskCapacity, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                term).write(w);
        return w;
    }

    private static void ping(FrameConnection c) throws IOException {
        BodyWriter w = new BodyWriter(16);
        new Ping(new UUID(1, 2)).write(w);
        c.call(Opcode.PING, w, T);
    }

    private static SegmentInfo segment(MasterService svc, int id) {
        return svc.stats().segments().stream().filter(s -> s.id() == id).findFirst().orElseThrow();
    }
}

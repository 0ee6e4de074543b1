package io.kvpool.it;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.MasterMessages.Heartbeat;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.HelloReply;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A real node's link to its master, heartbeating with NODE_BEACON between full NODE_HEARTBEATs (protocol section
 * 4.42), against a master scripted here on the real protocol, so that the news can come from a beacon's answer
 * alone: the scripted master's full heartbeats never carry it. No assertion depends on timing; the waits are for
 * conditions that must come, under the class's timeout.
 */
@Timeout(120)
class NodeBeaconIT {

    private static final long EPOCH = 3;
    private static final Duration INTERVAL = Duration.ofMillis(20);

    /** What the scripted master received, in order: opcodes. */
    private final List<Opcode> received = new CopyOnWriteArrayList<>();
    private final AtomicInteger registrations = new AtomicInteger();
    /** What a beacon is answered with: null, nothing. */
    private volatile HeartbeatReply beaconAnswer;
    /** Set: the last beacon before a full heartbeat is answered NOT_FOUND, late; the master forgets the node then. */
    private volatile boolean lateNotFound;
    /** The master forgot the node: full heartbeats are answered NOT_FOUND until it registers again. */
    private volatile boolean forgotten;
    /** Beacons since the last full heartbeat (the scripted master serves one connection at a time). */
    private int sinceFull;
    private FrameServer master;
    private StorageNode node;

    private void handle(Request req) throws IOException {
        Opcode op = req.opcode();
        received.add(op);
        BodyWriter out = new BodyWriter();
        switch (op) {
            case HELLO -> new HelloReply(1, EPOCH, 512, 1 << 30, 1, 0).write(out);
            case REGISTER_NODE -> {
                forgotten = false;
                registrations.incrementAndGet();
                new RegisterReply(7, EPOCH, false, 0).write(out);
            }
            case NODE_INVENTORY -> new Codes(List.of()).write(out);
            case NODE_HEARTBEAT -> {
                Heartbeat.read(req.body());
                sinceFull = 0;
                // never news, whatever a beacon answers, unless the master forgot the node
                new HeartbeatReply(forgotten ? ResultCode.NOT_FOUND : ResultCode.OK, EPOCH, 0).write(out);
            }
            case NODE_BEACON -> {
                Heartbeat.read(req.body());
                if (++sinceFull == 4 && lateNotFound) {
                    // answered after the node's next heartbeat, a full one, was sent: it reads this answer while
                    // it waits for that heartbeat's reply
                    lateNotFound = false;
                    sleepQuietly(INTERVAL.multipliedBy(5));
                    forgotten = true;
                    new HeartbeatReply(ResultCode.NOT_FOUND, EPOCH, 0).write(out);
                    req.reply(out);
                    return;
                }
                HeartbeatReply a = beaconAnswer;
                if (a == null) {
                    req.answerNothing();
                    return;
                }
                a.write(out);
            }
            default -> throw new IllegalStateException("the scripted master does not serve " + op.metricName);
        }
        req.reply(out);
    }

    @BeforeEach
    void start() throws Exception {
        master = new FrameServer("scripted-master", new InetSocketAddress("127.0.0.1", 0), Limits.DEFAULT,
                Duration.ofSeconds(30), op -> !op.isNodeOp(), this::handle);
        node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", master.port()), Size.ofMiB(8))
                .withListen("127.0.0.1", 0).withHeartbeatInterval(INTERVAL));
        assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
    }

    @AfterEach
    void stop() throws IOException {
        if (node != null) {
            node.close();
        }
        master.close();
    }

    @Test
    void oneHeartbeatInFiveIsAFullOneAndBeaconsFillTheRest() throws Exception {
        await(() -> heartbeatsAndBeacons().size() >= 16);
        List<Opcode> seq = heartbeatsAndBeacons();
        int first = seq.indexOf(Opcode.NODE_HEARTBEAT);
        assertThat(first).as("the first heartbeat on the connection is a full one").isZero();
        List<Opcode> want = new ArrayList<>();
        for (int i = 0; i < 15; i++) {
            want.add(i % 5 == 0 ? Opcode.NODE_HEARTBEAT : Opcode.NODE_BEACON);
        }
        assertThat(seq.subList(0, 15)).isEqualTo(want);
        assertThat(registrations.get()).isEqualTo(1);
    }

    @Test
    void aResetTheNodeMissedReachesItInABeaconsAnswer() throws Exception {
        await(() -> heartbeatsAndBeacons().contains(Opcode.NODE_BEACON));
        assertThat(node.epoch()).isEqualTo(EPOCH);
        beaconAnswer = new HeartbeatReply(ResultCode.OK, EPOCH + 5, 0);
        await(() -> node.epoch() == EPOCH + 5); // the full heartbeats still say EPOCH, which the node has passed
        assertThat(registrations.get()).isEqualTo(1);
    }

    @Test
    void aBeaconAnsweredNotFoundMakesTheNodeRegisterAgain() throws Exception {
        await(() -> heartbeatsAndBeacons().contains(Opcode.NODE_BEACON));
        beaconAnswer = new HeartbeatReply(ResultCode.NOT_FOUND, EPOCH, 0);
        await(() -> registrations.get() >= 2);
        beaconAnswer = null;
        int at = received.lastIndexOf(Opcode.REGISTER_NODE);
        await(() -> received.size() > at + 3);
        assertThat(received.subList(at + 1, received.size()).stream()
                .filter(o -> o == Opcode.NODE_HEARTBEAT || o == Opcode.NODE_BEACON).findFirst())
                .as("after a registration the first heartbeat is a full one").contains(Opcode.NODE_HEARTBEAT);
    }

    @Test
    void anAnswerOlderThanAHeartbeatsReplyIsNotActedOnAfterIt() throws Exception {
        await(() -> heartbeatsAndBeacons().contains(Opcode.NODE_BEACON));
        lateNotFound = true;
        await(() -> registrations.get() >= 2);
        int at = received.lastIndexOf(Opcode.REGISTER_NODE);
        await(() -> received.subList(at, received.size()).stream()
                .filter(o -> o == Opcode.NODE_HEARTBEAT || o == Opcode.NODE_BEACON).count() >= 10);
        // the late NOT_FOUND came before the full heartbeat's own NOT_FOUND, which the node registered again for;
        // acting on the older answer afterwards would have registered it a third time
        assertThat(registrations.get()).isEqualTo(2);
        assertThat(node.isRegistered()).isTrue();
    }

    private static void sleepQuietly(Duration d) {
        try {
            Thread.sleep(d);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private List<Opcode> heartbeatsAndBeacons() {
        return received.stream().filter(o -> o == Opcode.NODE_HEARTBEAT || o == Opcode.NODE_BEACON).toList();
    }

    private static void await(BooleanSupplier condition) throws InterruptedException {
        while (!condition.getAsBoolean()) {
            Thread.sleep(5);
        }
    }
}

package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameHeader;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Malformed, oversized and unknown frames sent straight at the real master and node: each gets an
 * error reply naming the problem, that connection is closed, everyone else keeps being served, and
 * no stored data is lost.
 */
class BadFramesIT {

    private static InProcessCluster cluster;
    private static KvPoolClient client;
    private static final byte[] KEPT = Payloads.make("kept", 1, 100_000);

    @BeforeAll
    static void start() throws Exception {
        cluster = new InProcessCluster(1, Size.ofMiB(16));
        client = cluster.client();
        assertThat(client.put("kept", KEPT)).isEqualTo(PutStatus.OK);
    }

    @AfterAll
    static void stop() {
        assertThat(client.get("kept")).hasValueSatisfying(b -> assertThat(b).isEqualTo(KEPT));
        client.close();
        cluster.close();
    }

    private static HostPort master() {
        return HostPort.parse(cluster.masterAddress());
    }

    private static HostPort node() {
        PoolStats.SegmentStats s = client.stats().segments().getFirst();
        return new HostPort(s.host(), s.port());
    }

    /** The error reply's status and message; asserts the server then closes the connection. */
    private record ErrorReply(int status, String message) {
    }

    private static ErrorReply sendRaw(HostPort to, ByteBuffer... frames) throws IOException {
        try (SocketChannel ch = SocketChannel.open(to.toSocketAddress())) {
            for (ByteBuffer f : frames) {
                while (f.hasRemaining()) {
                    ch.write(f);
                }
            }
            ByteBuffer h = ByteBuffer.allocate(FrameHeader.LENGTH).order(ByteOrder.LITTLE_ENDIAN);
            while (h.hasRemaining()) {
                assertThat(ch.read(h)).as("an error reply before the close").isNotNegative();
            }
            int status = h.getShort(FrameHeader.STATUS_OFFSET) & 0xFFFF;
            int bodyLen = h.getInt(FrameHeader.BODY_LENGTH_OFFSET);
            ByteBuffer body = ByteBuffer.allocate(bodyLen).order(ByteOrder.LITTLE_ENDIAN);
            while (body.hasRemaining()) {
                assertThat(ch.read(body)).isNotNegative();
            }
            body.flip();
            byte[] msg = new byte[body.getShort() & 0xFFFF];
            body.get(msg);
            assertThat(h.get(FrameHeader.FLAGS_OFFSET) & FrameHeader.FLAG_REPLY).isEqualTo(FrameHeader.FLAG_REPLY);
            ErrorReply r = new ErrorReply(status, new String(msg, StandardCharsets.UTF_8));
            ByteBuffer more = ByteBuffer.allocate(1);
            assertThat(ch.read(more)).as("connection closed after " + r).isEqualTo(-1);
            return r;
        }
    }

    private static ByteBuffer frame(int opcode, BodyWriter body, long payloadLength) {
        ByteBuffer b = body.buffer();
        ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), opcode, false, 0, 1, b.remaining(), payloadLength);
        ByteBuffer all = ByteBuffer.allocate(h.remaining() + b.remaining());
        all.put(h).put(b).flip();
        return all;
    }

    @Test
    void garbageIsRejectedAndTheServerKeepsServing() throws Exception {
        for (HostPort target : new HostPort[]{master(), node()}) {
            ErrorReply r = sendRaw(target, ByteBuffer.wrap("GET / HTTP/1.1\r\nHost: x\r\n\r\n.....".getBytes()));
            assertThat(r.status()).isEqualTo(FrameStatus.MALFORMED_FRAME.code);
            assertThat(r.message()).contains("magic");
        }
        assertThat(client.put("after-garbage", new byte[10])).isEqualTo(PutStatus.OK);
        assertThat(client.get("kept")).isPresent();
    }

    @Test
    void unknownAndMisdirectedOpcodes() throws Exception {
        ErrorReply r = sendRaw(master(), frame(0x7E, new BodyWriter(), 0));
        assertThat(r.status()).isEqualTo(FrameStatus.UNKNOWN_OPCODE.code);
        assertThat(r.message()).contains("0x7e");
        // a master operation sent to a node
        r = sendRaw(node(), frame(Opcode.PUT_START.code, new BodyWriter(), 0));
        assertThat(r.status()).isEqualTo(FrameStatus.UNKNOWN_OPCODE.code);
        // a node operation sent to the master
        r = sendRaw(master(), frame(Opcode.NODE_READ.code, new BodyWriter().i32(0), 0));
        assertThat(r.status()).isEqualTo(FrameStatus.UNKNOWN_OPCODE.code);
    }

    @Test
    void oversizedFramesAreRefusedBeforeAnythingIsAllocated() throws Exception {
        ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), Opcode.EXIST_KEY.code, false, 0, 9, Integer.MAX_VALUE, 0);
        ErrorReply r = sendRaw(master(), h);
        assertThat(r.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(r.message()).contains("body length");
        h = FrameHeader.write(FrameHeader.allocate(), Opcode.NODE_WRITE.code, false, 0, 9, 16, Long.MAX_VALUE);
        r = sendRaw(node(), h);
        assertThat(r.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(r.message()).contains("payload length");
    }

    @Test
    void malformedBodiesAreNamed() throws Exception {
        // a count larger than the body could hold
        ErrorReply r = sendRaw(master(), frame(Opcode.BATCH_EXIST_KEY.code, new BodyWriter().i32(1_000_000), 0));
        assertThat(r.status()).isEqualTo(FrameStatus.MALFORMED_FRAME.code);
        assertThat(r.message()).contains("key count");
        // payload sent to the master
        ByteBuffer f = frame(Opcode.PING.code, new BodyWriter().i64(1).i64(2), 8);
        r = sendRaw(master(), f, ByteBuffer.wrap(new byte[8]));
        assertThat(r.status()).isEqualTo(FrameStatus.MALFORMED_FRAME.code);
        assertThat(r.message()).contains("payload");
    }

    @Test
    void anOverlongKeyIsABadRequestAndTheConnectionStaysUsable() throws Exception {
        try (FrameConnection c = FrameConnection.connect(master(), Duration.ofSeconds(5), Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter().i32(1).bytes(new byte[600]);
            assertThatThrownBy(() -> c.call(Opcode.EXIST_KEY, w, Duration.ofSeconds(5)))
                    .isInstanceOf(RemoteException.class).hasMessageContaining("600")
                    .satisfies(e -> assertThat(((RemoteException) e).status()).isEqualTo(FrameStatus.BAD_REQUEST));
            assertThat(c.isBroken()).isFalse();
            BodyWriter ok = new BodyWriter().i32(1).bytes("kept".getBytes(StandardCharsets.UTF_8));
            assertThat(MasterMessages.Flags.read(c.call(Opcode.EXIST_KEY, ok, Duration.ofSeconds(5)).body())
                    .values()[0]).isTrue();
        }
    }

    @Test
    void aWriteOutsideTheSegmentIsABadRequestNamingTheSegmentAndDamagesNothing() throws Exception {
        BodyWriter w = new BodyWriter().i64(0).i64(0).i32(1).i64(1L << 40).i64(5).bytes("evil".getBytes()).i64(8).i32(0);
        WriteGrant.none().write(w);
        ErrorReply r = sendRaw(node(), frame(Opcode.NODE_WRITE.code, w, 8), ByteBuffer.wrap(new byte[8]));
        assertThat(r.status()).isEqualTo(FrameStatus.BAD_REQUEST.code);
        assertThat(r.message()).contains(node().toString()).contains("does not fit");
        assertThat(client.get("kept")).hasValueSatisfying(b -> assertThat(b).isEqualTo(KEPT));
    }

    @Test
    void aTruncatedFrameDoesNotDisturbOthers() throws Exception {
        try (SocketChannel ch = SocketChannel.open(master().toSocketAddress())) {
            ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), Opcode.EXIST_KEY.code, false, 0, 3, 100, 0);
            while (h.hasRemaining()) {
                ch.write(h);
            }
            ch.write(ByteBuffer.wrap(new byte[10]));
            // hang up halfway through the body while the server waits for the rest
        }
        assertThat(client.exists("kept")).isTrue();
        assertThat(client.put("after-truncated", new byte[10])).isEqualTo(PutStatus.OK);
    }
}

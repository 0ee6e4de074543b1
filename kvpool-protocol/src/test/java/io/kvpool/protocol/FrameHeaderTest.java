package io.kvpool.protocol;

import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.catchThrowableOfType;

class FrameHeaderTest {

    private static final Limits LIMITS = new Limits(4096, 1 << 20);

    private static ByteBuffer header(int opcode, boolean reply, int status, long requestId, int bodyLength,
                                     long payloadLength) {
        return FrameHeader.write(FrameHeader.allocate(), opcode, reply, status, requestId, bodyLength, payloadLength);
    }

    private static MalformedFrameException decodeFails(ByteBuffer buf) {
        MalformedFrameException e = catchThrowableOfType(MalformedFrameException.class,
                () -> FrameHeader.decode(buf, LIMITS));
        assertThat(e).as("decode should have failed").isNotNull();
        return e;
    }

    @Test
    void writeReturnsAFlipped32ByteHeaderStartingWithKP() {
        ByteBuffer b = header(Opcode.PING.code, false, 0, 1, 0, 0);
        assertThat(b.position()).isZero();
        assertThat(b.remaining()).isEqualTo(FrameHeader.LENGTH).isEqualTo(32);
        assertThat((char) b.get(0)).isEqualTo('K');
        assertThat((char) b.get(1)).isEqualTo('P');
        assertThat(b.get(2)).isEqualTo(FrameHeader.VERSION);
        assertThat(b.get(3)).isEqualTo((byte) Opcode.PING.code);
    }

    @Test
    void roundTrip() {
        FrameHeader.Decoded d = FrameHeader.decode(header(0xFF, true, 0xFFFF, Long.MIN_VALUE, 4096, 1 << 20), LIMITS);
        assertThat(d).isEqualTo(new FrameHeader.Decoded(0xFF, true, 0xFFFF, Long.MIN_VALUE, 4096, 1 << 20));

        d = FrameHeader.decode(header(Opcode.NODE_READ.code, false, 0, 0, 0, 0), LIMITS);
        assertThat(d).isEqualTo(new FrameHeader.Decoded(Opcode.NODE_READ.code, false, 0, 0, 0, 0));
    }

    @Test
    void randomRoundTrips() {
        long seed = 0xF4A3EL;
        Random rnd = new Random(seed);
        ByteBuffer buf = FrameHeader.allocate();
        for (int i = 0; i < 2000; i++) {
            FrameHeader.Decoded want = new FrameHeader.Decoded(rnd.nextInt(256), rnd.nextBoolean(), rnd.nextInt(65536),
                    rnd.nextLong(), rnd.nextInt(LIMITS.maxBodyBytes() + 1), rnd.nextLong(LIMITS.maxPayloadBytes() + 1));
            FrameHeader.write(buf, want.opcode(), want.reply(), want.status(), want.requestId(), want.bodyLength(),
                    want.payloadLength());
            assertThat(FrameHeader.decode(buf, LIMITS)).as("seed=%d i=%d", seed, i).isEqualTo(want);
        }
    }

    @Test
    void badMagic() {
        ByteBuffer b = header(1, false, 0, 7, 0, 0);
        b.put(0, (byte) 'G');
        MalformedFrameException e = decodeFails(b);
        assertThat(e.status()).isEqualTo(FrameStatus.MALFORMED_FRAME);
        assertThat(e.getMessage()).contains("bad magic");
    }

    @Test
    void unsupportedVersionKeepsTheRequestId() {
        ByteBuffer b = header(1, false, 0, 1234, 0, 0);
        b.put(FrameHeader.VERSION_OFFSET, (byte) 1); // the version before the SSD tier changed the frames
        MalformedFrameException e = decodeFails(b);
        assertThat(e.status()).isEqualTo(FrameStatus.UNSUPPORTED_VERSION);
        assertThat(e.requestId()).isEqualTo(1234);
        assertThat(e.getMessage()).contains("version 1").contains("speaks version " + FrameHeader.VERSION);
    }

    @Test
    void reservedBitsRejected() {
        ByteBuffer flags = header(1, true, 0, 5, 0, 0);
        flags.put(FrameHeader.FLAGS_OFFSET, (byte) 0x03);
        ByteBuffer reserved8 = header(1, false, 0, 5, 0, 0);
        reserved8.put(FrameHeader.RESERVED8_OFFSET, (byte) 1);
        ByteBuffer reserved32 = header(1, false, 0, 5, 0, 0);
        reserved32.putInt(FrameHeader.RESERVED32_OFFSET, 1 << 24);
        for (ByteBuffer b : new ByteBuffer[]{flags, reserved8, reserved32}) {
            MalformedFrameException e = decodeFails(b);
            assertThat(e.status()).isEqualTo(FrameStatus.MALFORMED_FRAME);
            assertThat(e.requestId()).isEqualTo(5);
            assertThat(e.getMessage()).contains("reserved");
        }
    }

    @Test
    void bodyLengthOverTheLimit() {
        MalformedFrameException e = decodeFails(header(1, false, 0, 9, 4097, 0));
        assertThat(e.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(e.requestId()).isEqualTo(9);
        assertThat(e.getMessage()).contains("body length 4097").contains("4096");

        // a length with the top bit set is huge, not negative
        e = decodeFails(header(1, false, 0, 9, -1, 0));
        assertThat(e.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(e.getMessage()).contains("4294967295");
    }

    @Test
    void payloadLengthOverTheLimit() {
        MalformedFrameException e = decodeFails(header(1, false, 0, 11, 0, (1 << 20) + 1));
        assertThat(e.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(e.requestId()).isEqualTo(11);
        assertThat(e.getMessage()).contains("payload length 1048577");

        e = decodeFails(header(1, false, 0, 11, 0, -1L));
        assertThat(e.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(e.getMessage()).contains("18446744073709551615");
    }

    @Test
    void limitsValidate() {
        assertThat(catchThrowableOfType(IllegalArgumentException.class, () -> new Limits(1023, 0))).isNotNull();
        assertThat(catchThrowableOfType(IllegalArgumentException.class, () -> new Limits(1024, -1))).isNotNull();
        assertThat(new Limits(1024, 0).maxBodyBytes()).isEqualTo(1024);
    }

    @Test
    void statusAndOpcodeLookups() {
        for (FrameStatus s : FrameStatus.values()) {
            assertThat(FrameStatus.of(s.code)).isSameAs(s);
        }
        assertThat(FrameStatus.of(999)).isEqualTo(FrameStatus.INTERNAL_ERROR);
        assertThat(FrameStatus.of(-1)).isEqualTo(FrameStatus.INTERNAL_ERROR);
        for (Opcode op : Opcode.values()) {
            assertThat(Opcode.of(op.code)).isSameAs(op);
        }
        assertThat(Opcode.of(0x7F)).isNull();
        assertThat(Opcode.of(256)).isNull();
        for (ResultCode c : ResultCode.values()) {
            assertThat(ResultCode.of(c.code)).isSameAs(c);
        }
        assertThat(catchThrowableOfType(MalformedFrameException.class, () -> ResultCode.of(ResultCode.values().length)))
                .isNotNull();
    }

    @Test
    void tierCodesAndLabels() {
        // the wire bytes of protocol version 2: they must not change
        assertThat(Tier.MEMORY.code).isZero();
        assertThat(Tier.DISK.code).isEqualTo(1);
        for (Tier t : Tier.values()) {
            assertThat(Tier.of(t.code)).isSameAs(t);
        }
        assertThat(Tier.MEMORY.label()).isEqualTo("memory");
        assertThat(Tier.DISK.label()).isEqualTo("disk");
        for (int bad : new int[] {2, 255, -1}) {
            MalformedFrameException e = catchThrowableOfType(MalformedFrameException.class, () -> Tier.of(bad));
            assertThat(e).isNotNull().hasMessageContaining("unknown tier " + bad);
            assertThat(e.status()).isEqualTo(FrameStatus.MALFORMED_FRAME);
        }
    }
}

package io.kvpool.bench.baseline;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.kvpool.bench.Measurement;

import java.io.EOFException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.time.Duration;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class RawTcpTargetTest {

    private static final Duration WARMUP = Duration.ofMillis(20);
    private static final Duration RUN = Duration.ofMillis(150);

    private static RawTcpTarget target;

    @BeforeAll
    static void startServer() throws Exception {
        target = RawTcpTarget.start();
    }

    @AfterAll
    static void stopServer() throws Exception {
        if (target != null) {
            long pid = target.serverPid();
            target.close();
            assertThat(ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)).isFalse();
        }
    }

    @Test
    void putsAndGetsMoveTheValueSizePerOperation() throws Exception {
        assertThat(target.name()).isEqualTo("raw-tcp");
        for (int clients : new int[] {1, 2}) {
            for (int size : new int[] {1, 4096, 1 << 20, 3_000_001}) {
                Measurement p = target.put(size, clients, WARMUP, RUN);
                assertThat(p.ops()).isPositive();
                assertThat(p.bytes()).isEqualTo(p.ops() * size);
                assertThat(p.latenciesNanos()).hasSize((int) p.ops());
                Measurement g = target.get(size, clients, WARMUP, RUN);
                assertThat(g.ops()).isPositive();
                assertThat(g.bytes()).isEqualTo(g.ops() * size);
            }
        }
    }

    @Test
    void pipelinedCallsMoveDepthValuesEachAndLeaveTheConnectionInStep() throws Exception {
        try (RawTcpTarget.Connection put = new RawTcpTarget.Connection(target.address(), 4096, 1, RawTcpServer.OP_PUT, 8);
             RawTcpTarget.Connection get = new RawTcpTarget.Connection(target.address(), 4096, 2, RawTcpServer.OP_GET, 8)) {
            for (int i = 0; i < 3; i++) {
                assertThat(put.putPipelined()).isEqualTo(8 * 4096);
                assertThat(get.getPipelined()).isEqualTo(8 * 4096);
            }
            // after pipelined calls, a single exchange on the same connection still pairs request and reply
            assertThat(put.put()).isEqualTo(4096);
            assertThat(get.get()).isEqualTo(4096);
        }
    }

    @Test
    void aGrowingValueSizeOnOneConnectionWorks() throws Exception {
        try (RawTcpTarget.Connection small = new RawTcpTarget.Connection(target.address(), 10, 1, RawTcpServer.OP_GET);
                RawTcpTarget.Connection big = new RawTcpTarget.Connection(target.address(), 5 << 20, 1, RawTcpServer.OP_PUT)) {
            assertThat(small.get()).isEqualTo(10);
            assertThat(small.put()).isEqualTo(10);
            assertThat(big.put()).isEqualTo(5 << 20);
            assertThat(big.get()).isEqualTo(5 << 20);
            assertThat(small.get()).isEqualTo(10);
        }
    }

    @Test
    void theServerRejectsABadHeaderAndClosesTheConnection() throws Exception {
        try (SocketChannel ch = SocketChannel.open(target.address())) {
            ByteBuffer h = ByteBuffer.allocate(RawTcpServer.HEADER_BYTES).putInt(9).putInt(0).putLong(1).flip();
            RawTcpServer.writeFully(ch, h);
            ByteBuffer r = ByteBuffer.allocate(2);
            assertThatThrownBy(() -> RawTcpServer.readFully(ch, r, false)).isInstanceOf(EOFException.class);
            assertThat(r.get(0)).isEqualTo(RawTcpServer.NACK);
        }
        // and keeps serving others
        Measurement g = target.get(1000, 1, Duration.ZERO, Duration.ofMillis(20));
        assertThat(g.bytes()).isEqualTo(g.ops() * 1000);
    }

    @Test
    void rejectsSizesOutOfRange() {
        assertThatThrownBy(() -> target.put(0, 1, Duration.ZERO, RUN)).isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> target.get(Integer.MAX_VALUE, 1, Duration.ZERO, RUN))
                .isInstanceOf(IllegalArgumentException.class);
    }
}

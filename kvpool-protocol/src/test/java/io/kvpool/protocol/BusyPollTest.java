package io.kvpool.protocol;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * {@link BusyPoll} over a real loopback pair. Whether bytes are there when a poll starts is made certain
 * (the test waits until the socket reports them readable), so no case depends on how fast anything runs: a
 * "hit" polls bytes already there, a "miss" polls a socket nobody writes to. Whether a yield ran another thread
 * is decided by the test too: {@link #NEVER_AWAY} counts no yield as one, {@link #ALWAYS_AWAY} every one.
 */
class BusyPollTest {

    private static final Duration SHORT = Duration.ofNanos(1_000);
    private static final long NEVER_AWAY = Long.MAX_VALUE;
    private static final long ALWAYS_AWAY = -1;

    private ServerSocketChannel server;
    private SocketChannel writer;
    private SocketChannel reader;
    private final BusyPoll.Counters counters = new BusyPoll.Counters();

    @BeforeEach
    void connect() throws IOException {
        server = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        writer = SocketChannel.open(server.getLocalAddress());
        reader = server.accept();
    }

    @AfterEach
    void close() throws IOException {
        writer.close();
        reader.close();
        server.close();
    }

    /** Writes {@code n} bytes and waits until the reader's socket holds them all. */
    private void arrive(int n) throws IOException {
        writer.write(ByteBuffer.allocate(n));
        InputStream in = reader.socket().getInputStream();
        while (in.available() < n) {
            Thread.onSpinWait();
        }
    }

    @Test
    void aPollTakesBytesThatAreThereAndLeavesTheChannelBlocking() throws IOException {
        BusyPoll poll = new BusyPoll(BusyPoll.MAX, counters);
        arrive(10);
        ByteBuffer dst = ByteBuffer.allocate(32);
        assertThat(poll.read(reader, reader, dst)).isEqualTo(10);
        assertThat(reader.isBlocking()).isTrue();
        assertThat(counters.hits()).isEqualTo(1);
        assertThat(counters.misses()).isZero();
    }

    @Test
    void aPollThatRunsOutReadsNothingAndAfterItOnlyOneWaitInEightPolls() throws IOException {
        BusyPoll poll = new BusyPoll(SHORT, counters, NEVER_AWAY);
        ByteBuffer dst = ByteBuffer.allocate(32);
        assertThat(poll.read(reader, reader, dst)).isZero();
        assertThat(reader.isBlocking()).isTrue();
        assertThat(counters.misses()).isEqualTo(1);
        arrive(4);
        // bytes are there now, but the next seven waits do not poll: they leave the read to the caller
        for (int i = 1; i < BusyPoll.FIRST_RETRY; i++) {
            assertThat(poll.read(reader, reader, dst)).as("wait %d after the miss", i).isZero();
        }
        assertThat(dst.position()).isZero();
        assertThat(counters.hits() + counters.misses()).isEqualTo(1);
        // the eighth polls, finds them, and from then on every wait polls again
        assertThat(poll.read(reader, reader, dst)).isEqualTo(4);
        arrive(3);
        assertThat(poll.read(reader, reader, dst)).isEqualTo(3);
        assertThat(counters.hits()).isEqualTo(2);
    }

    @Test
    void missesInARowPollEverLessOftenDownToOneWaitIn64() throws IOException {
        BusyPoll poll = new BusyPoll(SHORT, counters, NEVER_AWAY);
        ByteBuffer dst = ByteBuffer.allocate(32);
        int waits = 0;
        java.util.List<Integer> polledAt = new java.util.ArrayList<>();
        while (polledAt.size() < 6) {
            long before = counters.misses();
            assertThat(poll.read(reader, reader, dst)).isZero();
            if (counters.misses() > before) {
                polledAt.add(waits);
            }
            waits++;
        }
        // nobody writes, so every poll misses: the gaps between polls are 8, 16, 32, 64, 64
        assertThat(polledAt).containsExactly(0, 8, 24, 56, 120, 184);
    }

    @Test
    void aPollWhoseYieldRanAnotherThreadStopsAndIsNoMiss() throws IOException {
        BusyPoll poll = new BusyPoll(BusyPoll.MAX, counters, ALWAYS_AWAY);
        ByteBuffer dst = ByteBuffer.allocate(32);
        for (int i = 0; i < 3; i++) {
            assertThat(poll.read(reader, reader, dst)).isZero();
        }
        assertThat(reader.isBlocking()).isTrue();
        assertThat(counters.yielded()).as("each wait polled, and stopped at its first yield").isEqualTo(3);
        assertThat(counters.misses()).isZero();
        arrive(6);
        assertThat(poll.read(reader, reader, dst)).isEqualTo(6); // no back-off: the next wait polled at once
        assertThat(counters.hits()).isEqualTo(1);
    }

    @Test
    void theEndOfTheStreamReadsAsMinusOne() throws IOException {
        BusyPoll poll = new BusyPoll(BusyPoll.MAX, counters);
        writer.shutdownOutput();
        assertThat(poll.read(reader, reader, ByteBuffer.allocate(8))).isEqualTo(-1);
        assertThat(reader.isBlocking()).isTrue();
    }

    @Test
    void aZeroBudgetAVirtualThreadAndAFullBufferNeverPoll() throws Exception {
        arrive(5);
        assertThat(new BusyPoll(Duration.ZERO, counters).read(reader, reader, ByteBuffer.allocate(8))).isZero();
        BusyPoll poll = new BusyPoll(BusyPoll.MAX, counters);
        assertThat(poll.read(reader, reader, ByteBuffer.allocate(0))).isZero();
        AtomicInteger onVirtual = new AtomicInteger(-2);
        Thread t = Thread.ofVirtual().start(() -> {
            try {
                onVirtual.set(poll.read(reader, reader, ByteBuffer.allocate(8)));
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        });
        t.join();
        assertThat(onVirtual.get()).isZero();
        assertThat(counters.hits() + counters.misses()).isZero();
        assertThat(poll.read(reader, reader, ByteBuffer.allocate(8))).isEqualTo(5); // the bytes stayed for a read
    }

    @Test
    void budgetsOutOfRangeAreRefusedByName() {
        assertThatThrownBy(() -> new BusyPoll(Duration.ofNanos(-1), counters))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("busy poll must be 0 (off) to 1ms");
        assertThatThrownBy(() -> BusyPoll.check("client: busyPoll", Duration.ofMillis(2)))
                .hasMessage("client: busyPoll must be 0 (off) to 1ms, got 2ms");
        assertThatThrownBy(() -> BusyPoll.check("client: busyPoll", null)).hasMessageContaining("got none");
    }

    @Test
    void theBudgetComesFromTheSystemPropertyOrTheDefault() {
        String before = System.getProperty(BusyPoll.PROPERTY);
        try {
            System.clearProperty(BusyPoll.PROPERTY);
            assertThat(BusyPoll.configured()).isEqualTo(BusyPoll.DEFAULT);
            System.setProperty(BusyPoll.PROPERTY, "0");
            assertThat(BusyPoll.configured()).isZero();
            System.setProperty(BusyPoll.PROPERTY, "120us");
            assertThat(BusyPoll.configured()).isEqualTo(Duration.ofNanos(120_000));
            System.setProperty(BusyPoll.PROPERTY, "fast");
            assertThatThrownBy(BusyPoll::configured).isInstanceOf(IllegalArgumentException.class)
                    .hasMessageStartingWith("-Dkvpool.busyPoll: 'fast' is not a duration");
            System.setProperty(BusyPoll.PROPERTY, "5ms");
            assertThatThrownBy(BusyPoll::configured)
                    .hasMessage("-Dkvpool.busyPoll must be 0 (off) to 1ms, got 5ms");
        } finally {
            if (before == null) {
                System.clearProperty(BusyPoll.PROPERTY);
            } else {
                System.setProperty(BusyPoll.PROPERTY, before);
            }
        }
    }
}

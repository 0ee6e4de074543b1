package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.net.InetSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;

/** Which idle connection a borrower gets: platform threads keep to sockets no virtual thread used. */
class ConnectionPoolTest {

    private static final Duration WAIT = Duration.ofSeconds(5);

    private ServerSocketChannel server;
    private final List<SocketChannel> accepted = new ArrayList<>();
    private Thread acceptor;
    private ConnectionPool pool;

    @BeforeEach
    void start() throws Exception {
        server = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        acceptor = Thread.ofPlatform().daemon().start(() -> {
            try {
                while (true) {
                    SocketChannel c = server.accept();
                    synchronized (accepted) {
                        accepted.add(c);
                    }
                }
            } catch (Exception e) {
                // closed
            }
        });
        int port = ((InetSocketAddress) server.getLocalAddress()).getPort();
        pool = new ConnectionPool(new HostPort("127.0.0.1", port), 2, WAIT, Limits.DEFAULT, null);
    }

    @AfterEach
    void stop() throws Exception {
        pool.close();
        server.close();
        synchronized (accepted) {
            for (SocketChannel c : accepted) {
                c.close();
            }
        }
    }

    private FrameConnection borrowOnVirtualThread() throws Exception {
        AtomicReference<Object> out = new AtomicReference<>();
        Thread.ofVirtual().start(() -> {
            try {
                out.set(pool.borrow(WAIT));
            } catch (Exception e) {
                out.set(e);
            }
        }).join();
        if (out.get() instanceof Exception e) {
            throw e;
        }
        return (FrameConnection) out.get();
    }

    @Test
    void platformThreadsAvoidConnectionsAVirtualThreadUsed() throws Exception {
        FrameConnection a = pool.borrow(WAIT);
        pool.release(a);
        assertThat(pool.idleConnections()).containsExactly(1, 0);

        // a virtual thread takes the idle blocking connection when there is no other, and taints it
        FrameConnection v = borrowOnVirtualThread();
        assertThat(v).isSameAs(a);
        pool.release(v);
        assertThat(pool.idleConnections()).containsExactly(0, 1);

        // a platform thread opens a fresh one rather than take it, while fewer than max are open
        FrameConnection b = pool.borrow(WAIT);
        assertThat(b).isNotSameAs(a);
        assertThat(pool.openConnections()).isEqualTo(2);
        pool.release(b);

        // virtual threads prefer the tainted one, platform threads the clean one
        assertThat(borrowOnVirtualThread()).isSameAs(a);
        pool.release(a);
        FrameConnection again = pool.borrow(WAIT);
        assertThat(again).isSameAs(b);

        // at max, a platform thread takes what is idle
        FrameConnection last = pool.borrow(WAIT);
        assertThat(last).isSameAs(a);
        assertThat(pool.openConnections()).isEqualTo(2);
        pool.release(again);
        pool.release(last);
        assertThat(pool.idleConnections()).containsExactly(1, 1);

        pool.drainIdle();
        assertThat(pool.openConnections()).isZero();
        assertThat(pool.idleConnections()).containsExactly(0, 0);
    }

    @Test
    void brokenConnectionsAreClosedAndNotCounted() throws Exception {
        FrameConnection a = pool.borrow(WAIT);
        a.close();
        pool.release(a);
        assertThat(pool.openConnections()).isZero();
        FrameConnection b = pool.borrow(WAIT);
        assertThat(b).isNotSameAs(a);
        pool.release(b);
        b.close(); // broken while idle: dropped when next taken
        FrameConnection c = pool.borrow(WAIT);
        assertThat(c).isNotSameAs(b);
        assertThat(pool.openConnections()).isEqualTo(1);
        pool.release(c);
    }
}

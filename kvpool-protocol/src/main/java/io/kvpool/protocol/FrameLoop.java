package io.kvpool.protocol;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;

/**
 * One thread that serves a {@link FrameServer}'s small, quick frames for many connections at once.
 *
 * <h2>Why</h2>
 * A connection on a thread of its own costs a thread wake-up and a context switch per frame: the
 * thread sleeps in its read, the frame wakes it, it answers and sleeps again. For a master with a
 * thousand nodes each heartbeating on its own connection, that switch is most of a heartbeat's cost
 * (measured on this project's 2-vCPU machine: a do-nothing server answering 128-byte requests spends
 * 10 us of CPU a request with a thread per connection and 5 us with one selector loop). Here the
 * connections whose frames are all of a few opcodes named by the server's owner ({@link #quick}: on
 * the master, NODE_HEARTBEAT and NODE_BEACON) wait in one selector, and the loop answers every ready one per
 * wake-up. A handler may answer nothing ({@link Request#answerNothing}, a beacon with no news): then nothing is
 * written, and the loop saves the write and the peer's wake-up too.
 *
 * <h2>Who is served here</h2>
 * A plain (not TLS) connection that has authenticated and just had a quick frame answered on its own
 * thread moves here ({@link ServedConnection#serve}); its thread ends. The loop reads what has arrived
 * into the connection's inbox, a header and a body in one read. A whole frame that is quick, carries no
 * payload, has a body of at most {@link #MAX_BODY} bytes and may be sent on this connection is handled
 * with a {@link Request} whose reply is collected in memory ({@link Outbox}); the reply is written
 * without blocking (what the socket does not take now is written when it becomes writable; the
 * connection's next frame waits until then). Any other frame (another opcode, one that needs checking and
 * refusing, a payload, a large body) hands the connection back to a thread of its own with the header
 * read and the bytes read past it ({@link ServedConnection#readAhead}, read before the socket), which
 * serves that frame as any other and may send the connection back here later, with what it has not used
 * of those bytes. So a handler this loop runs must
 * never block: only quick opcodes run here, and the owner names only those.
 *
 * <h2>Deadlines and ends</h2>
 * Once a frame's first byte has arrived, its rest must arrive within the frame timeout, as on a thread:
 * the loop checks the deadlines of frames in progress every wake-up (at most every quarter of the
 * timeout) and closes a connection past its deadline, counted in {@link ServerCounters#timedOutFrames}.
 * A connection that ends here (peer closed, error, handler said close) is ended by the server's
 * {@code finish}, on a virtual thread, after the loop has let go of it. A channel leaves the selector
 * (key cancelled, then a {@code selectNow}) before it is put back in blocking mode for a thread or a
 * close.
 */
final class FrameLoop implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(FrameLoop.class);

    /** Largest body served in the loop; a larger one is read on the connection's own thread. */
    static final int MAX_BODY = 1 << 10;

    /** What the loop hands back to the server: a connection to serve on a thread, or to end. */
    interface Owner {
        /** Serve {@code c} on a thread of its own; its channel is in blocking mode, its header read. */
        void serveOnThread(ServedConnection c);

        /** {@code c} is over: count it out and close it (its channel is in blocking mode). */
        void end(ServedConnection c);
    }

    private final String name;
    private final Predicate<Opcode> quick;
    private final long frameTimeoutNanos;
    private final ServerCounters counters;
    private final Owner owner;
    private final Selector selector;
    private final ConcurrentLinkedQueue<ServedConnection> joining = new ConcurrentLinkedQueue<>();
    private final Thread thread;
    private volatile boolean running = true;
    /** Connections with a frame in progress (a byte of it read, its reply not yet all written). */
    private final Set<Slot> inProgress = ConcurrentHashMap.newKeySet();
    /** Connections waiting in the loop now. */
    private final AtomicInteger connections = new AtomicInteger();
    /** Frames served in the loop so far (answered, or for a NODE_BEACON with no news, not). */
    private final AtomicLong frames = new AtomicLong();
    /** Reads from the connections' sockets so far. */
    private final AtomicLong reads = new AtomicLong();

    /** Where one connection is: the bytes read of its next frames, the reply being written. */
    private static final class Slot {
        final ServedConnection c;
        /**
         * What was read and not yet handled (write mode between wake-ups): one read takes a header and a body at
         * once, and the start of whatever frame follows; a frame the loop does not serve goes to the connection's
         * thread with the bytes read past its header ({@link ServedConnection#readAhead}).
         */
        final ByteBuffer inbox = ByteBuffer.allocateDirect(FrameHeader.LENGTH + MAX_BODY);
        final Outbox out = new Outbox();
        FrameHeader.Decoded header;
        Opcode op;
        long deadline;
        /** Whether a reply is waiting for the socket to take the rest of it. */
        boolean writing;
        /** After the reply: whether the connection is to be closed once it is written. */
        boolean closeAfter;
        /** Whether it left the loop (it leaves once). */
        boolean left;

        Slot(ServedConnection c) {
            this.c = c;
        }
    }

    FrameLoop(String name, Predicate<Opcode> quick, long frameTimeoutNanos, ServerCounters counters, Owner owner)
            throws IOException {
        this.name = name;
        this.quick = quick;
        this.frameTimeoutNanos = frameTimeoutNanos;
        this.counters = counters;
        this.owner = owner;
        this.selector = Selector.open();
        this.thread = Thread.ofPlatform().daemon().name(name + "-loop").start(this::run);
    }

    /** Connections waiting in the loop now. */
    int connections() {
        return connections.get();
    }

    /** Frames served in the loop so far. */
    long frames() {
        return frames.get();
    }

    /** Reads from the connections' sockets so far. */
    long reads() {
        return reads.get();
    }

    /** Whether frames of {@code op} are served here. */
    boolean quick(Opcode op) {
        return quick.test(op);
    }

    /** Takes {@code c}, whose channel is in non-blocking mode, between two frames. */
    void join(ServedConnection c) {
        joining.add(c);
        selector.wakeup();
        if (!running) {
            // the loop may have stopped before seeing it: the server's close closes its channel
            joining.remove(c);
        }
    }

    private void run() {
        List<Runnable> afterDeregister = new ArrayList<>();
        long sweepEvery = Math.max(1_000_000L, frameTimeoutNanos / 4);
        long nextSweep = System.nanoTime() + sweepEvery;
        while (running) {
            try {
                if (selector.selectedKeys().isEmpty()) {
                    selector.select(inProgress.isEmpty() ? 0 : Math.max(1, sweepEvery / 1_000_000L));
                }
                ServedConnection c;
                while ((c = joining.poll()) != null) {
                    register(c, afterDeregister);
                }
                Iterator<SelectionKey> it = selector.selectedKeys().iterator();
                while (it.hasNext()) {
                    SelectionKey k = it.next();
                    it.remove();
                    step(k, afterDeregister);
                }
                long now = System.nanoTime();
                if (!inProgress.isEmpty() && now - nextSweep >= 0) {
                    nextSweep = now + sweepEvery;
                    expire(now, afterDeregister);
                }
                if (!afterDeregister.isEmpty()) {
                    selector.selectNow(); // cancelled keys leave the selector: their channels may block again
                    for (Runnable r : afterDeregister) {
                        r.run();
                    }
                    afterDeregister.clear();
                }
            } catch (IOException | RuntimeException e) {
                if (running) {
                    log.error("{}: frame loop failed", name, e);
                }
            }
        }
    }

    private void register(ServedConnection c, List<Runnable> after) {
        Slot s = new Slot(c);
        SelectionKey k;
        try {
            k = c.socket().register(selector, SelectionKey.OP_READ, s);
        } catch (ClosedChannelException e) {
            release(c, false);
            return;
        }
        connections.incrementAndGet();
        // bytes its thread had from the loop and did not use: frames that follow, already read from the socket
        c.takeReadAhead(s.inbox);
        try {
            process(k, s, after);
        } catch (IOException | RuntimeException e) {
            log.debug("{}: connection from {} ended: {}", name, c.peer(), e.toString());
            leave(k, s, false, after);
        }
    }

    /** One ready connection: reads what it can of its frame, answers a complete one, writes what is pending. */
    private void step(SelectionKey k, List<Runnable> after) {
        Slot s = (Slot) k.attachment();
        try {
            if (!k.isValid()) {
                leave(k, s, false, after);
                return;
            }
            if (k.isWritable()) {
                if (!flush(k, s, after)) {
                    return;
                }
                process(k, s, after); // frames read while the reply waited
                if (s.left || s.writing) {
                    return;
                }
            }
            if (k.isReadable()) {
                read(k, s, after);
            }
        } catch (IOException | RuntimeException e) {
            log.debug("{}: connection from {} ended: {}", name, s.c.peer(), e.toString());
            leave(k, s, false, after);
        }
    }

    /** Reads what has arrived (one system call) and handles the whole frames it completes. */
    private void read(SelectionKey k, Slot s, List<Runnable> after) throws IOException {
        reads.incrementAndGet();
        if (s.c.socket().read(s.inbox) < 0) {
            leave(k, s, false, after);
            return;
        }
        process(k, s, after);
    }

    /**
     * Handles the whole frames in the slot's inbox, in order, until it holds only part of one, a reply waits
     * for the socket, or a frame goes to the connection's thread (with the bytes after its header).
     */
    private void process(SelectionKey k, Slot s, List<Runnable> after) throws IOException {
        ByteBuffer in = s.inbox.flip();
        try {
            while (in.remaining() >= FrameHeader.LENGTH) {
                int at = in.position();
                ByteBuffer header = s.c.header().clear();
                header.put(in.slice(at, FrameHeader.LENGTH));
                if (!admit(s)) {
                    // anything but a quick frame that may be sent here: the connection's thread serves it
                    in.position(at + FrameHeader.LENGTH);
                    s.c.readAhead(in);
                    s.c.headerRead();
                    leave(k, s, true, after);
                    return;
                }
                int length = s.header.bodyLength();
                if (in.remaining() < FrameHeader.LENGTH + length) {
                    break;
                }
                ByteBuffer body = in.slice(at + FrameHeader.LENGTH, length).order(ByteOrder.LITTLE_ENDIAN);
                in.position(at + FrameHeader.LENGTH + length);
                answer(s, body);
                inProgress.remove(s); // a frame done: the next one's deadline starts with its first byte
                if (!flush(k, s, after)) {
                    return;
                }
            }
        } finally {
            if (!s.left) {
                in.compact();
                progress(s);
            }
        }
    }

    /** Keeps the slot among the frames in progress while it holds part of a frame or a reply to write. */
    private void progress(Slot s) {
        if (s.writing || s.inbox.position() > 0) {
            if (!inProgress.contains(s)) {
                s.deadline = System.nanoTime() + frameTimeoutNanos;
                inProgress.add(s);
            }
        } else {
            inProgress.remove(s);
        }
    }

    /** Whether the frame whose header was just read is one this loop serves (its header then kept in the slot). */
    private boolean admit(Slot s) {
        ByteBuffer header = s.c.header();
        FrameHeader.Decoded h;
        try {
            h = FrameHeader.decode(header, s.c.limits());
        } catch (MalformedFrameException e) {
            return false;
        }
        Opcode op = Opcode.of(h.opcode());
        if (op == null || h.reply() || h.status() != 0 || !quick.test(op) || h.payloadLength() != 0
                || h.bodyLength() > MAX_BODY || !s.c.mayServe(h, op)) {
            return false;
        }
        s.header = h;
        s.op = op;
        return true;
    }

    /** Runs the handler on the slot's frame, whose body is {@code body}; its reply goes to the slot's outbox. */
    private void answer(Slot s, ByteBuffer body) throws IOException {
        s.out.clear();
        frames.incrementAndGet();
        s.closeAfter = !s.c.serveBuffered(s.header, s.op, body, s.out);
    }

    /**
     * Writes what the outbox holds; true when all of it is written (the frame is done: the next may be read),
     * false when the rest waits for the socket to be writable, or the connection was let go.
     */
    private boolean flush(SelectionKey k, Slot s, List<Runnable> after) throws IOException {
        ByteBuffer pending = s.out.pending();
        if (pending.hasRemaining()) {
            s.c.socket().write(pending);
            if (pending.hasRemaining()) {
                if (!s.writing) {
                    s.writing = true;
                    k.interestOps(SelectionKey.OP_WRITE);
                    progress(s);
                }
                return false;
            }
        }
        if (s.writing) {
            s.writing = false;
            k.interestOps(SelectionKey.OP_READ);
            inProgress.remove(s);
        }
        if (s.closeAfter) {
            leave(k, s, false, after);
            return false;
        }
        return true;
    }

    /** Closes connections whose frame in progress passed its deadline. */
    private void expire(long now, List<Runnable> after) {
        for (Slot s : inProgress) {
            if (now - s.deadline >= 0) {
                SelectionKey k = s.c.socket().keyFor(selector);
                counters.timedOutFrames.incrementAndGet();
                log.info("{}: closing the connection from {}: its frame did not arrive in full within the frame timeout",
                        name, s.c.peer());
                inProgress.remove(s);
                if (k != null) {
                    leave(k, s, false, after);
                }
            }
        }
    }

    /** The connection leaves the loop: to a thread of its own ({@code toThread}), or to be closed. */
    private void leave(SelectionKey k, Slot s, boolean toThread, List<Runnable> after) {
        if (s.left) {
            return;
        }
        s.left = true;
        connections.decrementAndGet();
        inProgress.remove(s);
        k.cancel();
        after.add(() -> release(s.c, toThread));
    }

    /** After the selector let go of the channel: back to blocking mode, then to a thread or to its end. */
    private void release(ServedConnection c, boolean toThread) {
        try {
            c.socket().configureBlocking(true);
        } catch (IOException | RuntimeException e) {
            toThread = false; // closed meanwhile (the server closing, a deadline): only its end is left
        }
        if (toThread) {
            owner.serveOnThread(c);
        } else {
            owner.end(c);
        }
    }

    @Override
    public void close() {
        running = false;
        selector.wakeup();
        try {
            thread.join(2000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try {
            selector.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    /**
     * A reply collected in memory: the handler's gathering writes land here, and the loop writes them to
     * the socket without blocking. Grows for a large reply, shrinks back afterwards.
     */
    static final class Outbox implements GatheringByteChannel {

        private static final int STANDING = 1 << 10;
        private ByteBuffer buf = ByteBuffer.allocateDirect(STANDING);

        void clear() {
            if (buf.capacity() > STANDING) {
                buf = ByteBuffer.allocateDirect(STANDING);
            }
            buf.clear();
            sending = false;
        }

        /** What is left to write, flipped for reading once (later calls return it where the writes left it). */
        ByteBuffer pending() {
            if (!sending) {
                buf.flip();
                sending = true;
            }
            return buf;
        }

        /** Whether the reply is being sent (no more may be written into it). */
        private boolean sending;

        @Override
        public int write(ByteBuffer src) {
            int n = src.remaining();
            ensure(n);
            buf.put(src);
            return n;
        }

        @Override
        public long write(ByteBuffer[] srcs, int offset, int length) {
            long n = 0;
            for (int i = offset; i < offset + length; i++) {
                n += write(srcs[i]);
            }
            return n;
        }

        @Override
        public long write(ByteBuffer[] srcs) {
            return write(srcs, 0, srcs.length);
        }

        private void ensure(int n) {
            if (sending) {
                throw new IllegalStateException("a reply written after the outbox was sent");
            }
            if (buf.remaining() < n) {
                ByteBuffer bigger = ByteBuffer.allocateDirect(Math.max(buf.capacity() * 2, buf.position() + n));
                buf.flip();
                bigger.put(buf);
                buf = bigger;
            }
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
        }
    }

    /** The input of a request served here: it has no payload, so nothing may be read. */
    static final ReadableByteChannel NO_PAYLOAD = new ReadableByteChannel() {
        @Override
        public int read(ByteBuffer dst) throws IOException {
            throw new IOException("a frame served in the loop has no payload to read");
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
        }
    };
}

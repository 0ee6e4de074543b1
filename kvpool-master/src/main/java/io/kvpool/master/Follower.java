package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.msg.StandbyMessages.FeedBatch;
import io.kvpool.protocol.msg.StandbyMessages.Follow;
import io.kvpool.protocol.msg.StandbyMessages.Snapshot;
import io.kvpool.protocol.msg.StandbyMessages.SnapshotPart;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * A standby master's side of the hot standby: keeps a {@link StandbyCopy} of the leader's metadata by
 * following its change feed over one connection ({@link FeedSource} is the leader's side).
 *
 * <p>One thread, in a loop: find the leader ({@code leader} answers null while there is none, or while this
 * process leads), connect with the admin secret, turn the feed on and note where it ends, clear the copy and
 * apply a snapshot of the segments and of every shard, then follow from that position, waiting at the leader
 * up to {@link #WAIT} for each batch. The copy is whole ({@link #following()}) from the end of the snapshot on;
 * a new leader, a feed that dropped records this follower had not read, or a lost connection start the loop
 * over. The leader never waits for this follower: a standby that falls behind resnapshots.
 */
final class Follower implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(Follower.class);

    /** How long the leader holds a FEED_FOLLOW open when there is nothing new. */
    static final Duration WAIT = Duration.ofMillis(200);
    static final Duration CALL_TIMEOUT = Duration.ofSeconds(10);
    static final int BATCH_BYTES = 8 << 20;

    private final StandbyCopy copy;
    /** This standby's master id, as the leader's sync set names it (empty: never waited for). */
    private final String self;
    private final Supplier<HostPort> leader;
    private final Consumer<HostPort> gone;
    private final Limits limits;
    private final Secrets secrets;
    private final Thread thread;
    private volatile boolean closed;
    private volatile FrameConnection open;
    /** The feed followed (the leader's incarnation), and whether the copy is whole: snapshot applied, following. */
    private volatile long feedId;
    private volatile boolean following;
    private volatile long term;
    private volatile long position;
    private volatile long lastBatchNanos;
    final AtomicLong snapshots = new AtomicLong();
    final AtomicLong snapshotMillis = new AtomicLong();
    final AtomicLong records = new AtomicLong();

    Follower(String self, StandbyCopy copy, Supplier<HostPort> leader, Limits limits, Secrets secrets) {
        this(self, copy, leader, limits, secrets, at -> { });
    }

    /** {@code gone} hears of a leader whose port refused a connection: its process is gone. */
    Follower(String self, StandbyCopy copy, Supplier<HostPort> leader, Limits limits, Secrets secrets,
             Consumer<HostPort> gone) {
        this.gone = gone;
        this.self = self;
        this.copy = copy;
        this.leader = leader;
        this.limits = limits;
        this.secrets = secrets;
        this.thread = Thread.ofPlatform().daemon().name("kvpool-standby-follower").start(this::run);
    }

    /**
     * True while the copy is whole: a snapshot of the leader of {@link #term()} and every batch read since (a lost
     * connection leaves it so; the next snapshot clears it first).
     */
    boolean following() {
        return following;
    }

    long term() {
        return term;
    }

    /** The leader's incarnation whose feed the copy follows. */
    long feedId() {
        return feedId;
    }

    long position() {
        return position;
    }

    /** Nanos ({@code System.nanoTime}) of the last batch from the leader, empty ones included. */
    long lastBatchNanos() {
        return lastBatchNanos;
    }

    StandbyCopy copy() {
        return copy;
    }

    private void run() {
        while (!closed) {
            HostPort at = leader.get();
            if (at == null) {
                sleep(50);
                continue;
            }
            try (FrameConnection c = FrameConnection.connect(at, CALL_TIMEOUT, limits, secrets)) {
                open = c;
                follow(c, at);
            } catch (IOException | RuntimeException e) {
                if (!closed && e.getCause() instanceof java.net.ConnectException) {
                    // refused: nothing listens on the leader's port, its process is gone
                    gone.accept(at);
                    sleep(20);
                } else if (!closed) {
                    log.info("standby: following the leader at {} stopped ({}); starting over", at, e.getMessage());
                    sleep(20);
                }
            } finally {
                // a lost connection leaves the copy whole as of its last batch: whether it may be served from is
                // for the leader's sync set to say (etcd), not for this connection
                open = null;
            }
        }
    }

    /** Snapshot, then follow, until the feed changes (returns) or the connection fails (throws). */
    private void follow(FrameConnection c, HostPort at) throws IOException {
        long started = System.nanoTime();
        FeedBatch start = FeedBatch.read(c.call(Opcode.FEED_FOLLOW, body(new Follow(-1, 1, 0, self)), CALL_TIMEOUT).body());
        long id = start.feedId();
        long at0 = start.next();
        following = false;
        copy.clear();
        for (int shard = -1; shard < ObjectIndex.SHARDS && !closed; shard++) {
            SnapshotPart first = snapshot(c, new Snapshot(shard, 0, 0), id);
            if (first == null) {
                return;
            }
            for (int p = 1; p < first.parts(); p++) {
                if (snapshot(c, new Snapshot(shard, p, first.parts()), id) == null) {
                    return;
                }
            }
        }
        feedId = id;
        term = start.term();
        position = at0;
        following = true;
        snapshots.incrementAndGet();
        snapshotMillis.set((System.nanoTime() - started) / 1_000_000);
        log.info("standby: following the leader at {} (term {}): {} objects, {} segments, snapshot in {} ms", at,
                term, copy.objects(), copy.segments.size(), snapshotMillis.get());
        boolean settled = false;
        while (!closed) {
            FeedBatch b = FeedBatch.read(c.call(Opcode.FEED_FOLLOW,
                    body(new Follow(position, BATCH_BYTES, (int) WAIT.toMillis(), self)), CALL_TIMEOUT).body());
            lastBatchNanos = System.nanoTime();
            if (b.feedId() != id || b.behind()) {
                log.info("standby: the leader's feed {}; taking a new snapshot",
                        b.behind() ? "dropped records this standby had not read" : "is another master's");
                return;
            }
            copy.apply(b.records(), b.count());
            records.addAndGet(b.count());
            position = b.next();
            if (!settled && b.records().length <= BATCH_BYTES / 2) {
                // the batch held every record there was (the next one would have fit): the copy is now the leader's
                // state at a moment after the snapshot's last part, and can keep the allocators (StandbyCopy)
                copy.settle();
                settled = true;
            }
        }
    }

    /** Applies one snapshot part; null when the part is another feed's (a new leader answered). */
    private SnapshotPart snapshot(FrameConnection c, Snapshot s, long id) throws IOException {
        SnapshotPart p = SnapshotPart.read(c.call(Opcode.FEED_SNAPSHOT, body(s), CALL_TIMEOUT).body());
        if (p.feedId() != id) {
            return null;
        }
        copy.apply(p.records(), p.count());
        return p;
    }

    private static BodyWriter body(Follow f) {
        BodyWriter w = new BodyWriter(16);
        f.write(w);
        return w;
    }

    private static BodyWriter body(Snapshot s) {
        BodyWriter w = new BodyWriter(12);
        s.write(w);
        return w;
    }

    private void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            closed = true;
            Thread.currentThread().interrupt();
        }
    }

    /** Stops following: the copy stays as it is (what a promotion takes over). */
    @Override
    public void close() {
        closed = true;
        FrameConnection c = open;
        if (c != null) {
            try {
                c.close();
            } catch (IOException ignored) {
                // closing: nothing to do
            }
        }
        thread.interrupt();
        try {
            thread.join(CALL_TIMEOUT.toMillis());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}

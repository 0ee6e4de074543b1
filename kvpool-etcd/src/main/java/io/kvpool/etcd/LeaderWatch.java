package io.kvpool.etcd;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.Predicate;

/**
 * Follows the leader record of one cluster: what nodes and clients given {@code etcd://...} use to
 * find the master and to notice a new one.
 *
 * <p>A daemon thread reads the leader key, then watches it from the next revision; when the stream
 * ends (etcd restarted, a member went away, the start revision was compacted) it backs off briefly,
 * reads the key again and watches anew, so no change is lost for good and a missed one is made up by
 * the read. {@link #refresh()} reads the key at once, for a caller that just lost its master and will
 * not wait for the watch to tell it. A value that does not parse is logged and read as "no leader".
 */
public final class LeaderWatch implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(LeaderWatch.class);
    private static final long MAX_BACKOFF_NANOS = Duration.ofSeconds(2).toNanos();

    private final EtcdTarget target;
    private final EtcdGateway etcd;
    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    private final List<Consumer<LeaderRecord>> listeners = new CopyOnWriteArrayList<>();
    private volatile LeaderRecord latest;
    private volatile boolean closed;
    private volatile EtcdGateway.Watch open;
    @GuardedBy("this")
    private Thread thread;

    public LeaderWatch(EtcdTarget target, Duration timeout) {
        this.target = target;
        this.etcd = new EtcdGateway(target.endpoints(), timeout);
    }

    public EtcdTarget target() {
        return target;
    }

    /** Starts following in the background (once). */
    public synchronized LeaderWatch start() {
        if (thread == null) {
            thread = Thread.ofPlatform().daemon().name("kvpool-etcd-leader-watch").start(this::follow);
        }
        return this;
    }

    /** Called with each new leader record (null: no leader), on the watch's thread. */
    public void onChange(Consumer<LeaderRecord> listener) {
        listeners.add(listener);
    }

    /** The leader as last seen, or null. */
    public LeaderRecord latest() {
        return latest;
    }

    /** Reads the leader key now. */
    public LeaderRecord refresh() throws EtcdException {
        EtcdGateway.Range r = etcd.range(target.leaderKey());
        LeaderRecord rec = parse(r.first());
        set(rec);
        return rec;
    }

    /**
     * Waits until the leader record satisfies {@code wanted} (for example, {@link LeaderRecord#ready()}),
     * reading the key once at once and then following the watch.
     *
     * @throws TimeoutException naming the key and the endpoints when none came within {@code timeout}
     */
    public LeaderRecord await(Predicate<LeaderRecord> wanted, Duration timeout)
            throws TimeoutException, InterruptedException {
        start();
        long deadline = System.nanoTime() + timeout.toNanos();
        try {
            LeaderRecord now = refresh();
            if (now != null && wanted.test(now)) {
                return now;
            }
        } catch (EtcdException e) {
            log.debug("reading {} failed: {}", target.leaderKey(), e.getMessage()); // the watch keeps trying
        }
        lock.lock();
        try {
            while (true) {
                LeaderRecord now = latest;
                if (now != null && wanted.test(now)) {
                    return now;
                }
                long left = deadline - System.nanoTime();
                if (left <= 0 || closed) {
                    throw new TimeoutException("no " + (now == null ? "leader" : "ready leader") + " at "
                            + target.leaderKey() + " in etcd " + target.endpoints() + " within " + timeout
                            + (now == null ? "" : " (the leader is " + now.id() + " at " + now.address()
                            + ", term " + now.term() + ", still rebuilding)"));
                }
                changed.awaitNanos(left);
            }
        } finally {
            lock.unlock();
        }
    }

    private void follow() {
        long backoff = Duration.ofMillis(100).toNanos();
        while (!closed) {
            try {
                EtcdGateway.Range r = etcd.range(target.leaderKey());
                set(parse(r.first()));
                try (EtcdGateway.Watch w = etcd.watch(target.leaderKey(), false, r.revision() + 1)) {
                    open = w;
                    if (closed) {
                        return;
                    }
                    backoff = Duration.ofMillis(100).toNanos();
                    for (List<EtcdGateway.Event> events = w.next(); events != null; events = w.next()) {
                        EtcdGateway.Event last = events.getLast();
                        set(last.deleted() ? null : parse(last.kv()));
                    }
                } finally {
                    open = null;
                }
            } catch (EtcdException e) {
                if (!closed) {
                    log.debug("following {} in etcd: {}", target.leaderKey(), e.getMessage());
                }
            } catch (RuntimeException e) {
                log.warn("following {} in etcd failed", target.leaderKey(), e);
            }
            if (closed) {
                return;
            }
            try {
                Thread.sleep(Duration.ofNanos(backoff));
            } catch (InterruptedException e) {
                return;
            }
            backoff = Math.min(MAX_BACKOFF_NANOS, backoff * 2);
        }
    }

    private LeaderRecord parse(EtcdGateway.KeyValue kv) {
        if (kv == null) {
            return null;
        }
        try {
            LeaderRecord rec = LeaderRecord.parse(kv.value());
            // the term is the key's create revision whatever the value says
            return rec.term() == kv.createRevision() ? rec
                    : new LeaderRecord(rec.id(), rec.address(), rec.http(), kv.createRevision(), rec.ready());
        } catch (IllegalArgumentException e) {
            log.warn("ignoring a malformed leader record at {}: {}", target.leaderKey(), e.getMessage());
            return null;
        }
    }

    private void set(LeaderRecord rec) {
        LeaderRecord before;
        lock.lock();
        try {
            before = latest;
            latest = rec;
            changed.signalAll();
        } finally {
            lock.unlock();
        }
        if (!Objects.equals(before, rec)) {
            for (Consumer<LeaderRecord> l : listeners) {
                try {
                    l.accept(rec);
                } catch (RuntimeException e) {
                    log.warn("a leader-change listener failed", e);
                }
            }
        }
    }

    @Override
    public void close() {
        closed = true;
        EtcdGateway.Watch w = open;
        if (w != null) {
            w.close();
        }
        Thread t;
        synchronized (this) {
            t = thread;
        }
        if (t != null) {
            t.interrupt();
        }
        lock.lock();
        try {
            changed.signalAll();
        } finally {
            lock.unlock();
        }
        etcd.close();
    }
}

package io.kvpool.master;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * Which standbys a write waits for before the leader acknowledges it, so that a standby promoted with its copy
 * lacks nothing the old leader acknowledged (docs/architecture.md, "Hot standby").
 *
 * <h2>The rule</h2>
 * A standby is <em>in sync</em> when the leader has published its id (to etcd, through the {@link Publisher})
 * as one that every acknowledged write waited for. The leader keeps one invariant:
 * <blockquote>while a standby is published, no write is acknowledged before that standby has read past the
 * write's records.</blockquote>
 * A standby acknowledges by asking for the next records: a FEED_FOLLOW from position p says it applied every
 * record below p ({@link #acked}). A write waits ({@link #await}) for every standby in {@code waitFor} to have
 * read past the feed's end as it was when the write's own records were in.
 *
 * <h2>Joining</h2>
 * A standby that reads near the end of the feed (within {@link #JOIN_LAG} records) is added to {@code waitFor} at
 * once, and its join mark is the feed's end read <em>after</em> that: a write acknowledged without waiting for it checked {@code waitFor}
 * before the add, so its records lie below the mark. Once the standby has read past its mark it is published:
 * from then on everything acknowledged is in its copy.
 *
 * <h2>Leaving</h2>
 * A standby that has not read past a write's records within the timeout is dropped: if it was published, the
 * set without it is published first (the write waits for that), and only then is the write acknowledged. A
 * publication that fails fails the write (the caller closes the connection: the client retries, and a leader
 * that cannot reach etcd loses its lease soon). A dropped standby joins again when it catches up.
 *
 * <p>With no standby in {@code waitFor} a write costs one volatile read here.
 */
final class SyncSet {

    private static final Logger log = LoggerFactory.getLogger(SyncSet.class);

    /** Makes a set of standby ids known to whoever elects the next leader. */
    @FunctionalInterface
    interface Publisher {
        void publish(Set<String> inSync) throws IOException;
    }

    /**
     * How far behind the feed's end a standby may read and still join: under steady writes a standby that keeps up
     * is a batch or two behind whenever it asks, never exactly at the end.
     */
    static final long JOIN_LAG = 1024;

    /** For a master nobody elects: there is no one to tell. */
    static final Publisher UNPUBLISHED = s -> { };

    private final LongSupplier feedEnd;
    private final Publisher publisher;
    private final long timeoutNanos;
    private final ReentrantLock publishing = new ReentrantLock();
    /** Every standby's acknowledged position (under this). */
    private final Map<String, Long> acked = new HashMap<>();
    /** Standbys writes wait for, and their join marks (Long.MIN_VALUE once published; under this). */
    private final Map<String, Long> waitFor = new HashMap<>();
    /** What the publisher last made known (under this). */
    private Set<String> published = Set.of();
    private volatile boolean anyone;
    /** Standbys dropped for being late, in all. */
    private long dropped;

    SyncSet(LongSupplier feedEnd, Publisher publisher, long timeoutNanos) {
        this.feedEnd = feedEnd;
        this.publisher = publisher;
        this.timeoutNanos = timeoutNanos;
    }

    /** Standby {@code id} asked for the records from {@code from}: it applied every one below. */
    void acked(String id, long from) throws IOException {
        if (id.isEmpty()) {
            return;
        }
        boolean publish;
        synchronized (this) {
            acked.merge(id, from, Math::max);
            Long mark = waitFor.get(id);
            if (mark == null && feedEnd.getAsLong() - from <= JOIN_LAG) {
                // from here on writes wait for it (a write that read anyone false before this wrote it had its
                // records in the feed before the end is read below: volatile and monitor actions are in one order)
                anyone = true;
                mark = feedEnd.getAsLong(); // what was acknowledged without it lies below this
                waitFor.put(id, mark);
            }
            publish = mark != null && mark != Long.MIN_VALUE && acked.get(id) >= mark;
            notifyAll();
        }
        if (publish) {
            republish();
        }
    }

    /** Waits until every standby writes wait for has read past {@code position}, dropping those that do not in time. */
    void await(long position) throws IOException {
        if (!anyone) {
            return;
        }
        long deadline = System.nanoTime() + timeoutNanos;
        Set<String> late = new HashSet<>();
        synchronized (this) {
            while (true) {
                late.clear();
                for (String id : waitFor.keySet()) {
                    if (acked.getOrDefault(id, -1L) < position) {
                        late.add(id);
                    }
                }
                long left = deadline - System.nanoTime();
                if (late.isEmpty() || left <= 0) {
                    break;
                }
                try {
                    wait(Math.max(1, left / 1_000_000));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new java.io.InterruptedIOException("waiting for standbys to read a write");
                }
            }
        }
        if (!late.isEmpty()) {
            drop(late, position);
        }
    }

    /** Drops the standbys in {@code late} that are still behind {@code position}: published ones leave etcd first. */
    private void drop(Set<String> late, long position) throws IOException {
        publishing.lock();
        try {
            Set<String> keep;
            synchronized (this) {
                late.removeIf(id -> !waitFor.containsKey(id) || acked.getOrDefault(id, -1L) >= position);
                if (late.isEmpty()) {
                    return;
                }
                keep = new TreeSet<>(published);
                keep.removeAll(late);
            }
            if (!keep.equals(published())) {
                publisher.publish(keep);
            }
            synchronized (this) {
                published = Set.copyOf(keep);
                waitFor.keySet().removeAll(late);
                anyone = !waitFor.isEmpty();
                dropped += late.size();
                notifyAll();
            }
            log.warn("standbys {} left the sync set: they had not read a write within {} ms (they join again once"
                    + " they catch up)", late, timeoutNanos / 1_000_000);
        } finally {
            publishing.unlock();
        }
    }

    /** Publishes every standby past its join mark (a failure leaves it joined but unpublished; it tries again). */
    private void republish() throws IOException {
        publishing.lock();
        try {
            Set<String> next = new TreeSet<>();
            synchronized (this) {
                for (Map.Entry<String, Long> e : waitFor.entrySet()) {
                    if (e.getValue() == Long.MIN_VALUE || acked.getOrDefault(e.getKey(), -1L) >= e.getValue()) {
                        next.add(e.getKey());
                    }
                }
            }
            if (next.equals(published())) {
                return;
            }
            publisher.publish(next);
            log.info("standbys in sync: {}", next);
            synchronized (this) {
                published = Set.copyOf(next);
                for (String id : next) {
                    waitFor.replace(id, Long.MIN_VALUE);
                }
            }
        } finally {
            publishing.unlock();
        }
    }

    /** The standbys made known as in sync. */
    synchronized Set<String> published() {
        return published;
    }

    /** Standbys dropped for being late. */
    synchronized long dropped() {
        return dropped;
    }
}

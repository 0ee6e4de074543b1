package io.kvpool.etcd;

import com.fasterxml.jackson.databind.ObjectMapper;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.LongSupplier;

/**
 * One master's candidacy: it lists itself under {@link EtcdTarget#mastersPrefix()}, waits for the
 * leader key to be free, and takes it; then it holds the leadership until its etcd lease is lost.
 *
 * <h2>How leadership is won and lost</h2>
 * <ul>
 *   <li>The candidate holds one etcd lease (TTL {@code ttl}, at least 2 s in etcd) for as long as it
 *       runs, renewed every third of the TTL by its own thread. Its registry entry and, once it leads,
 *       the leader key are attached to that lease, so both vanish when the process dies.</li>
 *   <li>It takes the leader key with a transaction that creates the key only if it is absent: no two
 *       candidates can both succeed, and no candidate ever blocks on etcd (while the key is held, it
 *       watches it and tries again when it is deleted). The term is the key's create revision.</li>
 *   <li>The leadership is <em>valid</em> until a local deadline: the time a renewal was sent plus the
 *       TTL etcd answered. etcd counts the lease from when it receives the renewal, later than the
 *       sending, so the local deadline passes first: a leader stops serving before another can be
 *       elected. A process paused past its deadline (SIGSTOP, a long GC) finds it passed when it
 *       resumes and serves nothing more; the nodes refuse its term anyway (docs/architecture.md).</li>
 *   <li>The leadership is lost when a renewal answers that the lease is gone, when renewals fail until
 *       the deadline passes, or when the leader key is deleted or re-created by someone else. Then the
 *       listeners run, once, and the candidate may campaign again with a fresh lease.</li>
 * </ul>
 * The clock is injected ({@code nanoTime}) so the deadline logic is tested without waiting.
 */
public final class Election implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(Election.class);
    private static final ObjectMapper JSON = new ObjectMapper();

    private final EtcdTarget target;
    private final EtcdGateway etcd;
    private final String id;
    private final String address;
    private final String http;
    private final Duration ttl;
    private final LongSupplier nanoTime;
    private volatile boolean closed;
    private volatile Leadership current;
    private volatile EtcdGateway.Watch waiting;

    public Election(EtcdTarget target, String id, String address, String http, Duration ttl, LongSupplier nanoTime) {
        if (ttl.toSeconds() < 1) {
            throw new IllegalArgumentException("the leader lease TTL must be at least 1 s, got " + ttl);
        }
        this.target = target;
        this.etcd = new EtcdGateway(target.endpoints(), Duration.ofMillis(Math.max(500, ttl.toMillis() / 3)));
        this.id = id;
        this.address = address;
        this.http = http == null ? "" : http;
        this.ttl = ttl;
        this.nanoTime = nanoTime;
    }

    public EtcdGateway etcd() {
        return etcd;
    }

    /**
     * Campaigns until this candidate leads (returns its leadership, not yet ready) or the election is
     * closed (returns null). etcd being unreachable is retried, logged once per outage.
     */
    public Leadership campaign() throws InterruptedException {
        boolean outage = false;
        while (!closed) {
            Leadership l = null;
            try {
                l = new Leadership(etcd.grantLease(ttl.toSeconds()), nanoTime.getAsLong());
                registry(l, "standby");
                while (!closed && l.valid()) {
                    EtcdGateway.Txn t = etcd.createIfAbsent(target.leaderKey(),
                            new LeaderRecord(id, address, http, 0, false).toJson(), l.lease.id());
                    if (t.succeeded()) {
                        l.won(t.revision());
                        etcd.putIfCreated(target.leaderKey(), t.revision(),
                                new LeaderRecord(id, address, http, t.revision(), false).toJson(), l.lease.id());
                        registry(l, "leader");
                        current = l;
                        log.info("master {}: leader of {} at term {}", id, target, l.term);
                        return l;
                    }
                    waitForVacancy(t);
                }
            } catch (EtcdException e) {
                if (!outage && !closed) {
                    log.warn("master {}: campaigning in etcd {}: {}; retrying", id, target.endpoints(), e.getMessage());
                    outage = true;
                }
                Thread.sleep(Math.max(200, ttl.toMillis() / 4));
            } finally {
                if (l != null && current != l) {
                    l.stop(false);
                }
            }
        }
        return null;
    }

    /** Watches the leader key until it is deleted (or the watch ends, or our own lease is at risk). */
    private void waitForVacancy(EtcdGateway.Txn t) throws EtcdException {
        if (t.current() == null) {
            return; // deleted between the compare and the read: try again at once
        }
        try (EtcdGateway.Watch w = etcd.watch(target.leaderKey(), false, t.revision() + 1)) {
            waiting = w;
            if (closed) {
                return;
            }
            for (List<EtcdGateway.Event> events = w.next(); events != null; events = w.next()) {
                for (EtcdGateway.Event e : events) {
                    if (e.deleted()) {
                        return;
                    }
                }
            }
        } finally {
            waiting = null;
        }
    }

    private void registry(Leadership l, String role) throws EtcdException {
        byte[] v = JSON.createObjectNode().put("id", id).put("address", address).put("http", http).put("role", role)
                .toString().getBytes(StandardCharsets.UTF_8);
        etcd.put(target.mastersPrefix() + id, v, l.lease.id());
    }

    /** The leadership currently held, or null. */
    public Leadership current() {
        Leadership l = current;
        return l != null && l.valid() ? l : null;
    }

    /**
     * One leadership (or, before {@link #campaign} returns it, one candidacy): a lease kept alive by
     * its own thread, a deadline, and the listeners to run when it is lost.
     */
    public final class Leadership {
        private final EtcdGateway.Lease lease;
        private final List<Runnable> onLost = new CopyOnWriteArrayList<>();
        private final Thread keeper;
        private volatile long deadline;
        private volatile long term = -1;
        private volatile boolean lost;
        private volatile EtcdGateway.Watch ownKey;

        private Leadership(EtcdGateway.Lease lease, long grantSentAt) {
            this.lease = lease;
            this.deadline = grantSentAt + Duration.ofSeconds(lease.ttlSeconds()).toNanos();
            this.keeper = Thread.ofPlatform().daemon().name("kvpool-etcd-lease-" + id).start(this::keepAlive);
        }

        private void won(long t) {
            term = t;
            Thread.ofPlatform().daemon().name("kvpool-etcd-leader-key-" + id).start(this::watchOwnKey);
        }

        /** The term: the leader key's create revision (-1 while only a candidate). */
        public long term() {
            return term;
        }

        /** True while the lease is certainly alive by the local clock and nothing said it was lost. */
        public boolean valid() {
            return !lost && nanoTime.getAsLong() - deadline < 0;
        }

        /** Runs {@code r} once when this leadership is lost (at once if it already is). */
        public void onLost(Runnable r) {
            onLost.add(r);
            if (lost) {
                r.run();
            }
        }

        /** Publishes that this leader serves: the leader record with {@code ready: true}. */
        public void markReady() throws EtcdException {
            EtcdGateway.Txn t = etcd.putIfCreated(target.leaderKey(), term,
                    new LeaderRecord(id, address, http, term, true).toJson(), lease.id());
            if (!t.succeeded()) {
                stop(true);
                throw new EtcdException("the leader key of term " + term + " is gone; leadership lost");
            }
        }

        /** Gives the leadership up: deletes the leader key (if still ours) and revokes the lease. */
        public void resign() {
            stop(true);
            try {
                if (term > 0) {
                    etcd.deleteIfCreated(target.leaderKey(), term);
                }
                etcd.revoke(lease.id());
            } catch (EtcdException e) {
                log.warn("master {}: resigning term {}: {} (the lease expires by itself)", id, term, e.getMessage());
            }
        }

        private void keepAlive() {
            long every = Math.max(Duration.ofMillis(100).toNanos(), Duration.ofSeconds(lease.ttlSeconds()).toNanos() / 3);
            while (!lost) {
                try {
                    Thread.sleep(Duration.ofNanos(every));
                } catch (InterruptedException e) {
                    return;
                }
                if (lost) {
                    return;
                }
                long sent = nanoTime.getAsLong();
                try {
                    long left = etcd.keepAlive(lease.id());
                    if (left <= 0) {
                        log.warn("master {}: etcd lease {} is gone{}", id, Long.toHexString(lease.id()),
                                term > 0 ? "; stepping down from term " + term : "");
                        stop(true);
                        return;
                    }
                    deadline = sent + Duration.ofSeconds(left).toNanos();
                } catch (EtcdException e) {
                    if (!valid()) {
                        log.warn("master {}: could not renew etcd lease before it ran out ({}){}", id, e.getMessage(),
                                term > 0 ? "; stepping down from term " + term : "");
                        stop(true);
                        return;
                    }
                }
            }
        }

        /** Ends leadership if the leader key is deleted or re-created by anyone else. */
        private void watchOwnKey() {
            long from = term + 1;
            while (!lost) {
                try (EtcdGateway.Watch w = etcd.watch(target.leaderKey(), false, from)) {
                    ownKey = w;
                    if (lost) {
                        return;
                    }
                    for (List<EtcdGateway.Event> events = w.next(); events != null; events = w.next()) {
                        for (EtcdGateway.Event e : events) {
                            if (e.deleted() || e.kv().createRevision() != term) {
                                log.warn("master {}: the leader key of term {} was {}; stepping down", id, term,
                                        e.deleted() ? "deleted" : "replaced");
                                stop(true);
                                return;
                            }
                        }
                    }
                    from = Math.max(from, w.revision() + 1);
                } catch (EtcdException e) {
                    // the lease keeper decides when etcd being away costs the leadership
                } finally {
                    ownKey = null;
                }
                try {
                    Thread.sleep(200);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }

        private void stop(boolean notify) {
            boolean first;
            synchronized (this) {
                first = !lost;
                lost = true;
            }
            if (!first) {
                return;
            }
            keeper.interrupt();
            EtcdGateway.Watch w = ownKey;
            if (w != null) {
                w.close();
            }
            if (notify) {
                for (Runnable r : onLost) {
                    try {
                        r.run();
                    } catch (RuntimeException e) {
                        log.warn("a leadership-lost listener failed", e);
                    }
                }
            }
        }
    }

    @Override
    public void close() {
        closed = true;
        EtcdGateway.Watch w = waiting;
        if (w != null) {
            w.close();
        }
        Leadership l = current;
        if (l != null) {
            l.resign();
        }
        etcd.close();
    }
}

package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.HostPort;
import io.kvpool.etcd.Election;
import io.kvpool.etcd.EtcdException;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import io.kvpool.etcd.StandbysInSync;
import io.kvpool.protocol.msg.MasterMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import com.sun.net.httpserver.HttpServer;
import io.kvpool.web.StatusPages;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.InstantSource;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.random.RandomGenerator;

/**
 * A master that serves only while elected: one of several processes given the same etcd target,
 * of which one leads and the others stand by.
 *
 * <h2>One leadership</h2>
 * <ol>
 *   <li>Campaign ({@link Election}) until this process holds the leader key; its term is the key's
 *       create revision.</li>
 *   <li>Start a fresh {@link MasterServer} for that term, serving only while the leadership is valid
 *       (a request after that closes its connection). Its state starts empty, as after a restart:
 *       nodes find the new leader in etcd, register, and list their objects, and the master
 *       rebuilds from them.</li>
 *   <li>Wait until every node the previous leader listed in etcd ({@link EtcdTarget#nodesPrefix()})
 *       has registered, or the rebuild grace passed, then publish {@code ready}: clients connect
 *       only now, so a client never sees a pool that is still filling up from its nodes' lists.</li>
 *   <li>While leading, keep the node list in etcd in step with the registered segments.</li>
 *   <li>When the leadership is lost (lease gone, etcd unreachable past the lease, key deleted), close
 *       that server at once and campaign again with a fresh, empty state.</li>
 * </ol>
 * Standbys hold nothing but their candidacy (and a standby page on the HTTP port, {@link StandbyPages}),
 * so they cost nothing while waiting; a failover costs
 * the old lease's expiry plus the nodes' registration (measured in docs/benchmarks.md).
 */
public final class ElectedMaster implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(ElectedMaster.class);

    /**
     * How this master takes part in the election.
     *
     * @param etcd          where the masters are elected
     * @param id            this master's name among them (unique per cluster)
     * @param advertiseHost the host nodes and clients reach this master at
     * @param leaseTtl      the leader's etcd lease: how long a dead leader keeps the role (etcd grants at least 2 s)
     * @param rebuildGrace  how long a new leader waits for the previous leader's nodes before it serves anyway
     */
    public record Options(EtcdTarget etcd, String id, String advertiseHost, Duration leaseTtl, Duration rebuildGrace,
                          boolean hotStandby) {
        public static final Duration DEFAULT_LEASE_TTL = Duration.ofSeconds(2);
        public static final Duration DEFAULT_REBUILD_GRACE = Duration.ofSeconds(3);

        /** Without a hot standby: a new leader rebuilds from the nodes. */
        public Options(EtcdTarget etcd, String id, String advertiseHost, Duration leaseTtl, Duration rebuildGrace) {
            this(etcd, id, advertiseHost, leaseTtl, rebuildGrace, false);
        }

        public Options {
            if (id == null || !id.matches("[A-Za-z0-9._-]{1,64}")) {
                throw new IllegalArgumentException("master id '" + id + "' must be 1 to 64 letters, digits, '.', '_' or '-'");
            }
            if (leaseTtl.compareTo(Duration.ofSeconds(1)) < 0 || leaseTtl.compareTo(Duration.ofMinutes(1)) > 0) {
                throw new IllegalArgumentException("leader lease (--leader-lease) must be between 1s and 1m, got " + leaseTtl);
            }
            if (rebuildGrace.isNegative()) {
                throw new IllegalArgumentException("rebuild grace must not be negative, got " + rebuildGrace);
            }
        }
    }

    /** How often the leader compares its registered segments with the node list it published. */
    static final Duration NODE_LIST_SYNC = Duration.ofMillis(200);

    private final MasterConfig config;
    private final Options options;
    /** The node list as this leader last published it (null: read it from etcd first). */
    private Set<String> published;
    /** The owed list last written to etcd (null: write it at the next sync). */
    private Set<String> publishedOwed;
    private final Election election;
    /** The HTTP port, for the process's life: the leader's pages while leading, the standby's between. */
    private final HttpServer http;
    /** The standby's pages while mounted, else null (changed by the runner thread, in standbyPages). */
    @GuardedBy("this")
    private StandbyPages standby;
    private final Thread runner;
    /** The leader record as etcd has it (hot standby: whom to follow, and whose port to check when it is gone). */
    private final LeaderWatch watch;
    /** While standing by with a hot standby: the copy of the leader's metadata being kept. */
    private volatile Follower follower;
    private final CountDownLatch firstServing = new CountDownLatch(1);
    private volatile MasterServer server;
    private volatile long term;
    private volatile boolean closed;

    public ElectedMaster(MasterConfig config, Options options) {
        if (config.port() == 0 || config.httpPort() == 0) {
            throw new IllegalArgumentException("an elected master needs fixed ports (--port, --http-port), not 0:"
                    + " its address is published in etcd before it serves");
        }
        this.config = config;
        this.options = options;
        String address = new HostPort(options.advertiseHost(), config.port()).toString();
        String http = config.httpPort() < 0 ? "" : new HostPort(options.advertiseHost(), config.httpPort()).toString();
        this.election = new Election(options.etcd(), options.id(), address, http, options.leaseTtl(), System::nanoTime);
        HttpServer h = null;
        if (config.httpPort() >= 0) {
            try {
                h = StatusPages.listen("master " + options.id(), config.listenHost(), config.httpPort());
            } catch (IOException e) {
                election.close();
                throw new UncheckedIOException(e);
            }
            standby = StandbyPages.mount(h, options.id(), options.etcd(), election.etcd(), () -> follower);
            h.start();
        }
        this.http = h;
        this.watch = options.hotStandby() ? new LeaderWatch(options.etcd(), options.leaseTtl()).start() : null;
        this.runner = Thread.ofPlatform().name("kvpool-master-election").start(this::run);
    }

    /** The server while this master leads, else null. */
    public MasterServer server() {
        return server;
    }

    /** The term of the current leadership, or 0 while standing by. */
    public long term() {
        return server == null ? 0 : term;
    }

    /** Waits until this master leads and serves; false on timeout. */
    public boolean awaitServing(Duration timeout) throws InterruptedException {
        return firstServing.await(timeout.toNanos(), TimeUnit.NANOSECONDS) && server != null;
    }

    private void run() {
        while (!closed) {
            Election.Leadership l;
            if (watch != null) {
                follower = new Follower(options.id(), new StandbyCopy(new ObjectIndex()), this::leaderToFollow,
                        config.limits(), config.secrets(), this::leaderGone);
            }
            try {
                l = election.campaign();
            } catch (InterruptedException e) {
                l = null;
            }
            if (l == null) {
                Follower f = follower;
                if (f != null) {
                    f.close();
                }
                return;
            }
            StandbyCopy copy = promotable(l.term());
            try {
                // before anything is acknowledged under this term: no standby is in sync with it yet, so a standby
                // still holding a copy of the leader before cannot take over from it after this one wrote
                keepStandbys(l, Set.of());
            } catch (IOException e) {
                log.error("master {}: elected at term {} but cannot reset the standbys in sync in etcd ({}); resigning",
                        options.id(), l.term(), e.getMessage());
                l.resign();
                sleepQuietly(options.leaseTtl());
                continue;
            }
            CountDownLatch lost = new CountDownLatch(1);
            l.onLost(lost::countDown);
            MasterServer s;
            try {
                // segments the previous leader owed frees to come back empty, before any registers with us
                Set<String> owed = listed(options.etcd().owedPrefix());
                if (!owed.isEmpty()) {
                    log.warn("master {}: the previous leader owed frees to (or remembered lost objects on) {}; they come back empty", options.id(), owed);
                }
                standbyPages(false);
                s = new MasterServer(config.withTerm(l.term()).withTenants(tenants()), InstantSource.system(),
                        RandomGenerator.getDefault(), l::valid, owed, http, copy);
                Election.Leadership held = l;
                s.keepTenantsIn(t -> keepTenants(held, t));
                s.service().feed.publishSyncTo(ids -> keepStandbys(held, ids), FeedSource.DEFAULT_SYNC_TIMEOUT);
            } catch (IOException | RuntimeException e) {
                standbyPages(true);
                log.error("master {}: elected at term {} but cannot serve: {}; resigning", options.id(), l.term(),
                        e.getMessage());
                l.resign();
                sleepQuietly(options.leaseTtl());
                continue;
            }
            term = l.term();
            server = s;
            published = null;
            publishedOwed = null;
            try {
                // a promoted standby serves at once: its copy lists every node the previous leader had
                long waited = copy != null ? 0 : awaitPreviousNodes(s, l);
                l.markReady();
                log.info("master {}: serving as leader at term {} ({} objects from {} segments after {} ms)",
                        options.id(), l.term(), s.service().keyCount(), s.service().segmentInfos().size(), waited);
                firstServing.countDown();
                while (!closed && !lost.await(NODE_LIST_SYNC.toMillis(), TimeUnit.MILLISECONDS)) {
                    syncNodeList(s);
                    syncOwed(s);
                }
            } catch (EtcdException e) {
                log.warn("master {}: term {}: {}", options.id(), l.term(), e.getMessage());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                server = null;
                if (!closed) {
                    log.warn("master {}: lost the leadership of term {}; stopped serving, standing by again",
                            options.id(), l.term());
                }
                s.close();
                if (closed) {
                    l.resign();
                } else {
                    standbyPages(true);
                }
            }
            if (Thread.currentThread().isInterrupted()) {
                return;
            }
        }
    }

    /** The leader to follow as a hot standby: the one etcd names, unless it is this master. */
    private HostPort leaderToFollow() {
        LeaderRecord r = watch.latest();
        return r == null || r.id().equals(options.id()) ? null : HostPort.parse(r.address());
    }

    /**
     * The follower found the leader's port refusing connections: its process is gone, so its key need not wait
     * for the lease to run out. Deleted only if it is still that leadership's (its create revision is the term).
     */
    private void leaderGone(HostPort at) {
        LeaderRecord r = watch.latest();
        Follower f = follower;
        // only the leadership this standby followed, at the address it followed it on: a leader just elected has
        // published its address before its port listens, and must not lose its key for that
        if (r == null || f == null || r.id().equals(options.id()) || r.term() != f.term()
                || !HostPort.parse(r.address()).equals(at)) {
            return;
        }
        try {
            if (election.etcd().deleteIfCreated(options.etcd().leaderKey(), r.term()).succeeded()) {
                log.warn("master {}: leader {} of term {} is gone (its port {} refuses connections); its key deleted"
                        + " without waiting for its lease", options.id(), r.id(), r.term(), at);
            }
        } catch (EtcdException e) {
            log.info("master {}: could not delete the gone leader's key ({}); its lease will", options.id(),
                    e.getMessage());
        }
    }

    /**
     * Stops following and returns the copy when this master may serve from it: it was following the leader of
     * the term before {@code term}, whole, and that leader named it in sync in etcd ({@link SyncSet}). Else null
     * (the new leader rebuilds from the nodes).
     */
    private StandbyCopy promotable(long term) {
        Follower f = follower;
        follower = null;
        if (f == null) {
            return null;
        }
        f.close();
        if (f.term() == 0) {
            return null; // it never followed a leader: the first one, or one with nobody to take over from
        }
        if (!f.following()) {
            log.warn("master {}: elected at term {} with no whole copy of the previous leader; rebuilding from the"
                    + " nodes", options.id(), term);
            return null;
        }
        try {
            StandbysInSync named = StandbysInSync.read(election.etcd(), options.etcd());
            if (named != null && named.names(f.term(), options.id())) {
                log.info("master {}: elected at term {}; serving from its copy of term {} ({} objects)", options.id(),
                        term, f.term(), f.copy().objects());
                return f.copy();
            }
            log.warn("master {}: elected at term {}, but the leader of term {} did not name it in sync ({});"
                    + " rebuilding from the nodes", options.id(), term, f.term(), named);
        } catch (EtcdException | IllegalArgumentException e) {
            log.warn("master {}: cannot read the standbys in sync ({}); rebuilding from the nodes", options.id(),
                    e.getMessage());
        }
        return null;
    }

    /** Names the standbys in sync in etcd, under this leadership's term (SyncSet's publisher). */
    private void keepStandbys(Election.Leadership l, Set<String> ids) throws IOException {
        if (!l.valid()) {
            throw new IOException("this master is no longer the leader");
        }
        try {
            election.etcd().put(options.etcd().standbysKey(), new StandbysInSync(l.term(), ids).toBytes(), 0);
        } catch (EtcdException e) {
            throw new IOException("etcd: " + e.getMessage(), e);
        }
    }

    /** Mounts or takes off the standby's pages (no HTTP port: nothing to do). */
    private synchronized void standbyPages(boolean on) {
        if (http == null || closed) {
            return;
        }
        if (on && standby == null) {
            standby = StandbyPages.mount(http, options.id(), options.etcd(), election.etcd(), () -> follower);
        } else if (!on && standby != null) {
            standby.unmount();
            standby = null;
        }
    }

    /**
     * Waits (up to the rebuild grace) until every node listed in etcd by the previous leader has
     * registered with {@code s}; returns the milliseconds waited.
     */
    private long awaitPreviousNodes(MasterServer s, Election.Leadership l) throws InterruptedException {
        long start = System.nanoTime();
        Set<String> expected = listed(options.etcd().nodesPrefix()); // unreadable: serve without waiting
        long deadline = start + options.rebuildGrace().toNanos();
        while (!expected.isEmpty() && l.valid() && System.nanoTime() < deadline) {
            Set<String> active = new HashSet<>();
            for (MasterMessages.SegmentInfo seg : s.service().segmentInfos()) {
                if (seg.state() == MasterMessages.SegmentInfo.STATE_ACTIVE) {
                    active.add(seg.name());
                }
            }
            if (active.containsAll(expected)) {
                break;
            }
            Thread.sleep(20);
        }
        if (!expected.isEmpty()) {
            syncNodeList(s);
        }
        return (System.nanoTime() - start) / 1_000_000;
    }

    /** The names listed under {@code prefix} in etcd; empty (and a warning) when etcd cannot be read. */
    private Set<String> listed(String prefix) {
        Set<String> names = new HashSet<>();
        try {
            for (EtcdGateway.KeyValue kv : election.etcd().rangePrefix(prefix).kvs()) {
                names.add(kv.key().substring(prefix.length()));
            }
        } catch (EtcdException e) {
            log.warn("master {}: cannot read {} ({})", options.id(), prefix, e.getMessage());
        }
        return names;
    }

    /** The tenants a PUT set at run time, kept in etcd; the flags' when none was. */
    private List<Tenant> tenants() {
        try {
            EtcdGateway.Range r = election.etcd().range(options.etcd().tenantsKey());
            if (!r.kvs().isEmpty()) {
                return Tenant.fromJson(new String(r.first().value(), StandardCharsets.UTF_8));
            }
        } catch (EtcdException e) {
            log.warn("master {}: cannot read the tenants kept in etcd ({}); taking the flags'", options.id(), e.getMessage());
        } catch (IllegalArgumentException e) {
            log.error("master {}: the tenants kept in etcd are not readable ({}); taking the flags'", options.id(),
                    e.getMessage());
        }
        return config.tenants();
    }

    /** Keeps a tenant list PUT at run time for the next leader; refused when this master no longer leads. */
    private void keepTenants(Election.Leadership l, List<Tenant> t) throws IOException {
        if (!l.valid()) {
            throw new IOException("this master is no longer the leader");
        }
        try {
            election.etcd().put(options.etcd().tenantsKey(), Tenant.toJson(t).getBytes(StandardCharsets.UTF_8), 0);
        } catch (EtcdException e) {
            throw new IOException("etcd: " + e.getMessage(), e);
        }
    }

    /** Makes the owed list in etcd this leader's ({@link UndeliveredFrees}), when it changed. */
    private void syncOwed(MasterServer s) {
        Set<String> owed = s.owedSegments();
        if (owed.equals(publishedOwed)) {
            return;
        }
        try {
            publish(options.etcd().owedPrefix(), owed);
            publishedOwed = owed;
        } catch (EtcdException e) {
            log.debug("master {}: owed list not synced: {}", options.id(), e.getMessage());
        }
    }

    /** Puts and deletes keys under {@code prefix} so that exactly {@code names} are listed. */
    private void publish(String prefix, Set<String> names) throws EtcdException {
        Set<String> listed = new HashSet<>();
        for (EtcdGateway.KeyValue kv : election.etcd().rangePrefix(prefix).kvs()) {
            listed.add(kv.key().substring(prefix.length()));
        }
        for (String name : names) {
            if (!listed.contains(name)) {
                election.etcd().put(prefix + name, name.getBytes(StandardCharsets.UTF_8), 0);
            }
        }
        for (String name : listed) {
            if (!names.contains(name)) {
                election.etcd().delete(prefix + name);
            }
        }
    }

    /**
     * Makes the node list in etcd the registered segments (what the next leader waits for); touches
     * etcd only when the set changed since it last did.
     */
    private void syncNodeList(MasterServer s) {
        Set<String> active = new HashSet<>();
        for (MasterMessages.SegmentInfo seg : s.service().segmentInfos()) {
            // a draining node is restarting: the next leader waits for it as for any other
            if (seg.state() != MasterMessages.SegmentInfo.STATE_JOINING) {
                active.add(seg.name());
            }
        }
        if (active.equals(published)) {
            return;
        }
        try {
            publish(options.etcd().nodesPrefix(), active);
            published = active;
        } catch (EtcdException e) {
            log.debug("master {}: node list not synced: {}", options.id(), e.getMessage());
        }
    }

    private static void sleepQuietly(Duration d) {
        try {
            Thread.sleep(d);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    @Override
    public void close() {
        closed = true;
        Follower f = follower;
        if (f != null) {
            f.close();
        }
        if (watch != null) {
            watch.close();
        }
        election.close();
        runner.interrupt();
        try {
            runner.join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        MasterServer s = server;
        if (s != null) {
            s.close();
        }
        if (http != null) {
            http.stop(0);
        }
    }
}

package io.kvpool.bench.soak;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.etcd.LeaderRecord;

import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.function.BooleanSupplier;

/**
 * The soak's faults, one at a time, on a {@link LocalPool}.
 *
 * <h2>Schedule</h2>
 * Each kind has a mean interval; its next event comes after a uniformly random 0.5 to 1.5 times
 * that, counted from the end of its previous one. Events never overlap: a node is never killed
 * during a partition or a failover, so the pool never faces two failures at once. When the soak's
 * duration is over, kinds that have not run yet run once before it stops, so every enabled kind is
 * exercised at least once whatever the timing.
 *
 * <h2>Kinds</h2>
 * <ul>
 *   <li><b>node-kill</b>: first waits (up to the repair deadline) until the pool is whole: every node
 *       registered and active, no relay cut, and the leader reporting no object below its copy count.
 *       Two failures before repair can lose data legitimately; this soak wants to see losses that are
 *       bugs. Then SIGKILL a random node; measure until the master drops it (detect) and until the
 *       copies it held are remade elsewhere (repair: the below-count gauge back to 0 after the
 *       master's repair counter moved, or at once when the node held nothing); keep it down for the
 *       configured time; restart it on its port (it adopts its shared-memory segment) and wait until
 *       it is active again.</li>
 *   <li><b>failover</b>: SIGKILL the leading master; measure until etcd names a new leader that is
 *       ready; restart the killed master as a standby.</li>
 *   <li><b>partition</b>: cut a random node's {@link Relay} (clients, masters and other nodes lose it;
 *       it keeps heartbeating), stalling or resetting at random, for the configured length; heal.</li>
 * </ul>
 * After each event the thread waits (up to 60 s) until traffic flows again (20 calls returned) and
 * records how long that took; a soak where it does not is failed.
 */
final class Chaos implements Runnable {

    enum Kind {
        NODE_KILL("node-kill"), FAILOVER("failover"), PARTITION("partition");

        final String label;

        Kind(String label) {
            this.label = label;
        }
    }

    /** Calls that must return after an event for traffic to count as flowing again. */
    private static final int RESUMED_CALLS = 20;
    private static final Duration RESUME_DEADLINE = Duration.ofSeconds(60);
    private static final Duration DETECT_DEADLINE = Duration.ofSeconds(60);

    private final SoakConfig config;
    private final LocalPool pool;
    private final KvPoolClient observer;
    private final SoakStats stats;
    private final long deadline;
    private final SplittableRandom rnd;
    private final Map<Kind, Duration> every = new EnumMap<>(Kind.class);
    private final Set<Kind> ran = EnumSet.noneOf(Kind.class);
    private volatile boolean stop;
    private volatile String now = "";
    private int overtimeSkips;
    private long callsAtStart;

    Chaos(SoakConfig config, LocalPool pool, KvPoolClient observer, SoakStats stats, long deadlineNanos) {
        this.config = config;
        this.pool = pool;
        this.observer = observer;
        this.stats = stats;
        this.deadline = deadlineNanos;
        this.rnd = new SplittableRandom(config.seed() ^ 0x5DEECE66DL);
        put(Kind.NODE_KILL, config.nodeKillEvery());
        put(Kind.FAILOVER, config.failoverEvery());
        put(Kind.PARTITION, config.partitionEvery());
    }

    private void put(Kind k, Duration d) {
        if (!d.isZero()) {
            every.put(k, d);
        }
    }

    boolean enabled() {
        return !every.isEmpty();
    }

    Set<Kind> kinds() {
        return every.keySet();
    }

    /** What the chaos thread is doing now, for the progress line. */
    String activity() {
        return now;
    }

    void stop() {
        stop = true;
    }

    private long nextAfter(Kind k, long from) {
        double f = 0.5 + rnd.nextDouble();
        return from + (long) (every.get(k).toNanos() * f);
    }

    @Override
    public void run() {
        Map<Kind, Long> due = new EnumMap<>(Kind.class);
        long t = System.nanoTime();
        for (Kind k : every.keySet()) {
            due.put(k, nextAfter(k, t));
        }
        while (!stop) {
            long nowNanos = System.nanoTime();
            Kind next = null;
            if (nowNanos >= deadline) {
                for (Kind k : every.keySet()) {
                    if (!ran.contains(k)) {
                        next = k;
                        break;
                    }
                }
                if (next == null) {
                    break;
                }
            } else {
                for (Kind k : every.keySet()) {
                    if (next == null || due.get(k) < due.get(next)) {
                        next = k;
                    }
                }
                long wait = Math.min(due.get(next), deadline) - nowNanos;
                if (wait > 0) {
                    now = "waiting";
                    pause(wait);
                    continue;
                }
            }
            boolean done = true;
            callsAtStart = stats.okCalls.sum();
            try {
                switch (next) {
                    case NODE_KILL -> done = nodeKill();
                    case FAILOVER -> failover();
                    case PARTITION -> partition();
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            } catch (Exception e) {
                stats.error("chaos: " + next.label + " could not be carried out", e.toString());
                stop = true;
            }
            if (done) {
                ran.add(next);
            } else if (System.nanoTime() >= deadline && ++overtimeSkips >= 3) {
                break; // the pool does not become whole: give up rather than run on forever
            }
            due.put(next, nextAfter(next, System.nanoTime()));
        }
        now = "done";
    }

    /** Kills, repairs and restarts a node; false when skipped (the pool was not whole). */
    private boolean nodeKill() throws Exception {
        now = "node-kill: waiting until the pool is whole";
        long waitStart = System.nanoTime();
        boolean whole = awaitWhole(config.repairDeadline());
        List<LocalPool.Node> candidates = new ArrayList<>();
        for (LocalPool.Node n : pool.nodes) {
            if (n.running()) {
                candidates.add(n);
            }
        }
        if (!whole) {
            // a kill now could be a second failure before repair, which may lose data legitimately
            stats.error("chaos: node-kill skipped, the pool was not whole", "waited "
                    + ms(System.nanoTime() - waitStart) + " ms for every node active and nothing below its count");
            return false;
        }
        LocalPool.Node victim = candidates.get(rnd.nextInt(candidates.size()));
        long onVictim = 0;
        for (PoolStats.SegmentStats s : observer.stats().segments()) {
            if (s.name().equals(victim.name())) {
                onVictim = s.objects();
            }
        }
        double copiesBefore = pool.metric("master_repair_copies_total");
        now = "node-kill: " + victim.name() + " killed";
        long t0 = System.nanoTime();
        LocalPool.kill9(victim.process);
        long detect = await(() -> !listed(victim.name()), DETECT_DEADLINE) ? ms(System.nanoTime() - t0) : -1;
        now = "node-kill: " + victim.name() + " down, repairing";
        long objects = onVictim;
        long repair = await(() -> {
            double under = pool.metric("master_objects_under_replicated");
            double copies = pool.metric("master_repair_copies_total");
            return under == 0 && (objects == 0 || copies > copiesBefore);
        }, config.repairDeadline()) ? ms(System.nanoTime() - t0) : -1;
        String n = onVictim + " objects on it";
        if (repair < 0) {
            n += "; repair not complete within " + config.repairDeadline().toSeconds() + " s";
            stats.error("chaos: repair not complete within the deadline", "after killing " + victim.name());
        }
        long downLeft = config.nodeDown().toNanos() - (System.nanoTime() - t0);
        if (downLeft > 0) {
            pause(downLeft);
        }
        now = "node-kill: restarting " + victim.name();
        pool.startNode(victim);
        if (!await(() -> active(victim.name()), DETECT_DEADLINE)) {
            n += "; not active again within " + DETECT_DEADLINE.toSeconds() + " s of its restart";
        }
        record(Kind.NODE_KILL, victim.name(), t0, detect, repair, n);
        return true;
    }

    private void failover() throws Exception {
        LeaderRecord old = pool.leader();
        LocalPool.Master m = pool.masters.get(old.id());
        now = "failover: leader " + old.id() + " killed";
        long t0 = System.nanoTime();
        LocalPool.kill9(m.process);
        long detect;
        String note;
        try {
            LeaderRecord next = pool.awaitLeader(r -> r.ready() && r.term() > old.term(), DETECT_DEADLINE);
            detect = ms(System.nanoTime() - t0);
            note = "new leader " + next.id() + " at term " + next.term();
        } catch (java.util.concurrent.TimeoutException e) {
            detect = -1;
            note = "no new leader within " + DETECT_DEADLINE.toSeconds() + " s";
            stats.error("chaos: no new leader", note);
        }
        now = "failover: restarting " + old.id();
        pool.startMaster(m);
        record(Kind.FAILOVER, old.id(), t0, detect, -1, note);
    }

    private void partition() throws Exception {
        List<LocalPool.Node> candidates = new ArrayList<>();
        for (LocalPool.Node n : pool.nodes) {
            if (n.running()) {
                candidates.add(n);
            }
        }
        LocalPool.Node victim = candidates.get(rnd.nextInt(candidates.size()));
        Relay.Mode mode = rnd.nextBoolean() ? Relay.Mode.STALL : Relay.Mode.RESET;
        now = "partition: " + victim.name() + " cut (" + mode.name().toLowerCase() + ")";
        long t0 = System.nanoTime();
        victim.relay.cut(mode);
        try {
            pause(config.partitionLength().toNanos());
        } finally {
            victim.relay.heal();
        }
        record(Kind.PARTITION, victim.name(), t0, -1, -1, mode.name().toLowerCase() + " for "
                + config.partitionLength().toMillis() + " ms");
    }

    /** Records an event and waits until traffic flows again. */
    private void record(Kind kind, String target, long t0, long detect, long repair, String note)
            throws InterruptedException {
        long end = System.nanoTime();
        long base = stats.okCalls.sum();
        now = kind.label + ": done, waiting for traffic";
        long resume = await(() -> stats.okCalls.sum() >= base + RESUMED_CALLS, RESUME_DEADLINE)
                ? ms(System.nanoTime() - end) : -1;
        if (resume < 0) {
            stats.error("chaos: traffic did not resume within " + RESUME_DEADLINE.toSeconds() + " s", kind.label
                    + " of " + target);
        }
        stats.event(new SoakStats.ChaosEvent(kind.label, target, t0, end, detect, repair, resume, note, callsAtStart,
                base));
    }

    /** The pool is whole: every node running, reachable, registered and active; nothing below its count. */
    boolean whole() {
        for (LocalPool.Node n : pool.nodes) {
            if (!n.running() || n.relay.isCut()) {
                return false;
            }
        }
        try {
            PoolStats s = observer.stats();
            long active = s.segments().stream().filter(PoolStats.SegmentStats::active).count();
            return active == pool.nodes.size() && pool.metric("master_objects_under_replicated") == 0;
        } catch (RuntimeException e) {
            return false;
        }
    }

    boolean awaitWhole(Duration deadline) throws InterruptedException {
        return await(this::whole, deadline);
    }

    private boolean listed(String name) {
        try {
            return observer.stats().segments().stream().anyMatch(s -> s.name().equals(name));
        } catch (RuntimeException e) {
            return true;
        }
    }

    private boolean active(String name) {
        try {
            return observer.stats().segments().stream().anyMatch(s -> s.name().equals(name) && s.active());
        } catch (RuntimeException e) {
            return false;
        }
    }

    private static boolean await(BooleanSupplier condition, Duration deadline) throws InterruptedException {
        long end = System.nanoTime() + deadline.toNanos();
        while (System.nanoTime() < end) {
            if (condition.getAsBoolean()) {
                return true;
            }
            Thread.sleep(100);
        }
        return condition.getAsBoolean();
    }

    private void pause(long nanos) {
        long end = System.nanoTime() + nanos;
        try {
            while (!stop && System.nanoTime() < end) {
                Thread.sleep(Math.min(200, Math.max(1, (end - System.nanoTime()) / 1_000_000)));
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stop = true;
        }
    }

    private static long ms(long nanos) {
        return nanos / 1_000_000;
    }
}

package io.kvpool.bench;

import io.kvpool.config.HostPort;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.Supplier;

/**
 * The {@code scale} section: one real master against {@link #NODES} simulated nodes ({@link ScaleNodes}) and
 * clients speaking the real protocol. Only metadata moves (the nodes store no bytes), so what is measured is
 * the master: heap per object, prefix lookups and commits per master core, the master time one heartbeat
 * costs, eviction, node loss and rejoin, a hot standby's catch-up and a failover at size.
 *
 * <p>Rates are per master core: the master's CPU time (user + system, from /proc) is sampled over each
 * measurement window, and the rate divided by the cores it used. On a machine with few cores the clients
 * and the master share them, so the absolute rate is what this machine reaches, and the rate per core is
 * what one core of master buys; both are reported.
 *
 * <p>Two parts:
 * <ol>
 *   <li>An elected master with a hot standby (etcd, two {@link FailoverMain} masters): fill, heap, lookups,
 *       commits, heartbeats, eviction, node loss and rejoin, the standby's catch-up, and the leader killed.</li>
 *   <li>Full mode only: a master alone filled as far as this machine's memory allows, heap measured on the
 *       way, lookups at that size; the heap of 100M objects is projected from the per-object cost.</li>
 * </ol>
 */
final class ScaleBench {

    static final int NODES = 1000;
    /** Keys in one prefix match: a 1,024-token prompt at 16 tokens a block. */
    static final int CHAIN = 64;
    /** Nodes that die (and come back) in the node-loss phase. */
    static final int LOST = 10;
    private static final Duration T = Duration.ofSeconds(30);

    /** Sizes and windows of one run. */
    record Plan(long objects, long bigObjects, Duration window, String heap, String bigHeap) {
    }

    /**
     * Quick: 1M objects, no second part. Full: 10M, then 50M in a master alone. KVPOOL_SCALE_OBJECTS and
     * KVPOOL_SCALE_BIG_OBJECTS (0: skip the second part) change the sizes, e.g. to find where a larger machine
     * ends; the heaps follow at 400 and 280 bytes an object.
     */
    static Plan plan(boolean quick) {
        long objects = Long.parseLong(System.getenv().getOrDefault("KVPOOL_SCALE_OBJECTS", quick ? "1000000" : "10000000"));
        long big = Long.parseLong(System.getenv().getOrDefault("KVPOOL_SCALE_BIG_OBJECTS", quick ? "0" : "50000000"));
        return new Plan(objects, big, Duration.ofSeconds(quick ? 1 : 3), heap(objects * 400), heap(big * 280));
    }

    private static String heap(long bytes) {
        return Math.max(1, (bytes + (1L << 30) - 1) >> 30) + "g";
    }

    static int steps(boolean quick) {
        return quick ? 1 : 2;
    }

    static void run(Results results, boolean quick, Runnable step) throws Exception {
        Plan p = plan(quick);
        FailoverBench.withCluster("kvpool-scale-bench", (processes, script, dir) -> elected(results, p, processes,
                script, dir));
        step.run();
        if (p.bigObjects() > 0) {
            alone(results, p);
            step.run();
        }
    }

    // ------------------------------------------------------------------ part 1: an elected master at size

    private static void elected(Results results, Plan p, List<Process> processes, Path script, Path dir)
            throws Exception {
        int etcdPort = FailoverBench.freePort();
        FailoverBench.run(List.of("bash", script.toString(), "start", dir.resolve("etcd").toString(), "" + etcdPort,
                "" + FailoverBench.freePort()));
        String url = "etcd://127.0.0.1:" + etcdPort + "/scale";
        long n = p.objects();
        String size = n >= 1_000_000 ? n / 1_000_000 + "M objects" : n / 1000 + "K objects";
        try (LeaderWatch watch = new LeaderWatch(EtcdTarget.parse(url), Duration.ofSeconds(2)).start()) {
            int http = FailoverBench.freePort();
            Process m1 = FailoverBench.start(p.heap(), FailoverMain.class, "master", url, "m1",
                    "" + FailoverBench.freePort(), "hot", "" + http);
            processes.add(m1);
            LeaderRecord first = watch.await(LeaderRecord::ready, Duration.ofSeconds(60));
            // null while no leader is known (between the old leader's key and the new one's)
            Supplier<HostPort> leader = () -> {
                LeaderRecord r = watch.latest();
                return r == null ? null : HostPort.parse(r.address());
            };
            double idle = idleCores(m1.pid(), p.window()); // the master's own timers, before any node
            long t0 = System.nanoTime();
            try (ScaleNodes nodes = new ScaleNodes(leader, NODES, capacityFor(n), Duration.ofSeconds(1))) {
                watch.onChange(r -> nodes.leaderChanged());
                row(results, "register nodes", NODES, Double.NaN, ms(t0) * 1000, String.format(Locale.ROOT,
                        "%d simulated nodes registered one after another in %.0f ms", NODES, ms(t0)));
                long base = heapAfterGc(m1.pid(), http);
                t0 = System.nanoTime();
                fill(leader, 0, n, 2);
                double fillRate = n / (ms(t0) / 1000);
                row(results, "batched put (fill)", 2, fillRate, Double.NaN, n + " objects in batches of "
                        + MetadataBench.PUT_BATCH + " (start+end), " + NODES + " nodes");
                double perObject = (heapAfterGc(m1.pid(), http) - base) / (double) n;
                row(results, "heap per object", 0, Double.NaN, Double.NaN, String.format(Locale.ROOT,
                        "%.1f B at %s (81-byte keys), elected master with hot standby on", perObject, size));
                results.checks.add(new Results.Check("scale: master heap per object at " + size, perObject, "B",
                        "<= 200 B", perObject <= 200, NODES + " nodes"));

                lookups(results, m1.pid(), leader, n, p.window(), size);
                AtomicLong next = new AtomicLong(n);
                commits(results, m1.pid(), leader, next, p.window(), size);
                heartbeats(results, m1.pid(), http, nodes, p.window(), idle);
                long stored = evict(results, http, leader, nodes, next.get(), n * 15 / 100);
                nodeLoss(results, http, nodes);

                // a standby started now catches up from a snapshot plus the stream
                t0 = System.nanoTime();
                int http2 = FailoverBench.freePort();
                Process m2 = FailoverBench.start(p.heap(), FailoverMain.class, "master", url, "m2",
                        "" + FailoverBench.freePort(), "hot", "" + http2);
                processes.add(m2);
                double started = ms(t0);
                FailoverBench.awaitInSync(url, "m2");
                double caughtUp = ms(t0);
                row(results, "standby catch-up", 0, Double.NaN, caughtUp * 1000, String.format(Locale.ROOT,
                        "%.0f ms from starting the standby's JVM until the leader named it in sync (%.0f ms after it"
                                + " was up), %s", caughtUp, caughtUp - started, size));
                failover(results, m1, http2, first, watch, leader, stored, size);
                nodes.check();
            }
        }
    }

    /** Each node's capacity: the objects fill 80% of the pool, below the 90% eviction watermark. */
    private static long capacityFor(long objects) {
        long region = ObjectLayout.regionLength(MetadataBench.key(0).length, MetadataBench.VALUE_BYTES);
        return (long) (objects * (double) region / 0.8 / NODES);
    }

    private static void lookups(Results results, long pid, Supplier<HostPort> leader, long stored, Duration window,
                                String size) throws Exception {
        for (boolean digests : new boolean[]{false, true}) {
            Saturation s = saturate(pid, 4, window, id -> {
                FrameConnection c = connect(leader.get());
                SplittableRandom rnd = new SplittableRandom(id * 31L + (digests ? 7 : 0));
                List<BodyWriter> bodies = new ArrayList<>();
                for (int b = 0; b < 64; b++) {
                    long start = rnd.nextLong(stored - CHAIN);
                    List<byte[]> keys = new ArrayList<>(CHAIN);
                    for (int k = 0; k < CHAIN; k++) {
                        keys.add(MetadataBench.key(start + k));
                    }
                    BodyWriter w = new BodyWriter(CHAIN * 90);
                    if (digests) {
                        DigestList.of(keys, 0, CHAIN).write(w);
                    } else {
                        new KeyList(keys).write(w);
                    }
                    bodies.add(w);
                }
                Opcode op = digests ? Opcode.PREFIX_MATCH_DIGEST : Opcode.PREFIX_MATCH;
                int[] i = {0};
                return () -> {
                    int matched = c.call(op, bodies.get(i[0]++ & 63), T).body().i32("matched");
                    if (matched != CHAIN) {
                        throw new IllegalStateException("a stored chain of " + CHAIN + " keys matched " + matched);
                    }
                    return CHAIN;
                };
            });
            String what = digests ? "prefixMatch by digests" : "prefixMatch";
            results.add(new Results.Row("scale", "kvpool", what, 0, 4, Double.NaN, s.rate(), Double.NaN, Double.NaN,
                    String.format(Locale.ROOT, "%d-key chains of stored keys at %s; ops/s = keys/s; %.0f keys/s per"
                                    + " master core (master used %.2f cores, the clients %.2f)", CHAIN, size,
                            s.perMasterCore(), s.masterCores(), s.ownCores())));
            results.checks.add(new Results.Check("scale: keys looked up per master core, " + what + " of " + CHAIN
                    + " at " + size, s.perMasterCore(), "keys/s", ">= 2,000,000", s.perMasterCore() >= 2_000_000,
                    String.format(Locale.ROOT, "%.0f keys/s on %.2f master cores", s.rate(), s.masterCores())));
        }
    }

    private static void commits(Results results, long pid, Supplier<HostPort> leader, AtomicLong next, Duration window,
                                String size) throws Exception {
        Saturation s = saturate(pid, 4, window, id -> {
            FrameConnection c = connect(leader.get());
            return () -> {
                MetadataBench.putBatch(c, next.getAndAdd(CHAIN), CHAIN);
                return CHAIN;
            };
        });
        results.add(new Results.Row("scale", "kvpool", "commits (batched put of " + CHAIN + ")", 0, 4, Double.NaN,
                s.rate(), Double.NaN, Double.NaN, String.format(Locale.ROOT, "put_start + put_end of %d new objects a"
                                + " call at %s; ops/s = objects/s; %.0f objects/s per master core (master used %.2f"
                                + " cores, the clients %.2f)", CHAIN, size, s.perMasterCore(), s.masterCores(),
                        s.ownCores())));
    }

    /** The cores the master uses over {@code window} doing whatever it does unasked. */
    private static double idleCores(long pid, Duration window) throws Exception {
        double cpu = cpuSeconds(pid);
        long t0 = System.nanoTime();
        Thread.sleep(window);
        return (cpuSeconds(pid) - cpu) / (ms(t0) / 1000);
    }

    /** The pace of the paced heartbeat rounds: each of the 1,000 nodes every 25 ms, 40,000 a second in all. */
    static final Duration PACED_PERIOD = Duration.ofMillis(25);

    /**
     * The master time a heartbeat costs, three ways:
     * <ul>
     *   <li>every node heartbeating back to back, full heartbeats only (CPU over heartbeats: throughput cost, the
     *       master's frame handling and its share of the kernel's TCP work included);</li>
     *   <li>every node at a fast steady pace ({@link #PACED_PERIOD}), as {@code MasterLink} heartbeats (one full
     *       heartbeat in five, beacons between), and the same pace with full heartbeats only, alternating, two
     *       rounds each: the master's CPU over what the nodes sent, and the frames the frame loop read per read
     *       (at 1.0 nothing arrived bunched, so no read served two frames);</li>
     *   <li>at the nodes' real pace of one a second (the CPU above the master's idle {@code idleCores}, measured
     *       before any node registered, over heartbeats: each one then also wakes the master's threads).</li>
     * </ul>
     */
    private static void heartbeats(Results results, long pid, int http, ScaleNodes nodes, Duration window,
                                   double idleCores) throws Exception {
        Thread.sleep(1000); // what the previous phase left (compilation, a collection) settles
        long hb = nodes.heartbeats();
        double cpu = cpuSeconds(pid);
        long t0 = System.nanoTime();
        Thread.sleep(window.multipliedBy(2));
        double paced = ms(t0) / 1000;
        double pacedCores = (cpuSeconds(pid) - cpu) / paced;
        long pacedBeats = nodes.heartbeats() - hb;
        double perPacedBeat = Math.max(0, pacedCores - idleCores) * paced / pacedBeats * 1e6;
        cpu = cpuSeconds(pid);
        t0 = System.nanoTime();
        long beats = nodes.flood(window);
        double floodCpu = cpuSeconds(pid) - cpu;
        double seconds = ms(t0) / 1000;
        double perBeat = floodCpu / beats * 1e6;
        row(results, "heartbeat", NODES, beats / seconds, Double.NaN, String.format(Locale.ROOT,
                "%d nodes heartbeating back to back (full heartbeats only): %.1f us of master CPU a heartbeat; at one"
                        + " a second per node (%d in %.1f s): %.1f us a heartbeat above the master's idle %.3f cores"
                        + " (%.3f cores in all)", NODES, perBeat, pacedBeats, paced, perPacedBeat, idleCores, pacedCores));

        Paced[] full = new Paced[2];
        Paced[] mixed = new Paced[2];
        for (int round = 0; round < 2; round++) {
            full[round] = paced(pid, http, nodes, window, false);
            mixed[round] = paced(pid, http, nodes, window, true);
        }
        for (Paced[] runs : List.of(full, mixed)) {
            boolean b = runs == mixed;
            row(results, b ? "heartbeat, paced, with beacons" : "heartbeat, paced, full only", NODES,
                    (runs[0].rate() + runs[1].rate()) / 2, Double.NaN, String.format(Locale.ROOT,
                            "%d nodes each every %d ms, %s: %.2f and %.2f us of master CPU a heartbeat (%d and %d sent,"
                                    + " %.2f and %.2f frames per frame-loop read)", NODES, PACED_PERIOD.toMillis(),
                            b ? "one full heartbeat in " + ScaleNodes.HEARTBEAT_EVERY + ", beacons between"
                                    : "full heartbeats only", runs[0].micros(), runs[1].micros(), runs[0].sent(),
                            runs[1].sent(), runs[0].framesPerRead(), runs[1].framesPerRead()));
        }
        double perNodeBeat = Math.max(mixed[0].micros(), mixed[1].micros());
        results.checks.add(new Results.Check("scale: master time per node heartbeat", perNodeBeat, "us", "< 10 us",
                perNodeBeat < 10, String.format(Locale.ROOT, "the worse of two rounds of %d nodes heartbeating as nodes"
                        + " do (one full heartbeat in %d, beacons between), each every %d ms; full heartbeats only at"
                        + " that pace, in the same run: %.2f and %.2f us; back to back: %.1f us; at one a second per"
                        + " node: %.1f us above the idle master", NODES, ScaleNodes.HEARTBEAT_EVERY,
                        PACED_PERIOD.toMillis(), full[0].micros(), full[1].micros(), perBeat, perPacedBeat)));
    }

    /** One paced round: heartbeats sent, seconds, master CPU seconds, frame-loop frames and reads. */
    record Paced(long sent, double seconds, double cpu, double frames, double reads) {
        double rate() {
            return sent / seconds;
        }

        double micros() {
            return cpu / sent * 1e6;
        }

        double framesPerRead() {
            return reads == 0 ? Double.NaN : frames / reads;
        }
    }

    /** Every node at {@link #PACED_PERIOD} for a settling period and then {@code window}, measured over the window. */
    private static Paced paced(long pid, int http, ScaleNodes nodes, Duration window, boolean beacons) throws Exception {
        Duration settle = PACED_PERIOD.multipliedBy(ScaleNodes.HEARTBEAT_EVERY * 4);
        nodes.pace(PACED_PERIOD, beacons, settle.plus(window).plus(PACED_PERIOD));
        Thread.sleep(settle);
        double frames = PoolProcess.metric(http, "master_loop_frames_total");
        double reads = PoolProcess.metric(http, "master_loop_reads_total");
        long sent = nodes.heartbeats();
        double cpu = cpuSeconds(pid);
        long t0 = System.nanoTime();
        Thread.sleep(window);
        double used = cpuSeconds(pid) - cpu;
        double seconds = ms(t0) / 1000;
        sent = nodes.heartbeats() - sent;
        frames = PoolProcess.metric(http, "master_loop_frames_total") - frames;
        reads = PoolProcess.metric(http, "master_loop_reads_total") - reads;
        Thread.sleep(PACED_PERIOD.multipliedBy(2)); // back to the real pace
        return new Paced(sent, seconds, used, frames, reads);
    }

    /**
     * Stores objects [start, start + extra), past the eviction watermark (the fill took the pool to 80%); returns
     * the end: every object put so far has an index below it.
     */
    private static long evict(Results results, int http, Supplier<HostPort> leader, ScaleNodes nodes, long start,
                              long extra) throws Exception {
        double evicted = PoolProcess.metric(http, "master_evicted_keys_total");
        long freed = nodes.freed();
        long t0 = System.nanoTime();
        fill(leader, start, start + extra, 2);
        double rate = extra / (ms(t0) / 1000);
        Thread.sleep(1000); // frees go to the nodes in batches
        double gone = PoolProcess.metric(http, "master_evicted_keys_total") - evicted;
        row(results, "batched put past the watermark", 2, rate, Double.NaN, String.format(Locale.ROOT,
                "%d more objects: %.0f evicted by the master, %d regions freed on the nodes", extra, gone,
                nodes.freed() - freed));
        if (gone <= 0) {
            throw new IllegalStateException("storing " + extra + " objects past the watermark evicted nothing");
        }
        return start + extra;
    }

    private static void nodeLoss(Results results, int http, ScaleNodes nodes) throws Exception {
        double objects = PoolProcess.metric(http, "master_objects");
        long t0 = System.nanoTime();
        nodes.silence(LOST);
        try {
            awaitMetric(http, "master_segments", NODES - LOST, Duration.ofSeconds(60));
        } catch (IllegalStateException e) {
            nodes.check();
            throw new IllegalStateException(e.getMessage() + "; the simulated nodes: " + nodes.losses(), e);
        }
        double dropped = ms(t0);
        double lostObjects = objects - PoolProcess.metric(http, "master_objects");
        long registered = nodes.registrations();
        t0 = System.nanoTime();
        nodes.rejoin(LOST);
        awaitMetric(http, "master_segments", NODES, Duration.ofSeconds(60));
        while (nodes.registrations() < registered + LOST) {
            Thread.sleep(5);
        }
        double back = ms(t0);
        row(results, "node loss and rejoin", LOST, Double.NaN, dropped * 1000, String.format(Locale.ROOT,
                "%d of %d nodes silent: dropped %.0f ms later (node TTL 10 s), %.0f objects gone with them; back"
                        + " (registered again, empty) in %.0f ms", LOST, NODES, dropped, lostObjects, back));
        nodes.check();
    }

    private static void failover(Results results, Process m1, int http2, LeaderRecord first, LeaderWatch watch,
                                 Supplier<HostPort> leader, long upTo, String size) throws Exception {
        long present = countPresent(leader.get(), upTo);
        long chain = firstFullChain(leader.get(), upTo);
        AtomicLong elected = new AtomicLong();
        AtomicLong gone = new AtomicLong();
        AtomicLong answered = new AtomicLong();
        watch.onChange(r -> {
            if (r == null) {
                gone.compareAndSet(0, System.nanoTime());
            } else if (r.ready() && r.term() > first.term()) {
                elected.compareAndSet(0, System.nanoTime());
            }
        });
        long killedAt = System.nanoTime();
        m1.destroyForcibly();
        AtomicLong lookedUp = new AtomicLong();
        AtomicLong put = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AtomicReference<String> lastLookup = new AtomicReference<>("none");
        AtomicReference<String> lastPut = new AtomicReference<>("none");
        AtomicLong attempts = new AtomicLong();
        Timeline lookupTimes = new Timeline();
        Thread lookup = Thread.ofPlatform().start(() -> retry(killedAt, lookedUp, failure, first, watch, lastLookup, lookupTimes, c -> {
            BodyWriter w = new BodyWriter(CHAIN * 90);
            new KeyList(chainKeys(chain)).write(w);
            int matched = c.call(Opcode.PREFIX_MATCH, w, Duration.ofSeconds(1)).body().i32("matched");
            answered.compareAndSet(0, System.nanoTime());
            lastLookup.set("matched " + matched + " of " + CHAIN);
            return matched == CHAIN;
        }));
        Thread writer = Thread.ofPlatform().start(() -> retry(killedAt, put, failure, first, watch, lastPut, new Timeline(), c -> {
            // fresh keys every attempt: an attempt that failed half way leaves its keys reserved or stored
            MetadataBench.putBatch(c, upTo + 1_000_000_000L + attempts.getAndIncrement() * CHAIN, CHAIN);
            return true;
        }));
        lookup.join(60_000);
        writer.join(60_000);
        if (failure.get() != null || lookedUp.get() == 0 || put.get() == 0) {
            throw new IllegalStateException("no lookup and put succeeded within 60 s of the kill (leader now " + watch.latest()
                    + "; the last lookup failure: " + lastLookup.get() + "; the last put failure: " + lastPut.get() + ")",
                    failure.get());
        }
        LeaderRecord next = watch.latest();
        double evicted = PoolProcess.metric(http2, "master_evicted_keys_total");
        long after = countPresent(leader.get(), upTo);
        double lookupMs = (lookedUp.get() - killedAt) / 1e6;
        double putMs = (put.get() - killedAt) / 1e6;
        double both = Math.max(lookupMs, putMs);
        row(results, "failover (leader killed, hot standby)", 1, Double.NaN, both * 1000, String.format(Locale.ROOT,
                "%s: first full prefix match %.0f ms and first put %.0f ms after kill -9; new leader %s at term %d,"
                        + " the old key gone at %.0f ms, the new one ready at %.0f ms; the lookup client saw it at %.0f ms,"
                        + " connected at %.0f ms, and was first answered at %.0f ms (the last failure before: %s); it evicted"
                        + " %.0f objects to place the first put; %d of %d objects present before the kill, %d after", size,
                lookupMs, putMs, next.id(), next.term(), since(gone, killedAt), since(elected, killedAt),
                since(lookupTimes.saw(), killedAt), since(lookupTimes.connected(), killedAt), since(answered, killedAt),
                lastLookup.get(), evicted, present, upTo, after));
        results.checks.add(new Results.Check("scale: failover at " + size + " until the first lookup and put", both,
                "ms", "< 2000 ms", both < 2000, String.format(Locale.ROOT, "lookup %.0f ms, put %.0f ms", lookupMs,
                putMs)));
        results.checks.add(new Results.Check("scale: objects lost in the failover at " + size, present - after
                - evicted, "", "0", present - after == evicted, present + " present before the kill, " + after
                + " after, " + (long) evicted + " evicted by the new leader to place the first put"));
    }

    /** When a failover loop first saw the new leader's ready record, and first connected to it. */
    private record Timeline(AtomicLong saw, AtomicLong connected) {
        Timeline() {
            this(new AtomicLong(), new AtomicLong());
        }
    }

    /** Milliseconds from {@code from} to the moment {@code at} holds (NaN: never). */
    private static double since(AtomicLong at, long from) {
        return at.get() == 0 ? Double.NaN : (at.get() - from) / 1e6;
    }

    /** What the failover loops try against the leader until it succeeds. */
    @FunctionalInterface
    private interface Attempt {
        boolean run(FrameConnection c) throws Exception;
    }

    /** Tries {@code attempt} against the newest leader record past {@code first}'s term until it succeeds. */
    private static void retry(long since, AtomicLong done, AtomicReference<Throwable> failure, LeaderRecord first,
                              LeaderWatch watch, AtomicReference<String> last, Timeline timeline, Attempt attempt) {
        long deadline = since + Duration.ofSeconds(60).toNanos();
        while (System.nanoTime() < deadline) {
            LeaderRecord r = watch.latest();
            if (r != null && r.ready() && r.term() > first.term()) {
                timeline.saw.compareAndSet(0, System.nanoTime());
                try (FrameConnection c = FrameConnection.connect(HostPort.parse(r.address()), Duration.ofSeconds(1),
                        Limits.DEFAULT)) {
                    timeline.connected.compareAndSet(0, System.nanoTime());
                    while (System.nanoTime() < deadline) {
                        if (attempt.run(c)) {
                            done.set(System.nanoTime());
                            return;
                        }
                        Thread.sleep(1);
                    }
                } catch (Exception e) {
                    // not serving yet (a put refused while no segment is active under the new term, a refused connection)
                    last.set(e.toString());
                }
            }
            try {
                Thread.sleep(1);
            } catch (InterruptedException e) {
                failure.set(e);
                return;
            }
        }
    }

    /** A chain of {@link #CHAIN} consecutive keys all present (some were evicted or lost with nodes). */
    private static long firstFullChain(HostPort master, long upTo) throws Exception {
        try (FrameConnection c = connect(master)) {
            for (long start = upTo - CHAIN; start > 0; start -= CHAIN * 97L) {
                BodyWriter w = new BodyWriter(CHAIN * 90);
                new KeyList(chainKeys(start)).write(w);
                if (c.call(Opcode.PREFIX_MATCH, w, T).body().i32("matched") == CHAIN) {
                    return start;
                }
            }
        }
        throw new IllegalStateException("no chain of " + CHAIN + " stored keys is whole");
    }

    private static List<byte[]> chainKeys(long start) {
        List<byte[]> keys = new ArrayList<>(CHAIN);
        for (int k = 0; k < CHAIN; k++) {
            keys.add(MetadataBench.key(start + k));
        }
        return keys;
    }

    /** How many of the keys [0, upTo) the master holds, by batched existence checks. */
    static long countPresent(HostPort master, long upTo) throws Exception {
        long present = 0;
        try (FrameConnection c = connect(master)) {
            for (long i = 0; i < upTo; i += MetadataBench.EXISTS_BATCH) {
                int n = (int) Math.min(MetadataBench.EXISTS_BATCH, upTo - i);
                List<byte[]> keys = new ArrayList<>(n);
                for (int k = 0; k < n; k++) {
                    keys.add(MetadataBench.key(i + k));
                }
                BodyWriter w = new BodyWriter(n * 90);
                new KeyList(keys).write(w);
                for (boolean p : MasterMessages.Flags.read(c.call(Opcode.BATCH_EXIST_KEY, w, T).body()).values()) {
                    present += p ? 1 : 0;
                }
            }
        }
        return present;
    }

    // ------------------------------------------------------------------ part 2: a master alone, as large as fits

    private static void alone(Results results, Plan p) throws Exception {
        long n = p.bigObjects();
        String size = n / 1_000_000 + "M objects";
        try (PoolProcess master = PoolProcess.start("0", p.bigHeap());
             ScaleNodes nodes = new ScaleNodes(() -> HostPort.parse(master.masterAddress()), NODES, capacityFor(n),
                     Duration.ofSeconds(1))) {
            Supplier<HostPort> at = () -> HostPort.parse(master.masterAddress());
            master.collectGarbage();
            double base = master.metric("jvm_memory_used_bytes{area=\"heap\"}");
            long done = 0;
            double perObject = Double.NaN;
            for (long mark : new long[]{n / 5, n / 2, n}) {
                long t0 = System.nanoTime();
                fill(at, done, mark, 2);
                double rate = (mark - done) / (ms(t0) / 1000);
                done = mark;
                master.collectGarbage();
                double heap = master.metric("jvm_memory_used_bytes{area=\"heap\"}");
                perObject = (heap - base) / mark;
                row(results, "heap per object (master alone)", 2, rate, Double.NaN, String.format(Locale.ROOT,
                        "%.1f B at %dM objects (heap %.2f GiB); ops/s = fill rate up to this size", perObject,
                        mark / 1_000_000, heap / (1L << 30)));
            }
            double projected = base + perObject * 100_000_000L;
            results.environment.put("scale_projected_heap_gib_at_100M", projected / (1L << 30));
            row(results, "projected heap at 100M objects", 0, Double.NaN, Double.NaN, String.format(Locale.ROOT,
                    "%.1f GiB: %.1f B an object (measured at %s) times 100M, plus the %.0f MiB the empty master held",
                    projected / (1L << 30), perObject, size, base / (1 << 20)));
            lookups(results, master.pid, at, n, p.window(), size);
            nodes.check();
        }
    }

    // ------------------------------------------------------------------ load and measurement

    /** Stores objects [from, to) with batched put_start + put_end on {@code clients} connections. */
    private static void fill(Supplier<HostPort> leader, long from, long to, int clients) throws Exception {
        List<Thread> threads = new ArrayList<>();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        long per = (to - from + clients - 1) / clients;
        for (int c = 0; c < clients; c++) {
            long a = from + c * per;
            long b = Math.min(to, a + per);
            threads.add(Thread.ofPlatform().start(() -> {
                try (FrameConnection conn = connect(leader.get())) {
                    for (long i = a; i < b; i += MetadataBench.PUT_BATCH) {
                        MetadataBench.putBatch(conn, i, (int) Math.min(MetadataBench.PUT_BATCH, b - i));
                    }
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                }
            }));
        }
        for (Thread t : threads) {
            t.join();
        }
        if (failure.get() != null) {
            throw new IllegalStateException("filling the master failed: " + failure.get(), failure.get());
        }
    }

    /** One client's repeated call; returns the units (keys, objects) it did. */
    @FunctionalInterface
    private interface Call {
        long run() throws Exception;
    }

    @FunctionalInterface
    private interface CallFactory {
        Call create(int client) throws Exception;
    }

    /** What a saturation window measured: units done, its length, and the CPU the master and this process used. */
    record Saturation(long units, double seconds, double masterCpu, double ownCpu) {
        double rate() {
            return units / seconds;
        }

        double perMasterCore() {
            return units / masterCpu;
        }

        double masterCores() {
            return masterCpu / seconds;
        }

        double ownCores() {
            return ownCpu / seconds;
        }
    }

    /**
     * Runs {@code clients} threads calling back to back; after a warm-up of one window, measures one window:
     * units done and the CPU seconds of the master ({@code pid}) and of this process.
     */
    private static Saturation saturate(long pid, int clients, Duration window, CallFactory factory) throws Exception {
        LongAdder units = new LongAdder();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        List<Call> calls = new ArrayList<>();
        for (int i = 0; i < clients; i++) {
            calls.add(factory.create(i));
        }
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        for (Call call : calls) {
            threads.add(Thread.ofPlatform().start(() -> {
                try {
                    while (!stop.get()) {
                        units.add(call.run());
                    }
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                }
            }));
        }
        Thread.sleep(window);
        long u0 = units.sum();
        double m0 = cpuSeconds(pid);
        double o0 = cpuSeconds(ProcessHandle.current().pid());
        long t0 = System.nanoTime();
        Thread.sleep(window);
        long u1 = units.sum();
        double m1 = cpuSeconds(pid);
        double o1 = cpuSeconds(ProcessHandle.current().pid());
        double seconds = (System.nanoTime() - t0) / 1e9;
        stop.set(true);
        for (Thread t : threads) {
            t.join();
        }
        if (failure.get() != null) {
            throw new IllegalStateException("a scale client failed: " + failure.get(), failure.get());
        }
        return new Saturation(u1 - u0, seconds, m1 - m0, o1 - o0);
    }

    /** User plus system CPU seconds of process {@code pid} so far, from /proc (clock ticks of 10 ms). */
    static double cpuSeconds(long pid) throws IOException {
        String stat = Files.readString(Path.of("/proc", Long.toString(pid), "stat"));
        String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
        // after the command: state is field 3, so utime (field 14) and stime (15) are at 11 and 12
        return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
    }

    private static long heapAfterGc(long pid, int http) throws Exception {
        PoolProcess.collectGarbage(pid);
        return (long) PoolProcess.metric(http, "jvm_memory_used_bytes{area=\"heap\"}");
    }

    private static void awaitMetric(int http, String name, double value, Duration timeout) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (PoolProcess.metric(http, name) != value) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(name + " did not reach " + value + " within " + timeout + " (it is "
                        + PoolProcess.metric(http, name) + ")");
            }
            Thread.sleep(20);
        }
    }

    private static FrameConnection connect(HostPort master) throws IOException {
        return FrameConnection.connect(master, Duration.ofSeconds(5), Limits.DEFAULT);
    }

    private static double ms(long since) {
        return (System.nanoTime() - since) / 1e6;
    }

    private static void row(Results results, String op, int clients, double opsPerSecond, double p50Micros, String note) {
        results.add(new Results.Row("scale", "kvpool", op, 0, clients, Double.NaN, opsPerSecond, p50Micros, Double.NaN,
                note));
    }
}

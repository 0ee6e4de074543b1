package io.kvpool.bench.soak;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import io.kvpool.config.Durations;
import io.kvpool.config.Size;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeSet;

/**
 * The soak's final counts: printed as a table, written as JSON, and turned into the exit code. A
 * soak fails when a read was wrong, an acknowledged object was lost, the pool evicted (misses would
 * be ambiguous), traffic did not resume after an event, an enabled chaos kind never ran or could not
 * be carried out, or the pool was not whole again for the final pass.
 */
public final class SoakReport {

    private final SoakConfig config;
    private final SoakStats stats;
    private final long trafficNanos;
    private final List<String> chaosKinds;
    private final List<SoakStats.ChaosEvent> events;
    private final List<String> failures = new ArrayList<>();

    SoakReport(SoakConfig config, SoakStats stats, long trafficNanos, List<String> chaosKinds) {
        this.config = config;
        this.stats = stats;
        this.trafficNanos = trafficNanos;
        this.chaosKinds = chaosKinds;
        this.events = stats.events();
        if (stats.wrongReads() > 0) {
            failures.add(stats.wrongReads() + " wrong reads");
        }
        if (stats.lost > 0) {
            failures.add(stats.lost + " acknowledged objects lost");
        }
        if (stats.evictions > 0) {
            failures.add("the pool evicted " + (long) stats.evictions + " objects: misses are ambiguous (inconclusive)");
        }
        for (String k : chaosKinds) {
            if (events.stream().noneMatch(e -> e.kind().equals(k))) {
                failures.add("chaos kind " + k + " never ran");
            }
        }
        long stalled = events.stream().filter(e -> e.resumeMillis() < 0).count();
        if (stalled > 0) {
            failures.add("traffic did not resume after " + stalled + " chaos events");
        }
        stats.errors.keySet().stream().filter(k -> k.contains("could not be carried out")).forEach(failures::add);
        if (!stats.healthAtEnd.isEmpty()) {
            failures.add("the pool was " + stats.healthAtEnd + " (inconclusive final pass)");
        }
    }

    /** 0 when the soak passed, 1 when it failed (see the class comment). */
    public int exitCode() {
        return failures.isEmpty() ? 0 : 1;
    }

    public List<String> failures() {
        return List.copyOf(failures);
    }

    /** Calls returned after event {@code i} until the next event began (or traffic stopped). */
    private long callsAfter(int i) {
        long until = i + 1 < events.size() ? events.get(i + 1).okCallsAtStart() : stats.okCalls.sum();
        return until - events.get(i).okCallsAtEnd();
    }

    public void print(PrintStream out) {
        long secs = Math.max(1, trafficNanos / 1_000_000_000L);
        out.println();
        out.printf(Locale.ROOT, "kvpool soak report: %s of traffic (asked %s), seed %d%n",
                Durations.format(Duration.ofSeconds(secs)), Durations.format(config.duration()), config.seed());
        out.printf(Locale.ROOT, "  %d clients, %d keys of %s to %s, %d copies per put%s%n", config.clients(),
                config.keys(), config.minValue(), config.maxValue(), config.replicas(), config.startsPool()
                        ? String.format(Locale.ROOT, ", %d masters, %d nodes of %s", config.masters(), config.nodes(),
                        config.segmentSize()) : ", external pool " + config.external());
        out.println();
        out.printf("%-28s %12s %10s%n", "operations", "issued", "threw");
        long total = 0;
        long threw = 0;
        for (Map.Entry<String, Long> e : SoakStats.snapshot(stats.ops).entrySet()) {
            long t = stats.opsFailed.containsKey(e.getKey()) ? stats.opsFailed.get(e.getKey()).sum() : 0;
            out.printf("  %-26s %12d %10d%n", e.getKey(), e.getValue(), t);
            total += e.getValue();
            threw += t;
        }
        out.printf(Locale.ROOT, "  %-26s %12d %10d   (%.0f/s)%n", "total", total, threw, total / (double) secs);
        out.println();
        out.println("verification");
        row(out, "bytes checked", Size.human(stats.bytesChecked.sum()), "every byte of every value read");
        row(out, "wrong reads", "" + stats.wrongReads(), "must be 0");
        row(out, "  with wrong bytes", stats.readsWithWrongBytes.sum() + " (" + stats.wrongBytes.sum() + " bytes)", "");
        row(out, "  stale (removed version)", "" + stats.verdict(History.Verdict.STALE), "");
        row(out, "  phantom (never put)", "" + stats.verdict(History.Verdict.PHANTOM), "");
        row(out, "  refused put visible", "" + stats.verdict(History.Verdict.REFUSED_VISIBLE), "");
        row(out, "reads judged", "" + (stats.verdict(History.Verdict.HIT) + stats.verdict(History.Verdict.MISS)
                + stats.verdict(History.Verdict.ACKNOWLEDGED_MISS)), stats.verdict(History.Verdict.HIT) + " hits");
        row(out, "puts acknowledged", "" + stats.acknowledged.sum(), "OK with " + config.replicas() + " copies");
        row(out, "puts OK with fewer copies", "" + stats.shortCopies.sum(), "not counted as acknowledged");
        row(out, "puts ALREADY_EXISTS", "" + stats.alreadyExists.sum(), "key present: a race, expected");
        row(out, "acknowledged misses", "" + stats.verdict(History.Verdict.ACKNOWLEDGED_MISS),
                "reads during chaos that missed an acknowledged object");
        row(out, "acknowledged lost", "" + stats.lost, "must be 0; final pass: " + stats.finalMustExist
                + " of " + stats.finalKeys + " keys had to exist");
        row(out, "evictions", Double.isNaN(stats.evictions) ? "unknown" : "" + (long) stats.evictions,
                "must be 0 (working set sized under capacity)");
        if (!Double.isNaN(stats.repairCopies)) {
            row(out, "repair copies made", "" + (long) stats.repairCopies, "below count at the end: "
                    + (long) stats.underReplicatedAtEnd);
        }
        samples(out, "wrong", stats.wrongSamples);
        samples(out, "acknowledged missed", stats.missSamples);
        samples(out, "lost", stats.lostSamples);
        out.println();
        out.println("errors by kind" + (stats.errors.isEmpty() ? ": none" : ""));
        for (Map.Entry<String, Long> e : SoakStats.snapshot(stats.errors).entrySet()) {
            String sample = stats.errorSamples.getOrDefault(e.getKey(), "");
            out.printf("  %-60s %8d   %s%n", e.getKey(), e.getValue(), abbreviate(sample, 110));
        }
        if (!chaosKinds.isEmpty()) {
            out.println();
            out.printf("%-12s %6s %22s %22s %22s %14s%n", "chaos", "events", "detect ms min/med/max",
                    "repair ms min/med/max", "traffic back ms (max)", "calls after (min)");
            for (String k : chaosKinds) {
                List<Integer> idx = new ArrayList<>();
                for (int i = 0; i < events.size(); i++) {
                    if (events.get(i).kind().equals(k)) {
                        idx.add(i);
                    }
                }
                long minAfter = idx.stream().mapToLong(this::callsAfter).min().orElse(0);
                out.printf("  %-10s %6d %22s %22s %22s %14d%n", k, idx.size(),
                        spread(idx.stream().map(i -> events.get(i).detectMillis()).toList()),
                        spread(idx.stream().map(i -> events.get(i).repairMillis()).toList()),
                        idx.stream().mapToLong(i -> events.get(i).resumeMillis()).max().orElse(-1),
                        minAfter);
            }
            out.println("events");
            long t0 = stats.startNanos;
            for (int i = 0; i < events.size(); i++) {
                SoakStats.ChaosEvent e = events.get(i);
                out.printf(Locale.ROOT, "  %-14s %-10s %-16s %s, traffic back in %d ms, %d calls after%n",
                        elapsed(e.startNanos(), t0), e.kind(), e.target(), describe(e), e.resumeMillis(), callsAfter(i));
            }
        }
        out.println();
        out.println(failures.isEmpty() ? "verdict: PASS" : "verdict: FAIL: " + String.join("; ", failures));
    }

    private static String elapsed(long nanos, long t0) {
        return String.format(Locale.ROOT, "+%.1fs", (nanos - t0) / 1e9);
    }

    private static String describe(SoakStats.ChaosEvent e) {
        List<String> parts = new ArrayList<>();
        if (e.detectMillis() >= 0) {
            parts.add((e.kind().equals("failover") ? "new leader in " : "dropped in ") + e.detectMillis() + " ms");
        }
        if (e.repairMillis() >= 0) {
            parts.add("repaired in " + e.repairMillis() + " ms");
        }
        if (!e.note().isEmpty()) {
            parts.add(e.note());
        }
        return String.join(", ", parts);
    }

    private static String spread(List<Long> values) {
        List<Long> v = values.stream().filter(x -> x >= 0).sorted().toList();
        if (v.isEmpty()) {
            return "-";
        }
        return v.getFirst() + "/" + v.get(v.size() / 2) + "/" + v.getLast();
    }

    private static void row(PrintStream out, String name, String value, String note) {
        out.printf("  %-28s %14s   %s%n", name, value, note);
    }

    private static void samples(PrintStream out, String what, java.util.Set<String> s) {
        if (!s.isEmpty()) {
            out.println("  " + what + " (up to 20, times since traffic began):");
            for (String x : new TreeSet<>(s)) {
                out.println("    " + x);
            }
        }
    }

    private static String abbreviate(String s, int n) {
        String one = s.replace('\n', ' ');
        return one.length() <= n ? one : one.substring(0, n - 3) + "...";
    }

    /** The report as JSON (what the tests read). */
    public void writeJson(Path file) throws IOException {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("seed", config.seed());
        m.put("trafficSeconds", trafficNanos / 1e9);
        m.put("operations", SoakStats.snapshot(stats.ops));
        m.put("operationsThrew", SoakStats.snapshot(stats.opsFailed));
        m.put("totalOperations", stats.totalOps());
        m.put("bytesChecked", stats.bytesChecked.sum());
        m.put("wrongReads", stats.wrongReads());
        m.put("wrongBytes", stats.wrongBytes.sum());
        m.put("stale", stats.verdict(History.Verdict.STALE));
        m.put("phantom", stats.verdict(History.Verdict.PHANTOM));
        m.put("refusedVisible", stats.verdict(History.Verdict.REFUSED_VISIBLE));
        m.put("hits", stats.verdict(History.Verdict.HIT));
        m.put("acknowledged", stats.acknowledged.sum());
        m.put("shortCopies", stats.shortCopies.sum());
        m.put("acknowledgedMisses", stats.verdict(History.Verdict.ACKNOWLEDGED_MISS));
        m.put("acknowledgedLost", stats.lost);
        m.put("finalMustExist", stats.finalMustExist);
        m.put("evictions", Double.isNaN(stats.evictions) ? null : (long) stats.evictions);
        m.put("errors", SoakStats.snapshot(stats.errors));
        List<Map<String, Object>> ev = new ArrayList<>();
        for (int i = 0; i < events.size(); i++) {
            SoakStats.ChaosEvent e = events.get(i);
            Map<String, Object> x = new LinkedHashMap<>();
            x.put("kind", e.kind());
            x.put("target", e.target());
            x.put("detectMillis", e.detectMillis());
            x.put("repairMillis", e.repairMillis());
            x.put("resumeMillis", e.resumeMillis());
            x.put("callsAfter", callsAfter(i));
            x.put("note", e.note());
            ev.add(x);
        }
        m.put("chaosKinds", chaosKinds);
        m.put("events", ev);
        m.put("failures", failures);
        m.put("exitCode", exitCode());
        Path parent = file.toAbsolutePath().getParent();
        if (parent != null) {
            Files.createDirectories(parent);
        }
        new ObjectMapper().enable(SerializationFeature.INDENT_OUTPUT).writeValue(file.toFile(), m);
    }
}

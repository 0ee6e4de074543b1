package io.kvpool.cli;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * What {@code kvpool trainer} counts over a run, and its final summary: rollouts by outcome,
 * verification, prefix hit rates split by when the rollout ran (the first step under a weights
 * version, a later step, or racing a weight update), the work an update found in flight, and where
 * the time went. Single-threaded: the trainer's main thread adds to it.
 */
final class RolloutTally {

    /** When a rollout ran, for the hit rates. */
    enum Phase {
        FIRST_STEP("first step under new weights"),
        LATER_STEP("later steps"),
        RACING("racing an update");

        final String label;

        Phase(String label) {
            this.label = label;
        }
    }

    private final long[] promptTokens = new long[Phase.values().length];
    private final long[] localHits = new long[Phase.values().length];
    private final long[] poolHits = new long[Phase.values().length];
    private final long[] completed = new long[Phase.values().length];

    long verified;
    long stale;
    /** Aborted rollouts whose partial output was checked as a prefix of the recompute. */
    long partialsChecked;
    long references;

    long updates;
    long raced;
    long racedCompleted;
    long racedAborted;
    long racedRefused;
    long updatesWithRolloutsInFlight;
    long rolloutsAbortedByPauses;
    long updatesWithSavesInFlight;
    long savesInFlightAtPauses;
    /** Updates whose reset cascade failed at first and was tried again (--reset-retry), and the tries again. */
    long updatesWithResetRetries;
    long resetRetries;
    private final List<Long> updateNanos = new ArrayList<>();
    long stepNanos;
    long referenceNanos;

    /**
     * Prompt tokens, local hits and pool hits of the steps under the weights each update loaded, by
     * update (index 0: the start-up weights). Racing rollouts are not in it: their prompts and lengths
     * are drawn at random.
     */
    private final List<long[]> byUpdate = new ArrayList<>();
    /** When each update began ({@link System#nanoTime}), by update number. */
    private final Map<Integer, Long> updateStarts = new HashMap<>();
    private final List<Fault> faults = new ArrayList<>();

    /** A fault injected just before weight update {@code update}, at {@code nanos} ({@code clock}: the wall clock). */
    record Fault(int update, String command, long nanos, String clock) {
    }

    void completed(Phase p, long prompt, long local, long pool) {
        completed[p.ordinal()]++;
        promptTokens[p.ordinal()] += prompt;
        localHits[p.ordinal()] += local;
        poolHits[p.ordinal()] += pool;
    }

    void update(long nanos, int aborted, int savesInFlight) {
        updates++;
        updateNanos.add(nanos);
        rolloutsAbortedByPauses += aborted;
        savesInFlightAtPauses += savesInFlight;
        if (aborted > 0) {
            updatesWithRolloutsInFlight++;
        }
        if (savesInFlight > 0) {
            updatesWithSavesInFlight++;
        }
    }

    /** A step's rollouts, run under the weights update {@code update} loaded (0: the start-up weights). */
    void stepUnder(int update, long prompt, long local, long pool) {
        while (byUpdate.size() <= update) {
            byUpdate.add(new long[3]);
        }
        long[] u = byUpdate.get(update);
        u[0] += prompt;
        u[1] += local;
        u[2] += pool;
    }

    void updateStarted(int update, long nanos) {
        updateStarts.put(update, nanos);
    }

    void fault(int update, String command, long nanos, String clock) {
        faults.add(new Fault(update, command, nanos, clock));
    }

    /** Prompt tokens, local hits, pool hits of the steps under updates {@code from} to {@code to - 1}. */
    private long[] sum(int from, int to) {
        long[] out = new long[3];
        for (int u = Math.max(0, from); u < Math.min(to, byUpdate.size()); u++) {
            for (int i = 0; i < 3; i++) {
                out[i] += byUpdate.get(u)[i];
            }
        }
        return out;
    }

    private static double rate(long[] s) {
        return pct(s[1] + s[2], s[0]);
    }

    private static String rateText(long[] s) {
        return String.format(Locale.ROOT, "%.1f%% (local %.1f%%, pool %.1f%%)", rate(s), pct(s[1], s[0]), pct(s[2], s[0]));
    }

    /**
     * One CSV line per update, after a header: the update (0: the start-up weights), when it began in
     * seconds after update 1 began (empty for 0), the prompt tokens of the steps under the weights it
     * loaded, their local and pool hits, and the fault injected just before it (empty: none).
     */
    List<String> updatesCsv() {
        List<String> out = new ArrayList<>();
        out.add("update,started_s,prompt_tokens,local_hit_tokens,pool_hit_tokens,fault");
        Long first = updateStarts.get(1);
        for (int u = 0; u < byUpdate.size(); u++) {
            Long t = updateStarts.get(u);
            StringBuilder f = new StringBuilder();
            for (Fault x : faults) {
                if (x.update() == u) {
                    f.append(f.isEmpty() ? "" : " + ").append(label(x.command()).replace(',', ' ').replace('"', ' '));
                }
            }
            long[] v = byUpdate.get(u);
            out.add(u + "," + (t == null || first == null ? "" : String.format(Locale.ROOT, "%.3f", (t - first) / 1e9)) + ","
                    + v[0] + "," + v[1] + "," + v[2] + "," + f);
        }
        return out;
    }

    /** Seconds from the start of update {@code from} to that of update {@code from + window}; NaN if not both known. */
    private double windowSeconds(int from, int window) {
        Long a = updateStarts.get(from);
        Long b = updateStarts.get(from + window);
        return a == null || b == null ? Double.NaN : (b - a) / 1e9;
    }

    /** The command's words, the first without its directory (a script's path). */
    private static String label(String command) {
        String c = command.strip();
        int space = c.indexOf(' ');
        String first = space < 0 ? c : c.substring(0, space);
        return first.substring(first.lastIndexOf('/') + 1) + (space < 0 ? "" : c.substring(space));
    }

    /**
     * The hit rate by update, with faults: the steps' prefix hit rate under the weights each update
     * loaded (racing rollouts left out), compared over windows of {@code window} consecutive updates.
     * <ul>
     *   <li>the <b>baseline</b>: updates 1 to the one before the first fault, its rate and the range of
     *       its windows' rates (the lowest is the bar below which a window counts as hurt), and how long
     *       a window took (the median);</li>
     *   <li>for each fault at update K, over the <b>span</b> from K to the next fault (at most five
     *       windows): the rate of the first window from K and how long it took, the first update from K
     *       whose steps hit the pool (a pool fault shows there first: local hits partly make up for
     *       it in the total), the rate over the span
     *       against the baseline
     *       (points, and prompt tokens fewer hit than at the baseline's rate), and when it was <b>back</b>:
     *       the first update r from K whose window (r to r + window - 1) is at or above the baseline's
     *       lowest window, in updates and seconds after the fault (K itself: the first window from the
     *       fault did not fall below it).</li>
     * </ul>
     * Empty without faults.
     */
    List<String> faultSummary(int window) {
        List<String> out = new ArrayList<>();
        if (faults.isEmpty()) {
            return out;
        }
        int end = byUpdate.size(); // one past the last update with steps
        int first = faults.getFirst().update();
        double low = Double.NaN;
        double high = Double.NaN;
        for (int r = 1; r + window <= first; r++) {
            double x = rate(sum(r, r + window));
            low = Double.isNaN(low) ? x : Math.min(low, x);
            high = Double.isNaN(high) ? x : Math.max(high, x);
        }
        List<Double> seconds = new ArrayList<>(); // the baseline's windows' durations
        for (int r = 1; r + window <= first; r++) {
            double d = windowSeconds(r, window);
            if (!Double.isNaN(d)) {
                seconds.add(d);
            }
        }
        seconds.sort(null);
        long[] base = sum(1, first);
        if (first <= 1) {
            out.add("summary: hit rate by update: no baseline (the first fault is at update 1)");
        } else {
            out.add(String.format(Locale.ROOT, "summary: hit rate by update (steps under the weights each update loaded):"
                            + " baseline, updates 1 to %d (before the first fault): %s; its windows of %d updates %s%s",
                    first - 1, rateText(base), window, Double.isNaN(low) ? "(too few updates for one)"
                            : String.format(Locale.ROOT, "%.1f%% to %.1f%%", low, high), seconds.isEmpty() ? ""
                            : String.format(Locale.ROOT, ", %.1f s each (median)", seconds.get(seconds.size() / 2))));
        }
        for (int i = 0; i < faults.size(); i++) {
            Fault f = faults.get(i);
            int k = f.update();
            int spanEnd = Math.min(end, k + 5 * window);
            if (i + 1 < faults.size()) {
                spanEnd = Math.min(spanEnd, Math.max(k + 1, faults.get(i + 1).update()));
            }
            long[] span = sum(k, spanEnd);
            StringBuilder b = new StringBuilder(String.format(Locale.ROOT, "summary: fault %d at update %d (%s), %s:",
                    i + 1, k, f.clock(), label(f.command())));
            if (k + window <= end) {
                double d = windowSeconds(k, window);
                b.append(String.format(Locale.ROOT, " first %d updates %s%s;", window, rateText(sum(k, k + window)),
                        Double.isNaN(d) ? "" : String.format(Locale.ROOT, " in %.1f s", d)));
            }
            int poolBack = -1; // the first update from the fault whose steps hit the pool
            for (int u = k; u < spanEnd && poolBack < 0; u++) {
                if (byUpdate.get(u)[2] > 0) {
                    poolBack = u;
                }
            }
            if (poolBack == k) {
                b.append(" the pool hit from its first update;");
            } else if (poolBack > k) {
                Long t = updateStarts.get(poolBack);
                b.append(String.format(Locale.ROOT, " no pool hit until update %d (%d updates%s after the fault);", poolBack,
                        poolBack - k, t == null ? "" : String.format(Locale.ROOT, ", %.1f s", (t - f.nanos()) / 1e9)));
            } else {
                b.append(String.format(Locale.ROOT, " no pool hit through update %d;", spanEnd - 1));
            }
            b.append(String.format(Locale.ROOT, " updates %d to %d %s", k, spanEnd - 1, rateText(span)));
            if (first > 1) {
                double expected = rate(base) / 100 * span[0];
                b.append(String.format(Locale.ROOT, ", %+.1f points against the baseline (%,d prompt tokens %s hit)",
                        rate(span) - rate(base), Math.round(Math.abs(expected - (span[1] + span[2]))),
                        expected >= span[1] + span[2] ? "fewer" : "more"));
            }
            if (!Double.isNaN(low)) {
                int back = -1;
                for (int r = k; r + window <= spanEnd; r++) {
                    if (rate(sum(r, r + window)) >= low) {
                        back = r;
                        break;
                    }
                }
                if (back == k) {
                    b.append(String.format(Locale.ROOT, "; its first window not below the baseline's lowest (%.1f%%):"
                            + " no dip at this window", low));
                } else if (back > k) {
                    Long t = updateStarts.get(back);
                    b.append(String.format(Locale.ROOT, "; back to the baseline's lowest window (%.1f%%) from update %d,"
                            + " %d updates%s after the fault", low, back, back - k,
                            t == null ? "" : String.format(Locale.ROOT, " and %.1f s", (t - f.nanos()) / 1e9)));
                } else {
                    b.append(String.format(Locale.ROOT, "; not back to the baseline's lowest window (%.1f%%) by update %d",
                            low, spanEnd - 1));
                }
            }
            out.add(b.toString());
        }
        return out;
    }

    void resetRetried(int retries) {
        if (retries > 0) {
            updatesWithResetRetries++;
            resetRetries += retries;
        }
    }

    long completed() {
        long n = 0;
        for (long c : completed) {
            n += c;
        }
        return n;
    }

    /** The hit rate of one phase, or of all (null), in percent: "81.2% (local 60.1%, pool 21.1%)". */
    String hitRate(Phase p) {
        long prompt = 0;
        long local = 0;
        long pool = 0;
        for (Phase q : Phase.values()) {
            if (p == null || p == q) {
                prompt += promptTokens[q.ordinal()];
                local += localHits[q.ordinal()];
                pool += poolHits[q.ordinal()];
            }
        }
        return String.format(Locale.ROOT, "%.1f%% (local %.1f%%, pool %.1f%%)", pct(local + pool, prompt),
                pct(local, prompt), pct(pool, prompt));
    }

    /** Percent of prompt tokens found in a cache, local or pool, in one phase or all (null). */
    double hitPercent(Phase p) {
        long prompt = 0;
        long hits = 0;
        for (Phase q : Phase.values()) {
            if (p == null || p == q) {
                prompt += promptTokens[q.ordinal()];
                hits += localHits[q.ordinal()] + poolHits[q.ordinal()];
            }
        }
        return pct(hits, prompt);
    }

    private static double pct(long part, long whole) {
        return whole == 0 ? 0 : 100.0 * part / whole;
    }

    /** The summary's lines; {@code droppedSaves} and {@code failedLoads} come from the engines' counters. */
    List<String> summary(String mode, long wallNanos, long droppedSaves, long failedLoads, boolean verify, boolean race) {
        List<String> out = new ArrayList<>();
        out.add(String.format(Locale.ROOT, "summary: mode %s, %d weight updates, wall time %.1f s", mode, updates,
                wallNanos / 1e9));
        out.add(String.format(Locale.ROOT, "summary: rollouts completed %d (first steps %d, later steps %d, racing"
                        + " updates %d)", completed(), completed[Phase.FIRST_STEP.ordinal()],
                completed[Phase.LATER_STEP.ordinal()], completed[Phase.RACING.ordinal()]));
        if (verify) {
            out.add(String.format(Locale.ROOT, "summary: verified %d of %d completed rollouts (all, no sampling) and %d"
                            + " aborted ones' partial outputs, against %d recomputes with a fresh cache_salt under the"
                            + " weights each ran with; stale %d", verified, completed(), partialsChecked, references,
                    stale));
        }
        out.add("summary: prefix hit rate: overall " + hitRate(null));
        for (Phase p : Phase.values()) {
            if (completed[p.ordinal()] > 0) {
                out.add("summary: prefix hit rate: " + p.label + " " + hitRate(p));
            }
        }
        if (race) {
            out.add(String.format(Locale.ROOT, "summary: rollouts racing the updates %d: completed before the pause %d,"
                    + " aborted by it %d, refused while paused %d", raced, racedCompleted, racedAborted, racedRefused));
        }
        out.add(String.format(Locale.ROOT, "summary: updates with rollouts in flight at the pause %d of %d (%d rollouts"
                        + " aborted); with saves in flight %d of %d (%d block saves); saves dropped %d, request steps with failed loads %d",
                updatesWithRolloutsInFlight, updates, rolloutsAbortedByPauses, updatesWithSavesInFlight, updates,
                savesInFlightAtPauses, droppedSaves, failedLoads));
        if (updatesWithResetRetries > 0) {
            out.add(String.format(Locale.ROOT, "summary: reset cascades that failed and were tried again (engines paused):"
                    + " %d updates, %d tries again", updatesWithResetRetries, resetRetries));
        }
        if (!updateNanos.isEmpty()) {
            long[] u = updateNanos.stream().mapToLong(Long::longValue).sorted().toArray();
            long sum = 0;
            for (long x : u) {
                sum += x;
            }
            out.add(String.format(Locale.ROOT, "summary: time: updates %.1f s (per update: mean %.1f ms, p50 %.1f,"
                            + " p99 %.1f, max %.1f), steps %.1f s, waiting for recomputes after the steps %.1f s", sum / 1e9, sum / 1e6 / u.length,
                    u[u.length / 2] / 1e6, u[(int) Math.min(u.length - 1, Math.ceil(0.99 * u.length) - 1)] / 1e6,
                    u[u.length - 1] / 1e6, stepNanos / 1e9, referenceNanos / 1e9));
        }
        return out;
    }
}

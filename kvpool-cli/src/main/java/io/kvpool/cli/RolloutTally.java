package io.kvpool.cli;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

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
    private final List<Long> updateNanos = new ArrayList<>();
    long stepNanos;
    long referenceNanos;

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

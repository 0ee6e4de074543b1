package io.kvpool.bench.soak;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.atomic.LongAdder;

/** The soak's counters, shared by the client threads, the verifier and the chaos thread. */
final class SoakStats {

    /** Operations by kind (get, get_batch, put, put_batch, remove, remove_prefix): issued and returned. */
    final Map<String, LongAdder> ops = new ConcurrentHashMap<>();
    /** Operations that threw, by kind. */
    final Map<String, LongAdder> opsFailed = new ConcurrentHashMap<>();
    /** Errors by kind ("put: FAILED", "get: KvPoolException (SocketTimeoutException)"), one sample message each. */
    final Map<String, LongAdder> errors = new ConcurrentHashMap<>();
    final Map<String, String> errorSamples = new ConcurrentHashMap<>();
    /** Read verdicts (traffic reads and the final pass). */
    final Map<History.Verdict, LongAdder> verdicts = new ConcurrentHashMap<>();
    final LongAdder wrongBytes = new LongAdder();
    final LongAdder readsWithWrongBytes = new LongAdder();
    final LongAdder bytesChecked = new LongAdder();
    final LongAdder acknowledged = new LongAdder();
    final LongAdder shortCopies = new LongAdder();
    final LongAdder alreadyExists = new LongAdder();
    /** Calls that returned (whatever they answered): what "traffic flows" counts. */
    final LongAdder okCalls = new LongAdder();
    /** Keys of wrong and missed reads (a sample, for the report). */
    final ConcurrentSkipListSet<String> wrongSamples = new ConcurrentSkipListSet<>();
    final ConcurrentSkipListSet<String> missSamples = new ConcurrentSkipListSet<>();
    @GuardedBy("this")
    final List<ChaosEvent> events = new ArrayList<>();
    /** When traffic started: the origin of every time in the report. */
    volatile long startNanos = System.nanoTime();
    /** Filled by the final pass. */
    volatile long finalKeys;
    volatile long finalMustExist;
    volatile long lost;
    final ConcurrentSkipListSet<String> lostSamples = new ConcurrentSkipListSet<>();
    volatile double evictions = Double.NaN;
    volatile double repairCopies = Double.NaN;
    volatile double underReplicatedAtEnd = Double.NaN;
    volatile String healthAtEnd = "";

    /** One chaos event and what followed it. */
    record ChaosEvent(String kind, String target, long startNanos, long endNanos, long detectMillis, long repairMillis,
                      long resumeMillis, String note, long okCallsAtStart, long okCallsAtEnd) {
    }

    static void add(Map<String, LongAdder> m, String k) {
        m.computeIfAbsent(k, x -> new LongAdder()).increment();
    }

    void error(String kind, String sample) {
        add(errors, kind);
        errorSamples.putIfAbsent(kind, sample == null ? "" : sample);
    }

    /** Counts a verdict; for a wrong one or a miss, keeps {@code detail} (computed only then) as a sample. */
    void verdict(History.Verdict v, java.util.function.Supplier<String> detail) {
        verdicts.computeIfAbsent(v, x -> new LongAdder()).increment();
        if (v != History.Verdict.HIT && v != History.Verdict.MISS) {
            ConcurrentSkipListSet<String> s = v == History.Verdict.ACKNOWLEDGED_MISS ? missSamples : wrongSamples;
            if (s.size() < 20) {
                s.add(v + " " + detail.get());
            }
        }
    }

    long verdict(History.Verdict v) {
        LongAdder a = verdicts.get(v);
        return a == null ? 0 : a.sum();
    }

    /** Reads that returned something no correct pool could have returned. */
    long wrongReads() {
        return readsWithWrongBytes.sum() + verdict(History.Verdict.PHANTOM) + verdict(History.Verdict.STALE)
                + verdict(History.Verdict.REFUSED_VISIBLE);
    }

    long totalOps() {
        long n = 0;
        for (LongAdder a : ops.values()) {
            n += a.sum();
        }
        return n;
    }

    long totalErrors() {
        long n = 0;
        for (LongAdder a : errors.values()) {
            n += a.sum();
        }
        return n;
    }

    synchronized void event(ChaosEvent e) {
        events.add(e);
    }

    synchronized List<ChaosEvent> events() {
        return new ArrayList<>(events);
    }

    static Map<String, Long> snapshot(Map<String, LongAdder> m) {
        Map<String, Long> out = new TreeMap<>();
        m.forEach((k, v) -> out.put(k, v.sum()));
        return out;
    }
}

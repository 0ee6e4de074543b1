package io.kvpool.bench.soak;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Every put and removal the soak issued, per key, with when it began and returned: the model a read
 * is judged against.
 *
 * <h2>Times</h2>
 * An operation's start is read from the clock before the call and its end after the call returned,
 * so the recorded interval contains the real one. Every rule below uses the recorded times only in
 * the direction where that containment makes it conservative: "X returned before the read began"
 * is {@code X.end < read.start}, "X began after P returned" is {@code X.start > P.end}.
 *
 * <h2>What a read may return</h2>
 * The pool's semantics for one key: a put stores its value only when the key is absent (otherwise
 * ALREADY_EXISTS, nothing changes); a removal makes the key absent. A read that returned version
 * {@code w} of a key is correct only if all of these hold, and each failed rule is a wrong read of
 * its own kind:
 * <ul>
 *   <li><b>phantom</b>: a put of {@code w} on this key exists and began before the read returned;</li>
 *   <li><b>refused visible</b>: that put did not answer that it stored nothing (ALREADY_EXISTS,
 *       POOL_FULL, NO_SEGMENT, FENCED, FAILED);</li>
 *   <li><b>stale</b>: no operation that began after the put of {@code w} returned, and returned before
 *       the read began, proved {@code w} gone: a removal of the key (whatever it answered), or a put
 *       of another version answered OK (the key was absent when it stored).</li>
 * </ul>
 * A put that threw may still take effect later (a retried or delayed request); its end counts as
 * {@link #UNSURE_GRACE_NANOS} later for staleness, and a removal that threw is never proof.
 *
 * <h2>What a read must return</h2>
 * A put answered OK with its full replica count is <em>acknowledged</em>. A read that returned
 * nothing although an acknowledged put of the key returned before the read began, and no removal of
 * the key (including ones that threw, for {@link #UNSURE_GRACE_NANOS} after they did, and ones still
 * in flight) overlapped the time from that put's start to the read's end, is a <em>miss of an
 * acknowledged object</em>. During chaos such a miss may be transient (the object is found again
 * later); the soak's final pass, run after every fault has healed, counts the ones that are gone for
 * good: the <em>acknowledged lost</em>.
 *
 * <p>Operations still in flight when a read is judged count as if they might end at any time: they
 * never make a read wrong. Reads are judged some seconds after they return, and again all together
 * at the end, when nothing is in flight.
 */
final class History {

    /** How long after it threw an operation may still take effect (above the client's request timeout). */
    static final long UNSURE_GRACE_NANOS = 30_000_000_000L;

    enum Kind { PUT, REMOVE }

    /** How an operation ended: still running, done (OK / stored nothing), or threw (unknown effect). */
    enum Outcome { PENDING, STORED, NOT_STORED, DONE, THREW }

    /** The verdict on one read. */
    enum Verdict { HIT, MISS, PHANTOM, REFUSED_VISIBLE, STALE, ACKNOWLEDGED_MISS }

    /** One put or removal of a key. Fields after construction are written once, when it returns. */
    static final class Op {
        final Kind kind;
        final long version;
        final long start;
        volatile long end;
        volatile Outcome outcome = Outcome.PENDING;
        volatile boolean fullCopies;

        Op(Kind kind, long version, long start) {
            this.kind = kind;
            this.version = version;
            this.start = start;
        }

        /** Records the outcome; {@code fullCopies}: an OK put that reached its full replica count. */
        void finish(Outcome o, boolean full) {
            this.end = System.nanoTime();
            this.fullCopies = full;
            this.outcome = o;
        }

        boolean acknowledged() {
            return kind == Kind.PUT && outcome == Outcome.STORED && fullCopies;
        }

        /** The latest time this operation may take effect (MAX_VALUE: unknown yet). */
        long latestEffect() {
            return switch (outcome) {
                case PENDING -> Long.MAX_VALUE;
                case THREW -> end + UNSURE_GRACE_NANOS;
                default -> end;
            };
        }
    }

    private final Map<String, List<Op>> ops = new HashMap<>();

    History(List<String> keys) {
        for (String k : keys) {
            ops.put(k, new ArrayList<>());
        }
    }

    /** Records the start of an operation on {@code key} (call just before issuing it). */
    Op begin(String key, Kind kind, long version) {
        List<Op> list = ops.get(key);
        Op op = new Op(kind, version, System.nanoTime());
        synchronized (list) {
            list.add(op);
        }
        return op;
    }

    private Op[] snapshot(String key) {
        List<Op> list = ops.get(key);
        synchronized (list) {
            return list.toArray(new Op[0]);
        }
    }

    /**
     * Judges a read of {@code key} that began at {@code start}, returned at {@code end} and found
     * {@code version} (-1: nothing).
     */
    Verdict judge(String key, long version, long start, long end) {
        Op[] h = snapshot(key);
        if (version < 0) {
            // only the acknowledged put that began last matters: a removal that may have undone an
            // earlier one (it may take effect after that put began) may also have undone a later one
            Op last = null;
            for (Op p : h) {
                if (p.acknowledged() && p.end < start && (last == null || p.start > last.start)) {
                    last = p;
                }
            }
            if (last == null) {
                return Verdict.MISS;
            }
            for (Op x : h) {
                if (x.kind == Kind.REMOVE && x.start < end && x.latestEffect() > last.start) {
                    return Verdict.MISS;
                }
            }
            return Verdict.ACKNOWLEDGED_MISS;
        }
        Op put = null;
        for (Op p : h) {
            if (p.kind == Kind.PUT && p.version == version) {
                put = p;
                break;
            }
        }
        if (put == null || put.start > end) {
            return Verdict.PHANTOM;
        }
        if (put.outcome == Outcome.NOT_STORED) {
            return Verdict.REFUSED_VISIBLE;
        }
        long installedBy = put.latestEffect();
        for (Op x : h) {
            boolean proof = x.kind == Kind.REMOVE ? x.outcome == Outcome.DONE
                    : x.outcome == Outcome.STORED && x.version != version;
            if (proof && x.start > installedBy && x.end < start) {
                return Verdict.STALE;
            }
        }
        return Verdict.HIT;
    }

    /**
     * Why a read of {@code version} was judged wrong, for the report: the put of that version and the
     * operation that proved it gone, in seconds since {@code origin}.
     */
    String explain(String key, long version, long start, long end, long origin) {
        Op[] h = snapshot(key);
        StringBuilder b = new StringBuilder(key).append(" v").append(version).append(": read ")
                .append(span(start, end, origin));
        Op put = null;
        for (Op p : h) {
            if (version < 0 ? p.acknowledged() && p.end < start && (put == null || p.start > put.start)
                    : p.kind == Kind.PUT && p.version == version) {
                put = p;
            }
        }
        if (put == null) {
            return b.append(version < 0 ? ", nothing acknowledged" : ", never put").toString();
        }
        if (version < 0) {
            return b.append(", missed acknowledged put v").append(put.version).append(' ')
                    .append(span(put.start, put.end, origin)).toString();
        }
        b.append(", put ").append(span(put.start, put.end, origin)).append(' ').append(put.outcome);
        long installedBy = put.latestEffect();
        for (Op x : h) {
            boolean proof = x.kind == Kind.REMOVE ? x.outcome == Outcome.DONE
                    : x.outcome == Outcome.STORED && x.version != version;
            if (proof && x.start > installedBy && x.end < start) {
                b.append(", gone by ").append(x.kind == Kind.REMOVE ? "remove " : "put v" + x.version + " ")
                        .append(span(x.start, x.end, origin));
                break;
            }
        }
        return b.toString();
    }

    private static String span(long from, long to, long origin) {
        return String.format(java.util.Locale.ROOT, "+%.2fs..+%.2fs", (from - origin) / 1e9, (to - origin) / 1e9);
    }

    /** Whether {@code key} has an acknowledged put that no removal may have undone (for the final pass). */
    boolean mustExist(String key) {
        return judge(key, -1, Long.MAX_VALUE - 1, Long.MAX_VALUE) == Verdict.ACKNOWLEDGED_MISS;
    }
}

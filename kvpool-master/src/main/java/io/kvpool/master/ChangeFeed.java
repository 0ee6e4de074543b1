package io.kvpool.master;

import java.io.ByteArrayOutputStream;

/**
 * The leader's change feed: what standby masters follow so that a promoted one serves from a copy of the
 * leader's metadata at once, instead of rebuilding it from the nodes (docs/architecture.md, "Hot standby").
 *
 * <h2>Full-state records</h2>
 * Every record says what a thing is now, never what happened to it: an object record carries the object's
 * whole state (length, generation, copies wanted, pin, every replica), a removal says the key is gone, a
 * cleared shard that the shard is empty, a segment record the whole registration. Applying a record is
 * therefore idempotent, and applying an older record and then every later one for the same thing ends in the
 * same state as applying only the later ones. That is what lets a standby take a snapshot while the leader
 * keeps changing ({@link FeedRecords}):
 * <ol>
 *   <li>turn the feed on and read where it ends: position P;</li>
 *   <li>snapshot the index shard by shard (each shard under its lock) and the segments;</li>
 *   <li>apply the snapshot, then the feed from P.</li>
 * </ol>
 * A change before a shard's snapshot and after P is applied twice, the second time as a record older than the
 * snapshot; every change to the same key after that record is in the feed too, so the key ends right.
 *
 * <h2>Order</h2>
 * The index appends under the shard's lock ({@link ObjectEvents.Shard}), so the records of one key are in the
 * order its changes happened; records of keys in different shards interleave in any order, which full-state
 * records do not mind. Segment and epoch records are appended under the epoch write lock.
 *
 * <h2>Bounded</h2>
 * The feed keeps at most {@code maxBytes} of records (and at most {@link #MAX_RECORDS}); the oldest go first.
 * A follower that asks for a position no longer kept is told it is behind and starts over from a snapshot. The
 * leader never waits for a follower. Until the first follower asks, the feed is off and each hook costs one
 * volatile read.
 *
 * <h2>Cost</h2>
 * An append encodes one record (under the shard's lock, as the KV events do) and takes this feed's monitor for a
 * few stores. Followers read in batches, waiting on the monitor when they are at the end.
 */
final class ChangeFeed {

    /** Records kept at most, whatever their bytes. */
    static final int MAX_RECORDS = 1 << 22;
    static final long DEFAULT_MAX_BYTES = 64L << 20;

    private final long maxBytes;
    private volatile boolean on;
    private byte[][] ring = new byte[1024][];
    /** Position of the oldest record kept. */
    private long first;
    /** Position of the next record. */
    private long next;
    private long bytes;
    /** Records dropped unread because the feed was full: a follower behind them starts over. */
    private long dropped;

    ChangeFeed(long maxBytes) {
        this.maxBytes = maxBytes;
    }

    boolean on() {
        return on;
    }

    /** Turns the feed on (a follower asked) and returns where it ends now. */
    synchronized long start() {
        on = true;
        return next;
    }

    /** Appends a record; does nothing while the feed is off. */
    void append(byte[] record) {
        if (!on) {
            return;
        }
        synchronized (this) {
            if (next - first == ring.length) {
                if (ring.length < MAX_RECORDS) {
                    grow();
                } else {
                    dropOldest();
                }
            }
            while (bytes + record.length > maxBytes && first < next) {
                dropOldest();
            }
            ring[(int) (next & (ring.length - 1))] = record;
            next++;
            bytes += record.length;
            notifyAll();
        }
    }

    private void grow() {
        byte[][] bigger = new byte[ring.length * 2][];
        for (long p = first; p < next; p++) {
            bigger[(int) (p & (bigger.length - 1))] = ring[(int) (p & (ring.length - 1))];
        }
        ring = bigger;
    }

    private void dropOldest() {
        int i = (int) (first & (ring.length - 1));
        bytes -= ring[i].length;
        ring[i] = null;
        first++;
        dropped++;
    }

    /** Records from a position, as one follower reads them. */
    record Batch(boolean behind, long next, int count, byte[] records) {
    }

    /**
     * The records from {@code from} on, up to about {@code maxBytes} (at least one), waiting up to {@code waitNanos}
     * for the first when there is none yet. {@code behind} when {@code from} is no longer kept.
     */
    synchronized Batch read(long from, int maxBytes, long waitNanos) throws InterruptedException {
        if (from > next) {
            throw new IllegalArgumentException("feed position " + from + " is past the end (" + next + ")");
        }
        long deadline = System.nanoTime() + waitNanos;
        while (from == next && from >= first) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return new Batch(false, from, 0, new byte[0]);
            }
            wait(Math.max(1, left / 1_000_000), 0);
        }
        if (from < first) {
            return new Batch(true, next, 0, new byte[0]);
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        long p = from;
        while (p < next && (p == from || out.size() + ring[(int) (p & (ring.length - 1))].length <= maxBytes)) {
            out.writeBytes(ring[(int) (p & (ring.length - 1))]);
            p++;
        }
        return new Batch(false, p, (int) (p - from), out.toByteArray());
    }

    /** Where the feed ends now. */
    synchronized long end() {
        return next;
    }

    /** Records dropped unread because the feed was full. */
    synchronized long dropped() {
        return dropped;
    }

    /** Bytes of records kept now. */
    synchronized long bytes() {
        return bytes;
    }
}

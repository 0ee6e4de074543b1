package io.kvpool.master.events;

/**
 * The last batches published, for subscribers that missed some: a ring of the newest
 * {@code capacity} (sequence, payload) pairs, as vLLM keeps its {@code buffer_steps}. Used by the
 * publisher thread alone.
 */
final class ReplayBuffer {

    /** What a replay does with each batch kept. */
    @FunctionalInterface
    interface BatchVisitor {
        void visit(long seq, byte[] payload);
    }

    private final long[] seqs;
    private final byte[][] payloads;
    /** Batches added in all; the newest is at {@code (added - 1) % capacity}. */
    private long added;

    ReplayBuffer(int capacity) {
        this.seqs = new long[capacity];
        this.payloads = new byte[capacity][];
    }

    void add(long seq, byte[] payload) {
        int at = (int) (added % seqs.length);
        seqs[at] = seq;
        payloads[at] = payload;
        added++;
    }

    /** Batches kept now. */
    int size() {
        return (int) Math.min(added, seqs.length);
    }

    /** Visits every batch kept whose sequence is at least {@code start} (unsigned), oldest first. */
    void forEachFrom(long start, BatchVisitor v) {
        int n = size();
        long first = added - n;
        for (long i = first; i < added; i++) {
            int at = (int) (i % seqs.length);
            if (Long.compareUnsigned(seqs[at], start) >= 0) {
                v.visit(seqs[at], payloads[at]);
            }
        }
    }
}

package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;
import java.util.function.LongSupplier;

/**
 * Announces a block only while its parent is listed, as an engine does. A router that links each stored block to
 * its parent (llm-d's index and Dynamo's radix tree do, and drop a block whose parent they do not hold) needs
 * that, and the master does not list blocks in that order: a batch put commits shard by shard, so a chain's blocks
 * reach the publisher in shard order, often one batch each; and a spill takes a block out of memory at eviction
 * and lists it on the SSD tier only when the node wrote it, so a child can land on the SSD tier while its parent
 * is still on the way there, listed nowhere.
 *
 * <p>So this keeps, for the blocks connectors described ({@link BlockInfo}), the media a router was told each is
 * in, and holds back a store whose info names a parent that is listed nowhere (and not among the stores at
 * hand) for up to {@link #HOLD_NANOS} for the parent to come; when it does, the parent goes first
 * ({@link EventBatchCodec} orders a run of stores by their chains). A held store goes out after that anyway (its
 * parent may have been let go from {@link #RECENT}, or never saved). The hold is time, not publisher cycles: a
 * burst of events runs many cycles in a millisecond, and a parent's spill (the node's write to its disk, then
 * NODE_DISK_ADD) takes longer than that; with a hold of four cycles a fresh clone's llm-d test once saw a child
 * on the SSD tier announced before its parent, which llm-d then dropped. A removal of a held key, or a
 * reset, first lets out what it would pass, so holding never reorders a store against a later removal of the same
 * key. Stores without infos are never held.
 *
 * <p>Publisher thread only.
 */
final class ChainOrder {

    /** How long a store waits for its parent at most. */
    static final long HOLD_NANOS = 2_000_000_000L;
    /** Described blocks whose media are remembered (the least recently changed are let go). */
    static final int RECENT = 1 << 16;

    /** A store held back since {@code since} ({@link #nanos}). */
    private record Held(KvEvent.Stored store, long hash, BlockInfo info, long since) {
    }

    private final Function<byte[], BlockInfo> infos;
    /** The time, in nanoseconds, for the holds ({@link System#nanoTime} in the publisher). */
    private final LongSupplier nanos;
    /** Described blocks a router was told are listed, and in which media (bits of {@link Medium#ordinal}). */
    private final LinkedHashMap<Long, Integer> listed = new LinkedHashMap<>(16, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<Long, Integer> eldest) {
            return size() > RECENT;
        }
    };
    private List<Held> held = new ArrayList<>();

    ChainOrder(Function<byte[], BlockInfo> infos, LongSupplier nanos) {
        this.infos = infos;
        this.nanos = nanos;
    }

    /** Whether stores wait for their parents (the publisher then runs {@link #next} on idle cycles too). */
    boolean holding() {
        return !held.isEmpty();
    }

    /** What to publish now, of {@code batch} (the events just taken, possibly none) and what was held. */
    List<KvEvent> next(List<KvEvent> batch) {
        List<KvEvent> out = new ArrayList<>(batch.size() + held.size());
        boolean described = !held.isEmpty();
        long now = nanos.getAsLong();
        for (KvEvent e : batch) {
            switch (e) {
                case KvEvent.Stored s -> {
                    for (byte[] key : s.keys()) {
                        BlockInfo info = infos.apply(key);
                        if (info == null) {
                            out.add(new KvEvent.Stored(List.of(key), s.medium()));
                        } else {
                            described = true;
                            held.add(new Held(new KvEvent.Stored(List.of(key), s.medium()), BlockHashes.of(key), info, now));
                        }
                    }
                }
                case KvEvent.Removed r -> {
                    Set<Long> gone = new HashSet<>();
                    for (byte[] key : r.keys()) {
                        if (described || infos.apply(key) != null) {
                            gone.add(BlockHashes.of(key));
                        }
                    }
                    letOut(out, h -> gone.contains(h.hash()));
                    out.add(r);
                    for (long h : gone) {
                        listed.computeIfPresent(h, (k, m) -> (m & ~(1 << r.medium().ordinal())) == 0 ? null
                                : m & ~(1 << r.medium().ordinal()));
                    }
                }
                case KvEvent.AllCleared c -> {
                    letOut(out, h -> true);
                    out.add(c);
                    listed.clear();
                }
            }
        }
        if (!described) {
            return batch; // nothing described: as it came (the stores split per key above are not used)
        }
        // what can go now: a block whose parent is listed (or none is named), parents before children; then what
        // waited long enough
        for (boolean more = true; more; ) {
            more = letOut(out, h -> h.info().parentBlockHash() == null || listed.containsKey(h.info().parentBlockHash()));
        }
        letOut(out, h -> now - h.since() >= HOLD_NANOS);
        return out;
    }

    /** Lets out, in order, every held store {@code which} takes; true if any. */
    private boolean letOut(List<KvEvent> out, java.util.function.Predicate<Held> which) {
        boolean any = false;
        List<Held> stay = new ArrayList<>(held.size());
        for (Held h : held) {
            if (which.test(h)) {
                out.add(h.store());
                listed.merge(h.hash(), 1 << h.store().medium().ordinal(), (a, b) -> a | b);
                any = true;
            } else {
                stay.add(h);
            }
        }
        held = stay;
        return any;
    }
}

package io.kvpool.connector;

import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The scheduler side both Java connectors share ({@link PoolConnector}, {@link LocalOffloadConnector}):
 * each request's block hashes, the match the last lookup offered, the loads the engine accepted, and
 * a step's work. Only the lookup's question, how many of these blocks the cache holds, differs
 * between them. The Python connector keeps the same rules; the contract vectors
 * ({@code connector-contract-vectors.json}) hold all three to them.
 *
 * <h2>Matches and loads across a reset</h2>
 * The engine acts on a lookup's answer later: it allocates blocks, then a step runs. A reset or a
 * weight switch in between makes the answer stale, but the engine already counts those tokens as
 * coming from the cache; dropping the plan would leave its blocks unfilled and unreported. So
 * {@link #voidAll()} keeps every pending answer and planned load, marked void: the alloc of a void
 * match plans void loads, and the step reports void loads as failed without reading anything (the
 * engine then recomputes or fails by its load failure policy).
 *
 * <h2>Misuse</h2>
 * A negative computed count, external tokens the last lookup did not offer, off a block boundary or
 * past the blocks allocated, are refused ({@link IllegalArgumentException} naming the request).
 * Computed tokens past the request's are refused by {@link ScheduledRequest} itself.
 *
 * <p>Thread-safe (one lock): the scheduler calls it, resets may come from another thread.
 */
final class Planner {

    private final BlockHasher hasher;
    // all guarded by this
    private final Map<String, List<BlockHash>> hashes = new HashMap<>();
    /** Per request: the tokens the engine had when the last lookup offered a match. */
    private final Map<String, Integer> matched = new HashMap<>();
    /** The same, for matches offered before a reset or weight switch. */
    private final Map<String, Integer> voidMatched = new HashMap<>();
    private final List<ConnectorMeta.Load> planned = new ArrayList<>();
    private final List<ConnectorMeta.Load> voided = new ArrayList<>();

    Planner(BlockHasher hasher) {
        this.hasher = hasher;
    }

    /** The hashes of the request's full blocks, computed once per block as the request grows. */
    synchronized List<BlockHash> hashes(ConnectorRequest r) {
        List<BlockHash> h = hashes.get(r.id());
        int full = hasher.fullBlocks(r.numTokens());
        if (h == null || h.size() < full) {
            List<BlockHash> grown = h == null ? new ArrayList<>(full) : new ArrayList<>(h);
            BlockHash parent = grown.isEmpty() ? hasher.root() : grown.getLast();
            for (int b = grown.size(); b < full; b++) {
                parent = hasher.next(parent, r.tokens(), b * hasher.blockSize(), r.extraKeysFor(b));
                grown.add(parent);
            }
            hashes.put(r.id(), grown);
            h = grown;
        }
        return h;
    }

    /**
     * The first block a lookup with {@code computed} tokens local asks about (a partly computed block
     * is asked whole), or -1 when no full block is left to ask about.
     */
    int firstBlock(ConnectorRequest r, int computed) {
        if (computed < 0) {
            throw new IllegalArgumentException("request " + r.id() + ": " + computed + " computed tokens (negative)");
        }
        int start = computed / hasher.blockSize();
        return start >= hasher.fullBlocks(r.numTokens()) ? -1 : start;
    }

    /**
     * Records a lookup's answer: {@code present} blocks held from block {@code start} on, for a
     * request with {@code computed} tokens local. The latest answer is the one the engine acts on.
     */
    synchronized Match answer(ConnectorRequest r, int computed, int start, int present) {
        int tokens = start < 0 ? 0 : (start + present) * hasher.blockSize() - computed;
        voidMatched.remove(r.id());
        if (tokens <= 0) {
            matched.remove(r.id());
            return Match.NONE;
        }
        matched.put(r.id(), computed);
        return new Match(tokens, false);
    }

    /** The engine allocated {@code blockIds} and takes {@code external} tokens: plan their loads. */
    synchronized void alloc(ConnectorRequest r, int[] blockIds, int external, KeyFormat keys) {
        Integer computed = matched.remove(r.id());
        Integer stale = voidMatched.remove(r.id());
        if (external <= 0) {
            return;
        }
        List<ConnectorMeta.Load> into = planned;
        if (computed == null) {
            if (stale == null) {
                throw new IllegalArgumentException("request " + r.id() + ": " + external
                        + " external tokens, but the last lookup offered none");
            }
            computed = stale;
            into = voided; // matched before a reset: the engine counts on these tokens, so they fail
        }
        int bs = hasher.blockSize();
        if ((computed + external) % bs != 0) {
            throw new IllegalArgumentException("request " + r.id() + ": " + computed + " computed plus " + external
                    + " external tokens do not end on a block boundary (block size " + bs + ")");
        }
        List<BlockHash> h = hashes(r);
        int start = computed / bs; // a partly computed first block is loaded whole: same bytes
        int end = (computed + external) / bs;
        if (end > h.size() || end > blockIds.length) {
            throw new IllegalArgumentException("request " + r.id() + ": " + external + " external tokens after "
                    + computed + " need " + end + " blocks; it has " + blockIds.length + " allocated and " + h.size()
                    + " full");
        }
        for (int b = start; b < end; b++) {
            into.add(new ConnectorMeta.Load(r.id(), blockIds[b], b, keys.keyString(h.get(b))));
        }
    }

    /** The step's work: the loads planned since the last call, and saves of the blocks that fill in it. */
    synchronized ConnectorMeta build(List<ScheduledRequest> scheduled, KeyFormat keys, long generation) {
        int bs = hasher.blockSize();
        List<ConnectorMeta.Save> saves = new ArrayList<>();
        for (ScheduledRequest s : scheduled) {
            int firstNew = s.computedBefore() / bs; // a block partly computed before may fill now
            int filled = s.computedAfter() / bs;
            if (filled <= firstNew) {
                continue;
            }
            List<BlockHash> h = hashes(s.request());
            for (int b = firstNew; b < filled && b < s.blockIds().length; b++) {
                saves.add(new ConnectorMeta.Save(s.request().id(), s.blockIds()[b], b, keys.keyString(h.get(b))));
            }
        }
        ConnectorMeta meta = new ConnectorMeta(List.copyOf(planned), saves, generation, List.copyOf(voided), List.of());
        planned.clear();
        voided.clear();
        return meta;
    }

    /** A reset or weight switch: every pending match and planned load becomes void (see the class note). */
    synchronized void voidAll() {
        voided.addAll(planned);
        planned.clear();
        voidMatched.putAll(matched);
        matched.clear();
    }

    /** Forgets a finished request's hashes and match. */
    synchronized void forget(String requestId) {
        hashes.remove(requestId);
        matched.remove(requestId);
        voidMatched.remove(requestId);
    }
}

package io.kvpool.connector;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Several connectors as one, like vLLM's MultiConnector: a request loads from the first child (in
 * order) that has any of its tokens; every child saves every block; a reset resets all and succeeds
 * only if all did. Typical use: a fast local cache first, then the pool.
 */
public final class MultiConnector implements KvConnector, VersionedKeys {

    private final List<KvConnector> children;
    /** The child a request loads from, when one had tokens for it. Scheduler thread. */
    @GuardedBy("this")
    private final Map<String, Integer> chosen = new HashMap<>();
    /** Children still saving a finished request's blocks. */
    @GuardedBy("this")
    private final Map<String, Set<Integer>> savingIn = new HashMap<>();

    public MultiConnector(List<KvConnector> children) {
        if (children.isEmpty()) {
            throw new IllegalArgumentException("a MultiConnector needs at least one child");
        }
        this.children = List.copyOf(children);
    }

    public List<KvConnector> children() {
        return children;
    }

    @Override
    public synchronized Match getNumNewMatchedTokens(ConnectorRequest request, int numComputedTokens) {
        chosen.remove(request.id());
        for (int i = 0; i < children.size(); i++) {
            Match m = children.get(i).getNumNewMatchedTokens(request, numComputedTokens);
            if (m.tokens() > 0) {
                chosen.put(request.id(), i);
                return m;
            }
        }
        return Match.NONE;
    }

    @Override
    public synchronized void updateStateAfterAlloc(ConnectorRequest request, int[] blockIds, int numExternalTokens) {
        Integer c = chosen.remove(request.id());
        if (c == null && numExternalTokens > 0) {
            throw new IllegalArgumentException("request " + request.id() + ": " + numExternalTokens
                    + " external tokens, but the last lookup offered none");
        }
        for (int i = 0; i < children.size(); i++) {
            children.get(i).updateStateAfterAlloc(request, blockIds, c != null && c == i ? numExternalTokens : 0);
        }
    }

    @Override
    public ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled) {
        List<ConnectorMeta> metas = new ArrayList<>(children.size());
        for (KvConnector c : children) {
            metas.add(c.buildConnectorMeta(scheduled));
        }
        return new ConnectorMeta(List.of(), List.of(), 0, metas);
    }

    @Override
    public synchronized boolean requestFinished(ConnectorRequest request, int[] blockIds) {
        chosen.remove(request.id());
        Set<Integer> pending = new HashSet<>();
        for (int i = 0; i < children.size(); i++) {
            if (children.get(i).requestFinished(request, blockIds)) {
                pending.add(i);
            }
        }
        if (pending.isEmpty()) {
            return false;
        }
        savingIn.put(request.id(), pending);
        return true;
    }

    @Override
    public ResetResult resetCache() {
        long removed = 0;
        List<String> failures = new ArrayList<>();
        for (KvConnector c : children) {
            ResetResult r = c.resetCache();
            removed += r.removed();
            if (!r.success()) {
                failures.add(r.message());
            }
        }
        return failures.isEmpty() ? ResetResult.ok(removed)
                : new ResetResult(false, removed, String.join("; ", failures));
    }

    private ConnectorMeta child(ConnectorMeta meta, int i) {
        if (meta.children().size() != children.size()) {
            throw new IllegalArgumentException("a MultiConnector step needs the meta it built (" + children.size()
                    + " children), got one with " + meta.children().size());
        }
        return meta.children().get(i);
    }

    @Override
    public void startLoadKv(ConnectorMeta meta, PagedKv kv) {
        for (int i = 0; i < children.size(); i++) {
            children.get(i).startLoadKv(child(meta, i), kv);
        }
    }

    @Override
    public void waitForLayerLoad(int layer) {
        for (KvConnector c : children) {
            c.waitForLayerLoad(layer);
        }
    }

    @Override
    public void saveKvLayer(int layer, PagedKv kv) {
        for (KvConnector c : children) {
            c.saveKvLayer(layer, kv);
        }
    }

    @Override
    public void waitForSave() {
        for (KvConnector c : children) {
            c.waitForSave();
        }
    }

    @Override
    public void waitForRequestSaves(Set<String> requestIds) {
        for (KvConnector c : children) {
            c.waitForRequestSaves(requestIds);
        }
    }

    @Override
    public synchronized Set<String> getFinished(Set<String> finishedRequestIds) {
        Set<String> out = new HashSet<>();
        for (int i = 0; i < children.size(); i++) {
            for (String id : children.get(i).getFinished(finishedRequestIds)) {
                Set<Integer> pending = savingIn.get(id);
                if (pending != null && pending.remove(i) && pending.isEmpty()) {
                    savingIn.remove(id);
                    out.add(id);
                }
            }
        }
        return out;
    }

    @Override
    public Set<Integer> blockIdsWithLoadErrors() {
        Set<Integer> out = new HashSet<>();
        for (KvConnector c : children) {
            out.addAll(c.blockIdsWithLoadErrors());
        }
        return out;
    }

    @Override
    public ConnectorStats stats() {
        ConnectorStats s = ConnectorStats.ZERO;
        for (KvConnector c : children) {
            s = s.plus(c.stats());
        }
        return s;
    }

    @Override
    public int savesInFlight() {
        int n = 0;
        for (KvConnector c : children) {
            n += c.savesInFlight();
        }
        return n;
    }

    /** Switches every child that has versioned keys; the future sums their reclaims. */
    @Override
    public java.util.concurrent.CompletableFuture<Long> switchWeights(String weightsVersion, boolean reclaim) {
        java.util.concurrent.CompletableFuture<Long> all = java.util.concurrent.CompletableFuture.completedFuture(0L);
        for (KvConnector c : children) {
            if (c instanceof VersionedKeys v) {
                all = all.thenCombine(v.switchWeights(weightsVersion, reclaim), Long::sum);
            }
        }
        return all;
    }

    @Override
    public void close() {
        for (KvConnector c : children) {
            c.close();
        }
    }
}

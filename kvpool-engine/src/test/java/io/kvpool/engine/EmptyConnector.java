package io.kvpool.engine;

import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.ConnectorStats;
import io.kvpool.connector.KvConnector;
import io.kvpool.connector.Match;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.ResetResult;
import io.kvpool.connector.ScheduledRequest;

import java.util.List;
import java.util.Set;

/** A test connector that holds nothing and does nothing; tests override the part they exercise. */
class EmptyConnector implements KvConnector {
    @Override
    public Match getNumNewMatchedTokens(ConnectorRequest r, int computed) {
        return Match.NONE;
    }

    @Override
    public void updateStateAfterAlloc(ConnectorRequest r, int[] blockIds, int external) {
    }

    @Override
    public ConnectorMeta buildConnectorMeta(List<ScheduledRequest> s) {
        return ConnectorMeta.EMPTY;
    }

    @Override
    public boolean requestFinished(ConnectorRequest r, int[] blockIds) {
        return false;
    }

    @Override
    public ResetResult resetCache() {
        return ResetResult.ok(0);
    }

    @Override
    public void startLoadKv(ConnectorMeta meta, PagedKv kv) {
    }

    @Override
    public void waitForLayerLoad(int layer) {
    }

    @Override
    public void saveKvLayer(int layer, PagedKv kv) {
    }

    @Override
    public void waitForSave() {
    }

    @Override
    public Set<String> getFinished(Set<String> finished) {
        return Set.of();
    }

    @Override
    public Set<Integer> blockIdsWithLoadErrors() {
        return Set.of();
    }

    @Override
    public ConnectorStats stats() {
        return ConnectorStats.ZERO;
    }

    @Override
    public void close() {
    }
}

package io.kvpool.connector;

import java.util.List;

/**
 * One step's transfer work, built by the scheduler side ({@link KvConnector#buildConnectorMeta}) and
 * carried out by the worker side: blocks to load before the forward pass, blocks to save after it.
 * {@code generation} is the connector's cache generation when the step was planned: work planned
 * before a reset is never carried out after it.
 */
public record ConnectorMeta(List<Load> loads, List<Save> saves, long generation, List<ConnectorMeta> children) {

    /** Fill block {@code blockId} of request {@code requestId} from the object {@code key}. */
    public record Load(String requestId, int blockId, int blockIndex, String key) {
    }

    /** Save block {@code blockId} (the request's block number {@code blockIndex}) as {@code key}. */
    public record Save(String requestId, int blockId, int blockIndex, String key) {
    }

    public static final ConnectorMeta EMPTY = new ConnectorMeta(List.of(), List.of(), 0, List.of());

    public ConnectorMeta(List<Load> loads, List<Save> saves, long generation) {
        this(loads, saves, generation, List.of());
    }

    public boolean isEmpty() {
        return loads.isEmpty() && saves.isEmpty() && children.stream().allMatch(ConnectorMeta::isEmpty);
    }
}

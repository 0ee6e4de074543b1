package io.kvpool.connector;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * One step's transfer work, built by the scheduler side ({@link KvConnector#buildConnectorMeta}) and
 * carried out by the worker side: blocks to load before the forward pass, blocks to save after it.
 * {@code generation} is the connector's cache generation when the step was planned: work planned
 * before a reset is never carried out after it. {@code voidLoads} were accepted by the engine before a
 * reset that came before this step was built: the worker reports their blocks as failed loads
 * without reading anything.
 */
public record ConnectorMeta(List<Load> loads, List<Save> saves, long generation, List<Load> voidLoads,
                            List<ConnectorMeta> children) {

    /** Fill block {@code blockId} (the request's block number {@code blockIndex}) from the object {@code key}. */
    public record Load(String requestId, int blockId, int blockIndex, String key) {
    }

    /** Save block {@code blockId} (the request's block number {@code blockIndex}) as {@code key}. */
    public record Save(String requestId, int blockId, int blockIndex, String key) {
    }

    public static final ConnectorMeta EMPTY = new ConnectorMeta(List.of(), List.of(), 0, List.of(), List.of());

    public ConnectorMeta(List<Load> loads, List<Save> saves, long generation) {
        this(loads, saves, generation, List.of(), List.of());
    }

    public ConnectorMeta(List<Load> loads, List<Save> saves, long generation, List<ConnectorMeta> children) {
        this(loads, saves, generation, List.of(), children);
    }

    public boolean isEmpty() {
        return loads.isEmpty() && saves.isEmpty() && voidLoads.isEmpty()
                && children.stream().allMatch(ConnectorMeta::isEmpty);
    }

    /**
     * The saves whose blocks were not computed over a failed load: a block's KV depends on every block
     * before it, so once a request's load of block i failed ({@code failedBlockIds}, of this step's
     * loads and void loads), its blocks after i computed in this step are wrong and must not be stored
     * under the keys of the right tokens.
     */
    public List<Save> savesNotOverFailedLoads(Set<Integer> failedBlockIds) {
        if (failedBlockIds.isEmpty()) {
            return saves;
        }
        Map<String, Integer> firstFailed = new HashMap<>();
        for (List<Load> list : List.of(loads, voidLoads)) {
            for (Load l : list) {
                if (failedBlockIds.contains(l.blockId())) {
                    firstFailed.merge(l.requestId(), l.blockIndex(), Math::min);
                }
            }
        }
        if (firstFailed.isEmpty()) {
            return saves;
        }
        return saves.stream().filter(s -> s.blockIndex() < firstFailed.getOrDefault(s.requestId(), Integer.MAX_VALUE))
                .toList();
    }
}

package io.kvpool.connector;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * One step's transfer work, built by the scheduler side ({@link KvConnector#buildConnectorMeta}) and
 * carried out by the worker side: blocks to load before the forward pass, blocks to save after it.
 * {@code generation} is the connector's cache generation when the step was planned: work planned
 * before a reset is never carried out after it.
 *
 * <h2>A failed load poisons the step's saves of its request</h2>
 * A request's blocks computed in a step attend over the blocks loaded for it in that step. When one
 * of those loads fails, the block holds whatever it held before, so everything the request computed
 * in the step is wrong (the engine throws it away and recomputes) and none of it may be saved: a
 * saved block would be wrong KV under a correct key, served to every later reader, and the
 * recomputation's own save would then be refused as already present. {@link #savesWithoutFailedLoads}
 * is that rule; connectors apply it when the step's loads have settled, before saving.
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

    /**
     * This step's saves, less those of every request one of whose loads in this step failed
     * ({@code failedBlocks}: block ids whose load failed).
     */
    public List<Save> savesWithoutFailedLoads(Set<Integer> failedBlocks) {
        if (failedBlocks.isEmpty() || saves.isEmpty()) {
            return saves;
        }
        Set<String> poisoned = new HashSet<>();
        for (Load l : loads) {
            if (failedBlocks.contains(l.blockId())) {
                poisoned.add(l.requestId());
            }
        }
        if (poisoned.isEmpty()) {
            return saves;
        }
        List<Save> kept = new ArrayList<>(saves.size());
        for (Save s : saves) {
            if (!poisoned.contains(s.requestId())) {
                kept.add(s);
            }
        }
        return List.copyOf(kept);
    }

    public boolean isEmpty() {
        return loads.isEmpty() && saves.isEmpty() && children.stream().allMatch(ConnectorMeta::isEmpty);
    }
}

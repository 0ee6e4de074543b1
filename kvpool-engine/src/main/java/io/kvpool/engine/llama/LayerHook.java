package io.kvpool.engine.llama;

/** Where a forward pass lets the engine's connector in (vLLM's wait_for_layer_load and save_kv_layer). */
public interface LayerHook {

    /** Before layer {@code layer} reads any KV. */
    default void beforeLayer(int layer) {
    }

    /** After layer {@code layer}'s KV for the new tokens is written. */
    default void afterLayer(int layer) {
    }

    LayerHook NONE = new LayerHook() {
    };
}

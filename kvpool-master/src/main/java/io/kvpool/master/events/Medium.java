package io.kvpool.master.events;

/**
 * Where a router is told a block lives, in vLLM's words ({@code medium} of {@code BlockStored} and
 * {@code BlockRemoved}). The pool holds no GPU blocks: its memory tier is {@link #CPU}, a node's SSD
 * tier {@link #STORAGE}.
 */
public enum Medium {
    /** A node's memory segment. */
    CPU("CPU"),
    /** A node's SSD tier. */
    STORAGE("STORAGE");

    private final String wire;

    Medium(String wire) {
        this.wire = wire;
    }

    /** The string vLLM's event classes carry ({@code MEDIUM_CPU}, {@code MEDIUM_STORAGE}). */
    public String wire() {
        return wire;
    }
}

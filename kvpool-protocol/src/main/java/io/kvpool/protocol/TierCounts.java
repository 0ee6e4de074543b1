package io.kvpool.protocol;

/**
 * What a router asks of the pool about a prompt: of its block keys, in order, how many leading ones the pool holds
 * (the prefix an engine would load), and how many of those sit in memory and how many on the SSD tier only. From
 * TIER_LOOKUP's per-key codes ({@link #of}); the Python client's {@code kvpool.tiers.TierCounts} is the same.
 *
 * @param keys           keys asked about
 * @param prefixBlocks   leading keys present in some tier
 * @param memoryBlocks   of those, with a copy in memory
 * @param storageBlocks  of those, on the SSD tier only
 */
public record TierCounts(int keys, int prefixBlocks, int memoryBlocks, int storageBlocks) {

    /** A key the pool does not hold. */
    public static final byte ABSENT = 0;
    /** A key with a copy in memory. */
    public static final byte MEMORY = 1;
    /** A key whose copies are all on the SSD tier. */
    public static final byte STORAGE = 2;

    /** The counts of per-key codes ({@link #ABSENT}, {@link #MEMORY}, {@link #STORAGE}), in the keys' order. */
    public static TierCounts of(byte[] codes) {
        int prefix = 0;
        int memory = 0;
        while (prefix < codes.length && codes[prefix] != ABSENT) {
            memory += codes[prefix] == MEMORY ? 1 : 0;
            prefix++;
        }
        return new TierCounts(codes.length, prefix, memory, prefix - memory);
    }

    /** This answer as JSON, with token counts for blocks of {@code blockSize} tokens. */
    public String toJson(int blockSize) {
        return "{\"keys\":" + keys + ",\"block_size\":" + blockSize + ",\"prefix_blocks\":" + prefixBlocks
                + ",\"memory_blocks\":" + memoryBlocks + ",\"storage_blocks\":" + storageBlocks
                + ",\"tokens\":{\"prefix\":" + (long) prefixBlocks * blockSize + ",\"CPU\":" + (long) memoryBlocks * blockSize
                + ",\"STORAGE\":" + (long) storageBlocks * blockSize + "}}";
    }
}

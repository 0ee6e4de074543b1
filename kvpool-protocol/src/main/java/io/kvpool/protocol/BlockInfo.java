package io.kvpool.protocol;

import java.util.Arrays;
import java.util.Objects;

/**
 * What an engine knows of a block and the pool does not: its tokens, the block size, the hash of the
 * block before it, its LoRA and its cache salt. A connector sends it (BLOCK_INFO, version 14) for the
 * keys it is about to save, and the master's KV events for routers then carry it in each key's
 * {@code BlockStored}, as the engine's own events would: routers such as Dynamo's and llm-d's compute
 * their own block hashes from the tokens, so a store event without them tells them nothing.
 *
 * <p>A connector key is a chained hash of the tokens up to its block, so the info of a key never
 * changes: the master may keep it past the object (it does, in a bounded table) without ever telling a
 * router something wrong.
 *
 * @param parentBlockHash the block hash (vLLM's unsigned 64-bit int form, in a long) of the block before,
 *                        or null for a first block
 * @param blockSize       tokens per block, 1..{@link #MAX_TOKENS}
 * @param tokenIds        the block's tokens (at most {@link #MAX_TOKENS}, each non-negative)
 * @param loraId          vLLM's deprecated LoRA id, or null
 * @param loraName        the LoRA adapter's name, or null (at most {@link #MAX_NAME_BYTES} UTF-8 bytes)
 * @param cacheSalt       the request's cache salt, or null (at most {@link #MAX_NAME_BYTES} UTF-8 bytes)
 */
public record BlockInfo(Long parentBlockHash, int blockSize, int[] tokenIds, Long loraId, String loraName,
                        String cacheSalt) {

    /** The most tokens one block's info may carry (and the largest block size). */
    public static final int MAX_TOKENS = 65_536;
    /** The longest LoRA name or cache salt, in UTF-8 bytes. */
    public static final int MAX_NAME_BYTES = 1024;

    public BlockInfo {
        Objects.requireNonNull(tokenIds, "tokenIds");
        String bad = problem(blockSize, tokenIds, loraName, cacheSalt);
        if (bad != null) {
            throw new IllegalArgumentException("block info: " + bad);
        }
    }

    /** A plain block: its tokens, its size and its parent's hash (null for the first). */
    public static BlockInfo of(Long parentBlockHash, int blockSize, int[] tokenIds) {
        return new BlockInfo(parentBlockHash, blockSize, tokenIds, null, null, null);
    }

    /** What is wrong with these fields, or null: the one check of the constructor and the wire reader. */
    static String problem(int blockSize, int[] tokenIds, String loraName, String cacheSalt) {
        if (blockSize < 1 || blockSize > MAX_TOKENS) {
            return "block size " + blockSize + " is outside 1.." + MAX_TOKENS;
        }
        if (tokenIds.length > MAX_TOKENS) {
            return tokenIds.length + " tokens are more than " + MAX_TOKENS;
        }
        for (int t : tokenIds) {
            if (t < 0) {
                return "token id " + t + " is negative";
            }
        }
        for (String s : new String[]{loraName, cacheSalt}) {
            if (s != null && s.getBytes(java.nio.charset.StandardCharsets.UTF_8).length > MAX_NAME_BYTES) {
                return "a LoRA name or cache salt of more than " + MAX_NAME_BYTES + " bytes";
            }
        }
        return null;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof BlockInfo b && Objects.equals(parentBlockHash, b.parentBlockHash)
                && blockSize == b.blockSize && Arrays.equals(tokenIds, b.tokenIds) && Objects.equals(loraId, b.loraId)
                && Objects.equals(loraName, b.loraName) && Objects.equals(cacheSalt, b.cacheSalt);
    }

    @Override
    public int hashCode() {
        return Objects.hash(parentBlockHash, blockSize, Arrays.hashCode(tokenIds), loraId, loraName, cacheSalt);
    }

    @Override
    public String toString() {
        return "BlockInfo[parent=" + parentBlockHash + ", blockSize=" + blockSize + ", tokens=" + tokenIds.length
                + (loraName != null ? ", lora=" + loraName : "") + (cacheSalt != null ? ", salted" : "") + "]";
    }
}

package io.kvpool.connector.hash;

import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;
import java.util.function.IntFunction;

/**
 * Chained block hashes over fixed-size token blocks, in vLLM's {@code sha256_cbor} scheme, so a
 * Java engine and a Python vLLM name the same blocks the same way:
 *
 * <pre>
 *   root      = SHA-256( CBOR( seed string ) )                       vLLM: PYTHONHASHSEED
 *   hash[0]   = SHA-256( CBOR( [ root,      [t0 .. t15],  extra keys or null ] ) )
 *   hash[i]   = SHA-256( CBOR( [ hash[i-1], [t16i .. ],   extra keys or null ] ) )
 * </pre>
 *
 * CBOR is the canonical encoding ({@link Cbor}); parent hashes are byte strings, token ids an array
 * of integers. Only full blocks are hashed: the tokens after the last full block have no hash and
 * are never looked up or saved. Since block i's hash covers block i-1's, one hash names a whole
 * prefix, and a lookup asks how many of a prompt's hashes, in order, are present.
 *
 * <p>Checked against vectors computed independently in Python ({@code scripts/gen-block-hash-vectors.py},
 * with Debian's python3-cbor2). Thread-safe (a digest and a buffer per thread).
 */
public final class BlockHasher {

    /** The default block size, in tokens (vLLM's default on GPUs). */
    public static final int DEFAULT_BLOCK_SIZE = 16;

    private final int blockSize;
    private final String seed;
    private final BlockHash root;

    /**
     * @param blockSize tokens per block, at least 1
     * @param seed      the hash seed (vLLM reads it from PYTHONHASHSEED; engines that share a pool
     *                  must use the same one)
     */
    public BlockHasher(int blockSize, String seed) {
        if (blockSize < 1) {
            throw new IllegalArgumentException("block size must be at least 1 token, got " + blockSize);
        }
        if (seed == null) {
            throw new IllegalArgumentException("hash seed must not be null (vLLM would use random bytes: no sharing)");
        }
        this.blockSize = blockSize;
        this.seed = seed;
        this.root = new BlockHash(sha256(Cbor.encode(seed)));
    }

    public int blockSize() {
        return blockSize;
    }

    public String seed() {
        return seed;
    }

    /** The parent of the first block. */
    public BlockHash root() {
        return root;
    }

    /** Full blocks in {@code tokenCount} tokens. */
    public int fullBlocks(int tokenCount) {
        return tokenCount / blockSize;
    }

    /** The hashes of every full block of {@code tokens}, with no extra keys. */
    public List<BlockHash> hashes(int[] tokens) {
        return hashes(tokens, tokens.length, b -> null);
    }

    /** The hashes of every full block of {@code tokens}, every block with the same extra keys. */
    public List<BlockHash> hashes(int[] tokens, List<?> extraKeys) {
        return hashes(tokens, tokens.length, b -> extraKeys);
    }

    /**
     * The hashes of the full blocks among the first {@code length} tokens; block b's extra keys (a
     * list, or null) are {@code extraKeys.apply(b)}.
     */
    public List<BlockHash> hashes(int[] tokens, int length, IntFunction<List<?>> extraKeys) {
        if (length < 0 || length > tokens.length) {
            throw new IllegalArgumentException("length " + length + " outside 0.." + tokens.length);
        }
        int n = length / blockSize;
        List<BlockHash> out = new ArrayList<>(n);
        BlockHash parent = root;
        for (int b = 0; b < n; b++) {
            parent = next(parent, tokens, b * blockSize, extraKeys.apply(b));
            out.add(parent);
        }
        return out;
    }

    /**
     * The hash of the block of {@code blockSize} tokens starting at {@code from}, under {@code parent}. The CBOR
     * is written straight into the calling thread's buffer and hashed with its digest: a save or a lookup hashes
     * every block of a prompt, and a digest looked up from the security providers and a stream of synchronized
     * writes per block were a fifth of the save bench's CPU at 32 KiB blocks.
     */
    public BlockHash next(BlockHash parent, int[] tokens, int from, List<?> extraKeys) {
        if (from < 0 || from + blockSize > tokens.length) {
            throw new IllegalArgumentException("block at " + from + " runs past the " + tokens.length + " tokens");
        }
        Scratch s = SCRATCH.get();
        byte[] buf = s.room(2 * 9 + BlockHash.LENGTH + 9 * blockSize + 1);
        int at = Cbor.head(buf, 0, 4, 3);
        at += Cbor.head(buf, at, 2, BlockHash.LENGTH);
        parent.copyTo(buf, at);
        at += BlockHash.LENGTH;
        at += Cbor.head(buf, at, 4, blockSize);
        for (int i = from; i < from + blockSize; i++) {
            at += Cbor.integer(buf, at, tokens[i]);
        }
        s.digest.update(buf, 0, at);
        if (extraKeys == null) {
            s.digest.update((byte) 0xf6);
        } else {
            s.digest.update(Cbor.encode(extraKeys));
        }
        return new BlockHash(s.digest.digest());
    }

    static byte[] sha256(byte[] data) {
        return SCRATCH.get().digest.digest(data);
    }

    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    /** A thread's SHA-256 digest (reset by each {@code digest()}) and CBOR buffer. */
    private static final class Scratch {
        final MessageDigest digest;
        byte[] buf = new byte[512];

        Scratch() {
            try {
                digest = MessageDigest.getInstance("SHA-256");
            } catch (NoSuchAlgorithmException e) {
                throw new IllegalStateException("SHA-256 is required of every JDK", e);
            }
        }

        byte[] room(int bytes) {
            if (buf.length < bytes) {
                buf = new byte[bytes];
            }
            return buf;
        }
    }
}

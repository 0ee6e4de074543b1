package io.kvpool.engine.llama;

/**
 * The shape of a Llama-architecture model.
 *
 * @param vocabSize  tokens; the byte-level tokenizer needs 258 (256 bytes, BOS, EOS)
 * @param dim        model width
 * @param nLayers    transformer blocks
 * @param nHeads     query heads
 * @param nKvHeads   key/value heads (grouped-query attention: nHeads is a multiple of it)
 * @param hiddenDim  SwiGLU inner width
 * @param normEps    RMSNorm epsilon
 * @param ropeTheta  rotary embedding base
 * @param maxSeqLen  longest sequence (prompt plus output)
 */
public record ModelConfig(int vocabSize, int dim, int nLayers, int nHeads, int nKvHeads, int hiddenDim, float normEps,
                          float ropeTheta, int maxSeqLen) {

    public static final int BOS = 256;
    public static final int EOS = 257;

    public ModelConfig {
        positive(vocabSize, "vocabSize");
        positive(dim, "dim");
        positive(nLayers, "nLayers");
        positive(nHeads, "nHeads");
        positive(nKvHeads, "nKvHeads");
        positive(hiddenDim, "hiddenDim");
        positive(maxSeqLen, "maxSeqLen");
        if (dim % nHeads != 0) {
            throw new IllegalArgumentException("model: dim (" + dim + ") must be a multiple of nHeads (" + nHeads + ")");
        }
        if (nHeads % nKvHeads != 0) {
            throw new IllegalArgumentException("model: nHeads (" + nHeads + ") must be a multiple of nKvHeads ("
                    + nKvHeads + ")");
        }
        if ((dim / nHeads) % 2 != 0) {
            throw new IllegalArgumentException("model: the head dimension (" + dim / nHeads
                    + ") must be even for rotary embeddings");
        }
        if (!(normEps > 0) || !(ropeTheta > 0)) {
            throw new IllegalArgumentException("model: normEps and ropeTheta must be positive");
        }
    }

    private static void positive(int v, String name) {
        if (v < 1) {
            throw new IllegalArgumentException("model: " + name + " must be at least 1, got " + v);
        }
    }

    /**
     * The default reference model: about 2.4 million parameters (width 256, 4 layers, 8 query and 2
     * KV heads of 32), sized so that on this project's 2-core machine a 2048-token prefill takes
     * seconds while its KV (2 KiB a token, 4 MiB for 2048 tokens) loads from the pool in
     * milliseconds; measured figures are in docs/benchmarks.md.
     */
    public static ModelConfig defaults() {
        return new ModelConfig(258, 256, 4, 8, 2, 512, 1e-5f, 10000f, 4096);
    }

    /** A model for tests: fast, but with every architectural feature (GQA, several layers). */
    public static ModelConfig tiny() {
        return new ModelConfig(258, 32, 2, 4, 2, 64, 1e-5f, 10000f, 1024);
    }

    public int headDim() {
        return dim / nHeads;
    }

    public int kvDim() {
        return nKvHeads * headDim();
    }

    public int eosToken() {
        return EOS;
    }

    /** KV bytes of one token: every layer's K and V, float32. */
    public long kvBytesPerToken() {
        return 2L * nLayers * kvDim() * Float.BYTES;
    }

    public long parameters() {
        long perLayer = 2L * dim + (long) dim * dim * 2 + 2L * dim * kvDim() + 3L * dim * hiddenDim;
        return (long) vocabSize * dim * 2 + dim + nLayers * perLayer;
    }
}

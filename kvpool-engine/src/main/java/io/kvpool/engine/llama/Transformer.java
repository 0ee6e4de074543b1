package io.kvpool.engine.llama;

import java.util.stream.IntStream;

/**
 * A Llama-architecture forward pass on CPU over a paged KV cache: RMSNorm, rotary position
 * embeddings (the "rotate half" pairing Hugging Face checkpoints use), grouped-query causal
 * attention, SwiGLU MLP, residuals, final norm, LM head.
 *
 * <h2>Bit-exact whatever the chunking</h2>
 * A token's results (its K and V, its logits) must not depend on how its sequence was split into
 * forward calls, nor on whether the KV of earlier positions was computed in this process or loaded
 * from the pool: that is what makes a pool hit give exactly the output of a recompute. So every
 * value is computed by one fixed sequence of floating-point operations that depends only on the
 * token's own inputs:
 * <ul>
 *   <li>each output of a matrix-vector product is one {@link #dot} (four interleaved partial sums
 *       over the row, combined in a fixed order), whichever thread computes it and whatever other
 *       tokens are in the call; work is split across threads by output rows or by (token, head),
 *       never inside a sum;</li>
 *   <li>attention for the token at position p reads K and V of positions 0..p (earlier ones from
 *       the cache, as stored: float32, the same bits) and reduces over them in position order;</li>
 *   <li>norms and softmax sum in index order.</li>
 * </ul>
 * {@code TransformerTest} checks this bit for bit across split points and against KV copied
 * between caches.
 */
public final class Transformer {

    private static final int ROW_CHUNKS = Math.max(2, 4 * Runtime.getRuntime().availableProcessors());

    private final ModelConfig c;
    private final Weights w;
    private final float[] invFreq;

    public Transformer(ModelConfig config, Weights weights) {
        if (!weights.config().equals(config)) {
            throw new IllegalArgumentException("weights are for " + weights.config() + ", not " + config);
        }
        this.c = config;
        this.w = weights;
        int half = config.headDim() / 2;
        this.invFreq = new float[half];
        for (int i = 0; i < half; i++) {
            invFreq[i] = (float) (1.0 / Math.pow(config.ropeTheta(), (2.0 * i) / config.headDim()));
        }
    }

    public ModelConfig config() {
        return c;
    }

    /**
     * Runs tokens {@code [start, start + count)} of a sequence; positions before {@code start} must
     * have their KV in the blocks of {@code blockTable} (position p in block {@code blockTable[p /
     * blockSize]}). Writes the new tokens' KV there and returns the logits of the last new token, or
     * with {@code allLogits} those of every new token ({@code count * vocab}, token-major).
     */
    public float[] forward(int[] tokens, int start, int count, int[] blockTable, KvBlocks kv, LayerHook hook,
                           boolean allLogits) {
        if (count < 1) {
            throw new IllegalArgumentException("forward needs at least one new token, got " + count);
        }
        int end = start + count;
        if (start < 0 || end > tokens.length) {
            throw new IllegalArgumentException("tokens [" + start + ", " + end + ") outside the " + tokens.length
                    + " given");
        }
        if (end > c.maxSeqLen()) {
            throw new IllegalArgumentException("position " + (end - 1) + " beyond the model's context of " + c.maxSeqLen());
        }
        int bs = kv.blockSize();
        if ((end + bs - 1) / bs > blockTable.length) {
            throw new IllegalArgumentException(end + " positions need " + (end + bs - 1) / bs + " blocks; the table has "
                    + blockTable.length);
        }
        int dim = c.dim();
        int kvDim = c.kvDim();
        float[][] x = new float[count][];
        for (int t = 0; t < count; t++) {
            int tok = tokens[start + t];
            if (tok < 0 || tok >= c.vocabSize()) {
                throw new IllegalArgumentException("token " + tok + " at position " + (start + t) + " outside the vocabulary");
            }
            x[t] = new float[dim];
            System.arraycopy(w.embedding, tok * dim, x[t], 0, dim);
        }
        float[][] xb = new float[count][dim];
        float[][] q = new float[count][dim];
        float[][] k = new float[count][kvDim];
        float[][] v = new float[count][kvDim];
        float[][] att = new float[count][dim];
        float[][] o = new float[count][dim];
        float[][] h1 = new float[count][c.hiddenDim()];
        float[][] h3 = new float[count][c.hiddenDim()];
        float[] keys = new float[end * kvDim];
        float[] values = new float[end * kvDim];
        for (int l = 0; l < c.nLayers(); l++) {
            hook.beforeLayer(l);
            Weights.Layer L = w.layers[l];
            for (int p = 0; p < start; p++) {
                kv.read(blockTable[p / bs], l, 0, p % bs, keys, p * kvDim);
                kv.read(blockTable[p / bs], l, 1, p % bs, values, p * kvDim);
            }
            for (int t = 0; t < count; t++) {
                rmsnorm(xb[t], x[t], L.attnNorm);
            }
            matmul(xb, L.wq, dim, dim, q);
            matmul(xb, L.wk, kvDim, dim, k);
            matmul(xb, L.wv, kvDim, dim, v);
            for (int t = 0; t < count; t++) {
                int pos = start + t;
                for (int h = 0; h < c.nHeads(); h++) {
                    rope(q[t], h * c.headDim(), pos);
                }
                for (int h = 0; h < c.nKvHeads(); h++) {
                    rope(k[t], h * c.headDim(), pos);
                }
                System.arraycopy(k[t], 0, keys, pos * kvDim, kvDim);
                System.arraycopy(v[t], 0, values, pos * kvDim, kvDim);
                kv.write(blockTable[pos / bs], l, 0, pos % bs, k[t], 0);
                kv.write(blockTable[pos / bs], l, 1, pos % bs, v[t], 0);
            }
            attention(q, keys, values, start, count, att);
            matmul(att, L.wo, dim, dim, o);
            for (int t = 0; t < count; t++) {
                add(x[t], o[t]);
                rmsnorm(xb[t], x[t], L.ffnNorm);
            }
            matmul(xb, L.w1, c.hiddenDim(), dim, h1);
            matmul(xb, L.w3, c.hiddenDim(), dim, h3);
            for (int t = 0; t < count; t++) {
                float[] a = h1[t];
                float[] b = h3[t];
                for (int i = 0; i < a.length; i++) {
                    float g = a[i];
                    a[i] = g / (1f + (float) Math.exp(-g)) * b[i];
                }
            }
            matmul(h1, L.w2, dim, c.hiddenDim(), o);
            for (int t = 0; t < count; t++) {
                add(x[t], o[t]);
            }
            hook.afterLayer(l);
        }
        int first = allLogits ? 0 : count - 1;
        int n = count - first;
        float[][] last = new float[n][];
        for (int t = 0; t < n; t++) {
            last[t] = new float[dim];
            rmsnorm(last[t], x[first + t], w.finalNorm);
        }
        float[][] logits = new float[n][c.vocabSize()];
        matmul(last, w.output, c.vocabSize(), dim, logits);
        if (n == 1) {
            return logits[0];
        }
        float[] flat = new float[n * c.vocabSize()];
        for (int t = 0; t < n; t++) {
            System.arraycopy(logits[t], 0, flat, t * c.vocabSize(), c.vocabSize());
        }
        return flat;
    }

    /** out[t] = W x[t] for every token, W row-major [rows][cols]; threads split the rows. */
    static void matmul(float[][] x, float[] wt, int rows, int cols, float[][] out) {
        int chunks = Math.min(ROW_CHUNKS, rows);
        long work = (long) rows * cols * x.length;
        IntStream range = IntStream.range(0, chunks);
        (work > 1 << 16 ? range.parallel() : range).forEach(ch -> {
            int r0 = (int) ((long) rows * ch / chunks);
            int r1 = (int) ((long) rows * (ch + 1) / chunks);
            for (int r = r0; r < r1; r++) {
                int off = r * cols;
                for (int t = 0; t < x.length; t++) {
                    out[t][r] = dot(wt, off, x[t], cols);
                }
            }
        });
    }

    /** The one dot product: four interleaved partial sums, combined as (s0 + s1) + (s2 + s3), then the tail. */
    static float dot(float[] a, int off, float[] b, int n) {
        float s0 = 0;
        float s1 = 0;
        float s2 = 0;
        float s3 = 0;
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            s0 += a[off + i] * b[i];
            s1 += a[off + i + 1] * b[i + 1];
            s2 += a[off + i + 2] * b[i + 2];
            s3 += a[off + i + 3] * b[i + 3];
        }
        float s = (s0 + s1) + (s2 + s3);
        for (; i < n; i++) {
            s += a[off + i] * b[i];
        }
        return s;
    }

    private void attention(float[][] q, float[] keys, float[] values, int start, int count, float[][] out) {
        int hd = c.headDim();
        int group = c.nHeads() / c.nKvHeads();
        int kvDim = c.kvDim();
        float scale = (float) (1.0 / Math.sqrt(hd));
        IntStream pairs = IntStream.range(0, count * c.nHeads());
        long work = (long) count * c.nHeads() * (start + count) * hd;
        (work > 1 << 15 ? pairs.parallel() : pairs).forEach(th -> {
            int t = th / c.nHeads();
            int h = th % c.nHeads();
            int pos = start + t;
            int kvOff = (h / group) * hd;
            float[] qh = q[t];
            float[] scores = new float[pos + 1];
            float max = Float.NEGATIVE_INFINITY;
            for (int p = 0; p <= pos; p++) {
                float s = 0;
                int ko = p * kvDim + kvOff;
                for (int d = 0; d < hd; d++) {
                    s += qh[h * hd + d] * keys[ko + d];
                }
                s *= scale;
                scores[p] = s;
                max = Math.max(max, s);
            }
            float sum = 0;
            for (int p = 0; p <= pos; p++) {
                float e = (float) Math.exp(scores[p] - max);
                scores[p] = e;
                sum += e;
            }
            float[] o = out[t];
            for (int d = 0; d < hd; d++) {
                o[h * hd + d] = 0;
            }
            for (int p = 0; p <= pos; p++) {
                float a = scores[p] / sum;
                int vo = p * kvDim + kvOff;
                for (int d = 0; d < hd; d++) {
                    o[h * hd + d] += a * values[vo + d];
                }
            }
        });
    }

    private void rmsnorm(float[] out, float[] x, float[] weight) {
        float ss = 0;
        for (float f : x) {
            ss += f * f;
        }
        float inv = (float) (1.0 / Math.sqrt(ss / x.length + c.normEps()));
        for (int i = 0; i < x.length; i++) {
            out[i] = x[i] * inv * weight[i];
        }
    }

    /** Rotates one head's vector in place: pairs (i, i + headDim/2), angle position * invFreq[i]. */
    private void rope(float[] v, int off, int pos) {
        int half = c.headDim() / 2;
        for (int i = 0; i < half; i++) {
            double angle = pos * (double) invFreq[i];
            float cos = (float) Math.cos(angle);
            float sin = (float) Math.sin(angle);
            float a = v[off + i];
            float b = v[off + i + half];
            v[off + i] = a * cos - b * sin;
            v[off + i + half] = b * cos + a * sin;
        }
    }

    private static void add(float[] x, float[] y) {
        for (int i = 0; i < x.length; i++) {
            x[i] += y[i];
        }
    }
}

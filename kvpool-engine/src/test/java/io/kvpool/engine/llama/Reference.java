package io.kvpool.engine.llama;

/**
 * A deliberately plain Llama forward pass for tests: no KV cache (full attention recomputed for
 * every position), one thread, sums in double in index order. Checks the optimised {@link Transformer}
 * computes the right function.
 */
final class Reference {

    private Reference() {
    }

    static float[] lastLogits(ModelConfig c, Weights w, int[] tok) {
        int n = tok.length;
        int d = c.dim();
        int hd = c.headDim();
        double[][] x = new double[n][d];
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < d; i++) {
                x[t][i] = w.embedding[tok[t] * d + i];
            }
        }
        for (Weights.Layer L : w.layers) {
            double[][] q = new double[n][];
            double[][] k = new double[n][];
            double[][] v = new double[n][];
            for (int t = 0; t < n; t++) {
                double[] h = norm(x[t], L.attnNorm, c.normEps());
                q[t] = rope(mul(L.wq, h, d, d), t, c.nHeads(), hd, c.ropeTheta());
                k[t] = rope(mul(L.wk, h, c.kvDim(), d), t, c.nKvHeads(), hd, c.ropeTheta());
                v[t] = mul(L.wv, h, c.kvDim(), d);
            }
            for (int t = 0; t < n; t++) {
                double[] out = new double[d];
                for (int h = 0; h < c.nHeads(); h++) {
                    int g = h / (c.nHeads() / c.nKvHeads());
                    double[] s = new double[t + 1];
                    double max = Double.NEGATIVE_INFINITY;
                    for (int p = 0; p <= t; p++) {
                        for (int i = 0; i < hd; i++) {
                            s[p] += q[t][h * hd + i] * k[p][g * hd + i];
                        }
                        s[p] /= Math.sqrt(hd);
                        max = Math.max(max, s[p]);
                    }
                    double sum = 0;
                    for (int p = 0; p <= t; p++) {
                        s[p] = Math.exp(s[p] - max);
                        sum += s[p];
                    }
                    for (int p = 0; p <= t; p++) {
                        for (int i = 0; i < hd; i++) {
                            out[h * hd + i] += s[p] / sum * v[p][g * hd + i];
                        }
                    }
                }
                double[] o = mul(L.wo, out, d, d);
                for (int i = 0; i < d; i++) {
                    x[t][i] += o[i];
                }
                double[] h = norm(x[t], L.ffnNorm, c.normEps());
                double[] a = mul(L.w1, h, c.hiddenDim(), d);
                double[] b = mul(L.w3, h, c.hiddenDim(), d);
                for (int i = 0; i < a.length; i++) {
                    a[i] = a[i] / (1 + Math.exp(-a[i])) * b[i];
                }
                double[] m = mul(L.w2, a, d, c.hiddenDim());
                for (int i = 0; i < d; i++) {
                    x[t][i] += m[i];
                }
            }
        }
        double[] last = norm(x[n - 1], w.finalNorm, c.normEps());
        double[] logits = mul(w.output, last, c.vocabSize(), d);
        float[] out = new float[logits.length];
        for (int i = 0; i < out.length; i++) {
            out[i] = (float) logits[i];
        }
        return out;
    }

    private static double[] mul(float[] w, double[] x, int rows, int cols) {
        double[] y = new double[rows];
        for (int r = 0; r < rows; r++) {
            for (int i = 0; i < cols; i++) {
                y[r] += w[r * cols + i] * x[i];
            }
        }
        return y;
    }

    private static double[] norm(double[] x, float[] weight, double eps) {
        double ss = 0;
        for (double v : x) {
            ss += v * v;
        }
        double inv = 1 / Math.sqrt(ss / x.length + eps);
        double[] y = new double[x.length];
        for (int i = 0; i < x.length; i++) {
            y[i] = x[i] * inv * weight[i];
        }
        return y;
    }

    private static double[] rope(double[] v, int pos, int heads, int hd, double theta) {
        double[] y = v.clone();
        for (int h = 0; h < heads; h++) {
            for (int i = 0; i < hd / 2; i++) {
                double f = pos / Math.pow(theta, 2.0 * i / hd);
                double a = v[h * hd + i];
                double b = v[h * hd + i + hd / 2];
                y[h * hd + i] = a * Math.cos(f) - b * Math.sin(f);
                y[h * hd + i + hd / 2] = b * Math.cos(f) + a * Math.sin(f);
            }
        }
        return y;
    }
}

package io.kvpool.engine;

import java.util.Arrays;
import java.util.SplittableRandom;

/** Chooses a token from logits: greedy (ties to the lowest id) or temperature + top-p from a seeded generator. */
final class Sampling {

    private Sampling() {
    }

    static int choose(float[] logits, SamplingParams p, SplittableRandom rng) {
        if (p.temperature() == 0) {
            return argmax(logits);
        }
        int n = logits.length;
        double max = Double.NEGATIVE_INFINITY;
        for (float l : logits) {
            max = Math.max(max, l);
        }
        double[] prob = new double[n];
        double sum = 0;
        for (int i = 0; i < n; i++) {
            prob[i] = Math.exp((logits[i] - max) / p.temperature());
            sum += prob[i];
        }
        Integer[] order = new Integer[n];
        for (int i = 0; i < n; i++) {
            order[i] = i;
            prob[i] /= sum;
        }
        Arrays.sort(order, (a, b) -> prob[a] != prob[b] ? Double.compare(prob[b], prob[a]) : Integer.compare(a, b));
        double mass = 0;
        int keep = 0;
        while (keep < n && mass < p.topP()) {
            mass += prob[order[keep++]];
        }
        double u = rng.nextDouble() * mass;
        for (int i = 0; i < keep; i++) {
            u -= prob[order[i]];
            if (u <= 0) {
                return order[i];
            }
        }
        return order[keep - 1];
    }

    static int argmax(float[] logits) {
        int best = 0;
        for (int i = 1; i < logits.length; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        return best;
    }
}

package io.kvpool.engine.llama;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class TransformerTest {

    private static final ModelConfig TINY = ModelConfig.tiny();

    private static int[] tokens(int n, long seed) {
        SplittableRandom r = new SplittableRandom(seed);
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = r.nextInt(258);
        }
        return t;
    }

    private static int[] table(int n) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = i;
        }
        return t;
    }

    private static int[] bits(float[] f) {
        int[] b = new int[f.length];
        for (int i = 0; i < f.length; i++) {
            b[i] = Float.floatToRawIntBits(f[i]);
        }
        return b;
    }

    /** Runs the sequence in chunks split at {@code cuts}; returns the logits of every position, concatenated. */
    private static float[] chunked(Transformer m, int[] tok, KvBlocks kv, int[] table, int... cuts) {
        float[] all = new float[tok.length * TINY.vocabSize()];
        int from = 0;
        int[] ends = java.util.Arrays.copyOf(cuts, cuts.length + 1);
        ends[cuts.length] = tok.length;
        for (int end : ends) {
            float[] l = m.forward(tok, from, end - from, table, kv, LayerHook.NONE, true);
            System.arraycopy(l, 0, all, from * TINY.vocabSize(), l.length);
            from = end;
        }
        return all;
    }

    @Test
    void resultsAreBitIdenticalHoweverTheSequenceIsSplit() {
        Transformer m = new Transformer(TINY, Weights.random(TINY, 3));
        int[] tok = tokens(45, 9);
        float[] whole;
        try (KvBlocks kv = new KvBlocks(TINY, 16, 4)) {
            whole = chunked(m, tok, kv, table(16));
        }
        for (int[] cuts : List.of(new int[]{1}, new int[]{4}, new int[]{5}, new int[]{16, 17}, new int[]{3, 7, 30, 44},
                new int[]{8, 9, 10, 11, 12})) {
            try (KvBlocks kv = new KvBlocks(TINY, 16, 4)) {
                assertThat(bits(chunked(m, tok, kv, table(16), cuts))).as("cut at %s", java.util.Arrays.toString(cuts))
                        .isEqualTo(bits(whole));
            }
        }
    }

    @Test
    void kvCopiedIntoOtherBlocksOfAnotherCacheGivesTheSameBits() {
        Transformer m = new Transformer(TINY, Weights.random(TINY, 4));
        int[] tok = tokens(37, 2);
        try (KvBlocks a = new KvBlocks(TINY, 12, 4); KvBlocks b = new KvBlocks(TINY, 12, 4)) {
            float[] full = m.forward(tok, 0, tok.length, table(10), a, LayerHook.NONE, false);
            for (int cached : new int[]{4, 8, 20, 36}) { // whole blocks computed elsewhere, then loaded
                int[] tb = {11, 3, 7, 0, 9, 1, 2, 4, 5, 6};
                for (int blk = 0; blk < cached / 4; blk++) {
                    b.block(tb[blk]).copyFrom(a.block(blk));
                }
                float[] got = m.forward(tok, cached, tok.length - cached, tb, b, LayerHook.NONE, false);
                assertThat(bits(got)).as("%d positions loaded", cached).isEqualTo(bits(full));
                for (int blk = 0; blk < 9; blk++) {
                    assertThat(b.block(tb[blk]).mismatch(a.block(blk))).as("block %d's KV", blk).isEqualTo(-1);
                }
            }
        }
    }

    @Test
    void hooksRunAroundEveryLayerInOrder() {
        Transformer m = new Transformer(TINY, Weights.random(TINY, 5));
        StringBuilder log = new StringBuilder();
        try (KvBlocks kv = new KvBlocks(TINY, 4, 4)) {
            m.forward(tokens(6, 1), 0, 6, table(4), kv, new LayerHook() {
                @Override
                public void beforeLayer(int layer) {
                    log.append('b').append(layer);
                }

                @Override
                public void afterLayer(int layer) {
                    log.append('a').append(layer);
                }
            }, false);
        }
        assertThat(log.toString()).isEqualTo("b0a0b1a1");
    }

    @Test
    void logitsMatchAStraightforwardReference() {
        ModelConfig c = TINY;
        Weights w = Weights.random(c, 6);
        int[] tok = tokens(11, 4);
        float[] got;
        try (KvBlocks kv = new KvBlocks(c, 4, 4)) {
            got = new Transformer(c, w).forward(tok, 0, tok.length, table(3), kv, LayerHook.NONE, false);
        }
        float[] want = Reference.lastLogits(c, w, tok);
        // the reference sums in plain order (and in double), so agreement is close, not bitwise
        for (int i = 0; i < want.length; i++) {
            assertThat((double) got[i]).as("logit %d", i).isCloseTo(want[i], org.assertj.core.data.Offset.offset(2e-4));
        }
    }

    @Test
    void checkpointsRoundTripInF32AndBf16(@TempDir Path dir) throws IOException {
        Weights w = Weights.random(TINY, 7);
        w.save(dir.resolve("f32"), false);
        w.save(dir.resolve("bf16"), true);
        Weights f32 = Weights.load(dir.resolve("f32"));
        Weights bf16 = Weights.load(dir.resolve("bf16"));
        assertThat(f32.config()).isEqualTo(TINY);
        List<float[]> orig = w.arrays();
        for (int i = 0; i < orig.size(); i++) {
            assertThat(f32.arrays().get(i)).isEqualTo(orig.get(i));
            float[] rounded = orig.get(i).clone();
            for (int j = 0; j < rounded.length; j++) {
                rounded[j] = Weights.roundToBf16(rounded[j]);
            }
            assertThat(bits(bf16.arrays().get(i))).isEqualTo(bits(rounded));
        }
        assertThat(Weights.roundToBf16(1.00390625f)).isEqualTo(1.0f); // a tie rounds to even
        assertThat(Weights.roundToBf16(1.01171875f)).isEqualTo(1.015625f);
    }

    @Test
    void badCheckpointsAreRefusedNamingTheProblem(@TempDir Path dir) throws IOException {
        Weights.random(TINY, 8).save(dir, false);
        Path st = dir.resolve("model.safetensors");
        byte[] good = Files.readAllBytes(st);

        Files.write(st, java.util.Arrays.copyOf(good, good.length - 10));
        assertThatThrownBy(() -> Weights.load(dir)).hasMessageContaining("data offsets");

        long n = ByteBuffer.wrap(good, 0, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
        String header = new String(good, 8, (int) n, StandardCharsets.UTF_8);
        Files.write(st, withHeader(good, n, header.replaceFirst("\"F32\"", "\"F16\"")));
        assertThatThrownBy(() -> Weights.load(dir)).hasMessageContaining("dtype F16");

        Files.write(st, withHeader(good, n, header.replace("model.norm.weight", "model.norm.weigh_")));
        assertThatThrownBy(() -> Weights.load(dir)).hasMessageContaining("model.norm.weight is missing");

        Files.write(st, new byte[]{1, 2, 3});
        assertThatThrownBy(() -> Weights.load(dir)).hasMessageContaining("too short");

        Files.writeString(dir.resolve("config.json"), "{\"hidden_size\": 30}");
        assertThatThrownBy(() -> Weights.load(dir)).hasMessageContaining("num_attention_heads");
    }

    /** The file with its header replaced by one of the same length. */
    private static byte[] withHeader(byte[] good, long n, String header) {
        byte[] h = header.getBytes(StandardCharsets.UTF_8);
        assertThat(h.length).isEqualTo((int) n);
        byte[] out = good.clone();
        System.arraycopy(h, 0, out, 8, h.length);
        return out;
    }

    @Test
    void badShapesAndArgumentsAreRefused() {
        assertThatThrownBy(() -> new ModelConfig(258, 30, 2, 4, 2, 64, 1e-5f, 1e4f, 64)).hasMessageContaining("multiple of nHeads");
        assertThatThrownBy(() -> new ModelConfig(258, 32, 2, 4, 3, 64, 1e-5f, 1e4f, 64)).hasMessageContaining("nKvHeads");
        assertThatThrownBy(() -> new ModelConfig(258, 32, 0, 4, 2, 64, 1e-5f, 1e4f, 64)).hasMessageContaining("nLayers");
        Transformer m = new Transformer(TINY, Weights.random(TINY, 1));
        try (KvBlocks kv = new KvBlocks(TINY, 2, 4)) {
            assertThatThrownBy(() -> m.forward(tokens(4, 1), 0, 0, table(2), kv, LayerHook.NONE, false))
                    .hasMessageContaining("at least one");
            assertThatThrownBy(() -> m.forward(tokens(12, 1), 0, 12, table(2), kv, LayerHook.NONE, false))
                    .hasMessageContaining("need 3 blocks");
            assertThatThrownBy(() -> m.forward(new int[]{300}, 0, 1, table(2), kv, LayerHook.NONE, false))
                    .hasMessageContaining("outside the vocabulary");
        }
    }
}

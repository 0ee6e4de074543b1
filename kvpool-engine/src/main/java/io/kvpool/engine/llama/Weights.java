package io.kvpool.engine.llama;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;

/**
 * A model's parameters, every matrix row-major {@code [out][in]} (Hugging Face's Linear layout), in
 * heap float arrays. Made from a seed ({@link #random}) or read from a Hugging Face Llama checkpoint
 * directory ({@link #load}: {@code config.json} and {@code model.safetensors}, F32 or BF16).
 *
 * <h2>safetensors</h2>
 * <pre>
 *   u64 little-endian N | N bytes of JSON header | data
 *   header: {"tensor name": {"dtype": "F32"|"BF16"|..., "shape": [..], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {...}}      offsets are relative to the start of the data
 * </pre>
 */
public final class Weights {

    private static final ObjectMapper JSON = new ObjectMapper();

    /** One transformer block's parameters. */
    static final class Layer {
        final float[] attnNorm;
        final float[] wq;
        final float[] wk;
        final float[] wv;
        final float[] wo;
        final float[] ffnNorm;
        final float[] w1;
        final float[] w3;
        final float[] w2;

        Layer(float[] attnNorm, float[] wq, float[] wk, float[] wv, float[] wo, float[] ffnNorm, float[] w1, float[] w3,
              float[] w2) {
            this.attnNorm = attnNorm;
            this.wq = wq;
            this.wk = wk;
            this.wv = wv;
            this.wo = wo;
            this.ffnNorm = ffnNorm;
            this.w1 = w1;
            this.w3 = w3;
            this.w2 = w2;
        }
    }

    private final ModelConfig config;
    final float[] embedding;
    final Layer[] layers;
    final float[] finalNorm;
    final float[] output;

    private Weights(ModelConfig config, float[] embedding, Layer[] layers, float[] finalNorm, float[] output) {
        this.config = config;
        this.embedding = embedding;
        this.layers = layers;
        this.finalNorm = finalNorm;
        this.output = output;
    }

    public ModelConfig config() {
        return config;
    }

    /** Weights drawn from a normal distribution scaled by 1/sqrt(fan-in), norms at 1: deterministic from the seed. */
    public static Weights random(ModelConfig c, long seed) {
        SplittableRandom r = new SplittableRandom(seed);
        int d = c.dim();
        Layer[] layers = new Layer[c.nLayers()];
        for (int l = 0; l < layers.length; l++) {
            layers[l] = new Layer(ones(d), normal(r, d * d, d), normal(r, c.kvDim() * d, d), normal(r, c.kvDim() * d, d),
                    normal(r, d * d, d), ones(d), normal(r, c.hiddenDim() * d, d), normal(r, c.hiddenDim() * d, d),
                    normal(r, d * c.hiddenDim(), c.hiddenDim()));
        }
        return new Weights(c, normal(r, c.vocabSize() * d, 1), layers, ones(d), normal(r, c.vocabSize() * d, d));
    }

    private static float[] ones(int n) {
        float[] a = new float[n];
        java.util.Arrays.fill(a, 1f);
        return a;
    }

    private static float[] normal(SplittableRandom r, int n, int fanIn) {
        float[] a = new float[n];
        double s = 1.0 / Math.sqrt(fanIn);
        for (int i = 0; i < n; i++) {
            // Box-Muller from two uniforms: the generator's stream fixes every value
            double u1 = 1.0 - r.nextDouble();
            double u2 = r.nextDouble();
            a[i] = (float) (Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2) * s);
        }
        return a;
    }

    // ---------------------------------------------------------------- Hugging Face checkpoints

    /** The model shape of a checkpoint directory's {@code config.json}. */
    public static ModelConfig readConfig(Path dir) throws IOException {
        Path file = dir.resolve("config.json");
        JsonNode j;
        try {
            j = JSON.readTree(file.toFile());
        } catch (IOException e) {
            throw new IOException(file + ": cannot read the model config: " + e.getMessage(), e);
        }
        int dim = req(j, file, "hidden_size");
        int heads = req(j, file, "num_attention_heads");
        try {
            return new ModelConfig(req(j, file, "vocab_size"), dim, req(j, file, "num_hidden_layers"), heads,
                    j.path("num_key_value_heads").asInt(heads), req(j, file, "intermediate_size"),
                    (float) j.path("rms_norm_eps").asDouble(1e-5), (float) j.path("rope_theta").asDouble(10000),
                    j.path("max_position_embeddings").asInt(4096));
        } catch (IllegalArgumentException e) {
            throw new IOException(file + ": " + e.getMessage(), e);
        }
    }

    private static int req(JsonNode j, Path file, String field) throws IOException {
        JsonNode n = j.get(field);
        if (n == null || !n.canConvertToInt()) {
            throw new IOException(file + ": missing or non-integer \"" + field + "\"");
        }
        return n.intValue();
    }

    /** Loads {@code dir/config.json} and {@code dir/model.safetensors} (F32 or BF16 tensors). */
    public static Weights load(Path dir) throws IOException {
        ModelConfig c = readConfig(dir);
        Path file = dir.resolve("model.safetensors");
        Map<String, float[]> t = readSafetensors(file);
        int d = c.dim();
        Layer[] layers = new Layer[c.nLayers()];
        for (int l = 0; l < layers.length; l++) {
            String p = "model.layers." + l + ".";
            layers[l] = new Layer(tensor(t, file, p + "input_layernorm.weight", d),
                    tensor(t, file, p + "self_attn.q_proj.weight", d * d),
                    tensor(t, file, p + "self_attn.k_proj.weight", c.kvDim() * d),
                    tensor(t, file, p + "self_attn.v_proj.weight", c.kvDim() * d),
                    tensor(t, file, p + "self_attn.o_proj.weight", d * d),
                    tensor(t, file, p + "post_attention_layernorm.weight", d),
                    tensor(t, file, p + "mlp.gate_proj.weight", c.hiddenDim() * d),
                    tensor(t, file, p + "mlp.up_proj.weight", c.hiddenDim() * d),
                    tensor(t, file, p + "mlp.down_proj.weight", d * c.hiddenDim()));
        }
        float[] emb = tensor(t, file, "model.embed_tokens.weight", c.vocabSize() * d);
        float[] out = t.containsKey("lm_head.weight") ? tensor(t, file, "lm_head.weight", c.vocabSize() * d) : emb;
        return new Weights(c, emb, layers, tensor(t, file, "model.norm.weight", d), out);
    }

    private static float[] tensor(Map<String, float[]> t, Path file, String name, int size) throws IOException {
        float[] a = t.get(name);
        if (a == null) {
            throw new IOException(file + ": tensor " + name + " is missing");
        }
        if (a.length != size) {
            throw new IOException(file + ": tensor " + name + " has " + a.length + " elements, the config needs " + size);
        }
        return a;
    }

    /** Every tensor of a safetensors file, as floats. */
    static Map<String, float[]> readSafetensors(Path file) throws IOException {
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ); Arena arena = Arena.ofConfined()) {
            long size = ch.size();
            if (size < 8) {
                throw new IOException(file + ": too short for a safetensors file (" + size + " bytes)");
            }
            MemorySegment m = ch.map(FileChannel.MapMode.READ_ONLY, 0, size, arena);
            long n = m.get(ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 0);
            if (n <= 0 || n > size - 8 || n > 100L << 20) {
                throw new IOException(file + ": header length " + n + " does not fit the file (" + size + " bytes)");
            }
            byte[] hb = m.asSlice(8, n).toArray(ValueLayout.JAVA_BYTE);
            JsonNode header;
            try {
                header = JSON.readTree(hb);
            } catch (IOException e) {
                throw new IOException(file + ": header is not valid JSON: " + e.getMessage(), e);
            }
            long base = 8 + n;
            Map<String, float[]> out = new LinkedHashMap<>();
            for (Iterator<Map.Entry<String, JsonNode>> it = header.properties().iterator(); it.hasNext(); ) {
                Map.Entry<String, JsonNode> e = it.next();
                if (e.getKey().equals("__metadata__")) {
                    continue;
                }
                String name = e.getKey();
                JsonNode spec = e.getValue();
                String dtype = spec.path("dtype").asText();
                long elems = 1;
                for (JsonNode s : spec.path("shape")) {
                    elems *= s.asLong();
                }
                JsonNode offs = spec.path("data_offsets");
                long begin = offs.path(0).asLong(-1);
                long end = offs.path(1).asLong(-1);
                int width = switch (dtype) {
                    case "F32" -> 4;
                    case "BF16" -> 2;
                    default -> throw new IOException(file + ": tensor " + name + " has dtype " + dtype
                            + "; only F32 and BF16 are supported");
                };
                if (begin < 0 || end < begin || base + end > size || end - begin != elems * width) {
                    throw new IOException(file + ": tensor " + name + " (" + dtype + ", " + elems + " elements) has data"
                            + " offsets [" + begin + ", " + end + ") that do not match its shape or the file size");
                }
                if (elems > Integer.MAX_VALUE - 8) {
                    throw new IOException(file + ": tensor " + name + " is too large (" + elems + " elements)");
                }
                float[] a = new float[(int) elems];
                MemorySegment src = m.asSlice(base + begin, end - begin);
                if (width == 4) {
                    MemorySegment.copy(src, ValueLayout.JAVA_FLOAT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 0, a, 0,
                            a.length);
                } else {
                    for (int i = 0; i < a.length; i++) {
                        short bits = src.get(ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 2L * i);
                        a[i] = Float.intBitsToFloat((bits & 0xffff) << 16);
                    }
                }
                out.put(name, a);
            }
            return out;
        }
    }

    /** Writes {@code config.json} and {@code model.safetensors} in Hugging Face's names, F32 or BF16 (rounded to nearest even). */
    public void save(Path dir, boolean bf16) throws IOException {
        Files.createDirectories(dir);
        ModelConfig c = config;
        ObjectNode cfg = JSON.createObjectNode();
        cfg.putArray("architectures").add("LlamaForCausalLM");
        cfg.put("model_type", "llama").put("hidden_size", c.dim()).put("num_hidden_layers", c.nLayers())
                .put("num_attention_heads", c.nHeads()).put("num_key_value_heads", c.nKvHeads())
                .put("intermediate_size", c.hiddenDim()).put("rms_norm_eps", c.normEps()).put("rope_theta", c.ropeTheta())
                .put("vocab_size", c.vocabSize()).put("max_position_embeddings", c.maxSeqLen())
                .put("tie_word_embeddings", false).put("torch_dtype", bf16 ? "bfloat16" : "float32");
        JSON.writerWithDefaultPrettyPrinter().writeValue(dir.resolve("config.json").toFile(), cfg);

        Map<String, float[]> t = new LinkedHashMap<>();
        Map<String, long[]> shapes = new LinkedHashMap<>();
        int d = c.dim();
        put(t, shapes, "model.embed_tokens.weight", embedding, c.vocabSize(), d);
        for (int l = 0; l < layers.length; l++) {
            String p = "model.layers." + l + ".";
            Layer L = layers[l];
            put(t, shapes, p + "input_layernorm.weight", L.attnNorm, d);
            put(t, shapes, p + "self_attn.q_proj.weight", L.wq, d, d);
            put(t, shapes, p + "self_attn.k_proj.weight", L.wk, c.kvDim(), d);
            put(t, shapes, p + "self_attn.v_proj.weight", L.wv, c.kvDim(), d);
            put(t, shapes, p + "self_attn.o_proj.weight", L.wo, d, d);
            put(t, shapes, p + "post_attention_layernorm.weight", L.ffnNorm, d);
            put(t, shapes, p + "mlp.gate_proj.weight", L.w1, c.hiddenDim(), d);
            put(t, shapes, p + "mlp.up_proj.weight", L.w3, c.hiddenDim(), d);
            put(t, shapes, p + "mlp.down_proj.weight", L.w2, d, c.hiddenDim());
        }
        put(t, shapes, "model.norm.weight", finalNorm, d);
        put(t, shapes, "lm_head.weight", output, c.vocabSize(), d);

        ObjectNode header = JSON.createObjectNode();
        long off = 0;
        int width = bf16 ? 2 : 4;
        for (Map.Entry<String, float[]> e : t.entrySet()) {
            ObjectNode spec = header.putObject(e.getKey());
            spec.put("dtype", bf16 ? "BF16" : "F32");
            var shape = spec.putArray("shape");
            for (long s : shapes.get(e.getKey())) {
                shape.add(s);
            }
            spec.putArray("data_offsets").add(off).add(off + (long) e.getValue().length * width);
            off += (long) e.getValue().length * width;
        }
        byte[] hb = JSON.writeValueAsBytes(header);
        try (FileChannel ch = FileChannel.open(dir.resolve("model.safetensors"), StandardOpenOption.CREATE,
                StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING)) {
            ByteBuffer head = ByteBuffer.allocate(8 + hb.length).order(ByteOrder.LITTLE_ENDIAN);
            head.putLong(hb.length).put(hb).flip();
            while (head.hasRemaining()) {
                ch.write(head);
            }
            for (float[] a : t.values()) {
                ByteBuffer b = ByteBuffer.allocate(a.length * width).order(ByteOrder.LITTLE_ENDIAN);
                for (float f : a) {
                    if (bf16) {
                        b.putShort(toBf16(f));
                    } else {
                        b.putFloat(f);
                    }
                }
                b.flip();
                while (b.hasRemaining()) {
                    ch.write(b);
                }
            }
        }
    }

    private static void put(Map<String, float[]> t, Map<String, long[]> shapes, String name, float[] a, long... shape) {
        t.put(name, a);
        shapes.put(name, shape);
    }

    /** float32 to bfloat16, rounding to nearest even (NaN stays NaN). */
    static short toBf16(float f) {
        int bits = Float.floatToRawIntBits(f);
        if (Float.isNaN(f)) {
            return (short) ((bits >>> 16) | 0x40);
        }
        int lsb = (bits >>> 16) & 1;
        return (short) ((bits + 0x7fff + lsb) >>> 16);
    }

    /** The bfloat16 value nearest to {@code f}, as a float. */
    static float roundToBf16(float f) {
        return Float.intBitsToFloat((toBf16(f) & 0xffff) << 16);
    }

    /** Every parameter array (for tests comparing two weight sets). */
    List<float[]> arrays() {
        List<float[]> out = new ArrayList<>();
        out.add(embedding);
        for (Layer L : layers) {
            out.addAll(List.of(L.attnNorm, L.wq, L.wk, L.wv, L.wo, L.ffnNorm, L.w1, L.w3, L.w2));
        }
        out.add(finalNorm);
        out.add(output);
        return out;
    }
}

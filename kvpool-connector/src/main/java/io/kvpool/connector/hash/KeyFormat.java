package io.kvpool.connector.hash;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * How a block's pool key is spelled: everything that makes KV differ for the same tokens, then the
 * block's chained hash.
 *
 * <pre>
 *   kvp1/{model}/{weights}/tp{rank}of{size}-pp{rank}of{size}/{kv dtype}/{block hash, 64 hex digits}
 *
 *   kvp1/meta-llama%2FLlama-3.1-8B/step-1200/tp0of2-pp0of1/bf16/5f0c...e1
 *   \__/ \_______________________/ \_______/ \____________/ \__/ \______/
 *   format      model (escaped)     weights   parallel ranks dtype  hash
 * </pre>
 *
 * <ul>
 *   <li>{@code model} and {@code weights} (a weight version or a cache salt) are percent-escaped:
 *       every byte outside {@code A-Z a-z 0-9 - . _ ~} becomes {@code %XX}, so a {@code /} in a model
 *       name cannot make one key a prefix of another's fields.</li>
 *   <li>Changing the weight version changes every key: old-weight KV becomes unreachable at once,
 *       and {@link #versionPrefix} names all of it for a background {@code removeByPrefix}.</li>
 *   <li>Each tensor-parallel rank holds its own slice of every block's KV, so the rank is part of
 *       the key; so is the KV dtype.</li>
 * </ul>
 * Keys are ASCII and at most {@value #MAX_KEY_BYTES} bytes (the pool's limit); a format whose keys
 * would be longer is refused when it is built, naming the field that is too long.
 */
public final class KeyFormat {

    public static final String VERSION = "kvp1";
    /** The pool's key limit. */
    public static final int MAX_KEY_BYTES = 512;

    private final String model;
    private final String weights;
    private final int tpRank;
    private final int tpSize;
    private final int ppRank;
    private final int ppSize;
    private final String kvDtype;
    private final byte[] prefix;

    public KeyFormat(String model, String weights, int tpRank, int tpSize, int ppRank, int ppSize, String kvDtype) {
        this.model = requireText(model, "model");
        this.weights = requireText(weights, "weight version");
        this.kvDtype = requireText(kvDtype, "kv dtype");
        if (tpSize < 1 || tpRank < 0 || tpRank >= tpSize) {
            throw new IllegalArgumentException("tensor-parallel rank " + tpRank + " of " + tpSize + " is not valid");
        }
        if (ppSize < 1 || ppRank < 0 || ppRank >= ppSize) {
            throw new IllegalArgumentException("pipeline-parallel rank " + ppRank + " of " + ppSize + " is not valid");
        }
        this.tpRank = tpRank;
        this.tpSize = tpSize;
        this.ppRank = ppRank;
        this.ppSize = ppSize;
        String p = versionPrefix(model, weights) + "tp" + tpRank + "of" + tpSize + "-pp" + ppRank + "of" + ppSize + "/"
                + escape(kvDtype) + "/";
        this.prefix = p.getBytes(StandardCharsets.US_ASCII);
        if (prefix.length + 2 * BlockHash.LENGTH > MAX_KEY_BYTES) {
            throw new IllegalArgumentException("keys for model '" + model + "' and weights '" + weights + "' would be "
                    + (prefix.length + 2 * BlockHash.LENGTH) + " bytes, over the pool's " + MAX_KEY_BYTES
                    + "; shorten the model name or the weight version");
        }
    }

    /** A single-rank (no parallelism) format. */
    public static KeyFormat of(String model, String weights, String kvDtype) {
        return new KeyFormat(model, weights, 0, 1, 0, 1, kvDtype);
    }

    /** The same model, ranks and dtype under another weight version. */
    public KeyFormat withWeights(String newWeights) {
        return new KeyFormat(model, newWeights, tpRank, tpSize, ppRank, ppSize, kvDtype);
    }

    public String model() {
        return model;
    }

    public String weights() {
        return weights;
    }

    /**
     * The pool key of a block: the prefix, then the hash in lowercase hex, written into one array (every save
     * and lookup makes a key per block; going through a hex string and its bytes made four copies of each).
     */
    public byte[] key(BlockHash hash) {
        byte[] k = new byte[prefix.length + 2 * BlockHash.LENGTH];
        System.arraycopy(prefix, 0, k, 0, prefix.length);
        hash.hexInto(k, prefix.length);
        return k;
    }

    /** The key as text (keys are ASCII). */
    public String keyString(BlockHash hash) {
        return new String(key(hash), StandardCharsets.US_ASCII);
    }

    /** Every key of this model and weight version, any rank or dtype, starts with this. */
    public static String versionPrefix(String model, String weights) {
        return VERSION + "/" + escape(requireText(model, "model")) + "/" + escape(requireText(weights, "weight version"))
                + "/";
    }

    /** Every key of this model, any weight version, starts with this. */
    public static String modelPrefix(String model) {
        return VERSION + "/" + escape(requireText(model, "model")) + "/";
    }

    /** This format's weight version prefix. */
    public String versionPrefix() {
        return versionPrefix(model, weights);
    }

    static String escape(String s) {
        byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
        ByteArrayOutputStream out = new ByteArrayOutputStream(utf8.length);
        for (byte b : utf8) {
            int c = b & 0xff;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'
                    || c == '_' || c == '~') {
                out.write(c);
            } else {
                out.write('%');
                out.write(Character.toUpperCase(Character.forDigit(c >> 4, 16)));
                out.write(Character.toUpperCase(Character.forDigit(c & 15, 16)));
            }
        }
        return out.toString(StandardCharsets.US_ASCII);
    }

    private static String requireText(String s, String what) {
        Objects.requireNonNull(s, what);
        if (s.isEmpty()) {
            throw new IllegalArgumentException(what + " must not be empty");
        }
        return s;
    }

    @Override
    public String toString() {
        return new String(prefix, StandardCharsets.US_ASCII) + "<hash>";
    }
}

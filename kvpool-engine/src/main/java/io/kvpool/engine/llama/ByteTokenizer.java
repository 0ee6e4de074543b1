package io.kvpool.engine.llama;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;

/** Byte-level tokens: token i &lt; 256 is the byte i of the UTF-8 text; 256 is BOS, 257 EOS. */
public final class ByteTokenizer {

    public int[] encode(String text, boolean bos) {
        byte[] b = text.getBytes(StandardCharsets.UTF_8);
        int off = bos ? 1 : 0;
        int[] t = new int[b.length + off];
        if (bos) {
            t[0] = ModelConfig.BOS;
        }
        for (int i = 0; i < b.length; i++) {
            t[i + off] = b[i] & 0xff;
        }
        return t;
    }

    /** The text of the byte tokens (special tokens skipped; invalid UTF-8 becomes U+FFFD). */
    public String decode(int[] tokens) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(tokens.length);
        for (int t : tokens) {
            if (t >= 0 && t < 256) {
                out.write(t);
            }
        }
        return out.toString(StandardCharsets.UTF_8);
    }
}

package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.KeyDigest;

/**
 * The body of the lookups by digest (PREFIX_MATCH_DIGEST, BATCH_EXIST_DIGEST): a count, then each
 * key's 16-byte {@link KeyDigest} (low half, then high half, each an {@code i64}).
 *
 * <pre>
 *  +-------------+---------------+---------------+---------------+---------------+-----
 *  | count (i32) | key 0 lo (i64)| key 0 hi (i64)| key 1 lo (i64)| key 1 hi (i64)| ...
 *  +-------------+---------------+---------------+---------------+---------------+-----
 * </pre>
 *
 * @param digests {@code 2 * count} longs: lo and hi of key 0, then of key 1, ...
 * @param count   the number of keys
 */
public record DigestList(long[] digests, int count) {

    /** The digests of {@code keys[from, to)}. */
    public static DigestList of(java.util.List<byte[]> keys, int from, int to) {
        long[] d = new long[2 * (to - from)];
        for (int i = from; i < to; i++) {
            byte[] k = keys.get(i);
            KeyDigest.digest(k, 0, k.length, d, 2 * (i - from));
        }
        return new DigestList(d, to - from);
    }

    public void write(BodyWriter w) {
        w.i32(count);
        for (int i = 0; i < 2 * count; i++) {
            w.i64(digests[i]);
        }
    }

    public static DigestList read(BodyReader r) {
        int n = r.count("digest count", KeyDigest.BYTES);
        long[] d = new long[2 * n];
        for (int i = 0; i < 2 * n; i++) {
            d[i] = r.i64("digest");
        }
        return new DigestList(d, n);
    }
}

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
        write(w, digests, 0, count);
    }

    /** The body of keys {@code [from, from + count)} of {@code digests} (lo and hi of each), without a copy. */
    public static void write(BodyWriter w, long[] digests, int from, int count) {
        w.i32(count);
        w.i64s(digests, 2 * from, 2 * count);
    }

    public static DigestList read(BodyReader r) {
        int n = r.count("digest count", KeyDigest.BYTES);
        long[] d = new long[2 * n];
        r.i64s(d, 2 * n, "digests");
        return new DigestList(d, n);
    }
}

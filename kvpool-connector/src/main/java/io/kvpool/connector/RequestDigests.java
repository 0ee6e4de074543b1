package io.kvpool.connector;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.protocol.KeyDigest;

import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The key digests ({@link KeyDigest}: lo, hi a key) of each waiting request's blocks, computed once per block: the
 * scheduler asks about a waiting request at every step, and digesting a long prompt's keys costs about as much as
 * the lookup's round trip. Kept under the key format they were made for, so a weight switch never reuses them.
 * Thread-safe.
 */
final class RequestDigests {

    /** The digests of a request's first {@code count} block keys in {@code format}. */
    private record Digests(KeyFormat format, long[] values, int count) {
    }

    @GuardedBy("this")
    private final Map<String, Digests> byRequest = new HashMap<>();

    /** The digests of request {@code r}'s first {@code full} blocks (hashes {@code h}) in format {@code k}. */
    synchronized long[] of(ConnectorRequest r, List<BlockHash> h, int full, KeyFormat k) {
        Digests d = byRequest.get(r.id());
        if (d != null && d.format == k && d.count >= full) {
            return d.values;
        }
        int known = d != null && d.format == k ? d.count : 0;
        long[] values = d != null && d.format == k ? Arrays.copyOf(d.values, 2 * full) : new long[2 * full];
        for (int b = known; b < full; b++) {
            byte[] key = k.key(h.get(b));
            KeyDigest.digest(key, 0, key.length, values, 2 * b);
        }
        byRequest.put(r.id(), new Digests(k, values, full));
        return values;
    }

    synchronized void forget(String requestId) {
        byRequest.remove(requestId);
    }

    synchronized void clear() {
        byRequest.clear();
    }
}

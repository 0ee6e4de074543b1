package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;

import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The block infos connectors sent (BLOCK_INFO), by key, for the KV events' {@code BlockStored}: bounded by
 * an estimate of their bytes, the oldest let go first.
 *
 * <p>Nothing here is ever stale: a connector key is a chained hash of the tokens up to its block, so a
 * key's info is the same whenever it is sent. The table therefore keeps an info past its object (a key
 * removed and saved again needs no second BLOCK_INFO to be announced whole) and forgets one only for room;
 * a key whose info was let go is announced as the pool alone knows it (no tokens), never wrongly.
 *
 * <p>Written by the request threads that serve BLOCK_INFO and read by the publisher thread as it encodes a
 * batch: one lock, held for a map operation.
 */
final class BlockInfoTable {

    /** What one entry costs beyond its tokens and names: the key, the map entry, the record. */
    static final int ENTRY_OVERHEAD = 160;

    private final long capacityBytes;
    private final LinkedHashMap<ByteBuffer, BlockInfo> byKey = new LinkedHashMap<>();
    private long bytes;
    private long letGo;

    BlockInfoTable(long capacityBytes) {
        this.capacityBytes = capacityBytes;
    }

    static long cost(byte[] key, BlockInfo info) {
        return ENTRY_OVERHEAD + key.length + 4L * info.tokenIds().length
                + (info.loraName() == null ? 0 : info.loraName().length() * 2L)
                + (info.cacheSalt() == null ? 0 : info.cacheSalt().length() * 2L);
    }

    /** Keeps {@code info} for {@code key} (replacing what it had), letting the oldest go while over capacity. */
    synchronized void put(byte[] key, BlockInfo info) {
        long c = cost(key, info);
        if (c > capacityBytes) {
            letGo++;
            return;
        }
        BlockInfo old = byKey.put(ByteBuffer.wrap(key), info);
        if (old != null) {
            bytes -= cost(key, old);
        }
        bytes += c;
        var it = byKey.entrySet().iterator();
        while (bytes > capacityBytes && it.hasNext()) {
            Map.Entry<ByteBuffer, BlockInfo> e = it.next();
            bytes -= cost(e.getKey().array(), e.getValue());
            it.remove();
            letGo++;
        }
    }

    /** The info of {@code key}, or null. */
    synchronized BlockInfo get(byte[] key) {
        return byKey.get(ByteBuffer.wrap(key));
    }

    synchronized int size() {
        return byKey.size();
    }

    synchronized long bytes() {
        return bytes;
    }

    /** Infos let go for room (or too large to keep at all). */
    synchronized long letGo() {
        return letGo;
    }
}

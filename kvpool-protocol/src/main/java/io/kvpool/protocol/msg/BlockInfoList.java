package io.kvpool.protocol.msg;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BlockInfo;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;

import java.util.ArrayList;
import java.util.List;

/**
 * BLOCK_INFO's request (version 14): keys with what the engine knows of their blocks, for the master's KV
 * events ({@link BlockInfo}). The reply is one i32, how many infos the master kept (0 with events off).
 *
 * <pre>
 *  count (i32), then per item:
 *  +-----------+-----------+------------+----------------+-----------------+------------------+
 *  | key (u16  | flags (u8)| parent     | block size     | token count n   | tokens           |
 *  | len+bytes)|           | (i64) [1]  | (i32)          | (i32)           | (n x i32)        |
 *  +-----------+-----------+------------+----------------+-----------------+------------------+
 *  | LoRA id (i64) [2] | LoRA name (u16 len + UTF-8) [4] | cache salt (u16 len + UTF-8) [8] |
 *  +-------------------+---------------------------------+----------------------------------+
 *  [b]: present only when flags has bit b; other flag bits must be 0
 * </pre>
 */
public record BlockInfoList(List<byte[]> keys, List<BlockInfo> infos) {

    static final int PARENT = 1;
    static final int LORA_ID = 2;
    static final int LORA_NAME = 4;
    static final int CACHE_SALT = 8;

    public BlockInfoList {
        if (keys.size() != infos.size()) {
            throw new IllegalArgumentException(keys.size() + " keys and " + infos.size() + " infos");
        }
    }

    public void write(BodyWriter w) {
        w.i32(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            BlockInfo b = infos.get(i);
            w.bytes(keys.get(i));
            w.u8((b.parentBlockHash() != null ? PARENT : 0) | (b.loraId() != null ? LORA_ID : 0)
                    | (b.loraName() != null ? LORA_NAME : 0) | (b.cacheSalt() != null ? CACHE_SALT : 0));
            if (b.parentBlockHash() != null) {
                w.i64(b.parentBlockHash());
            }
            w.i32(b.blockSize()).i32(b.tokenIds().length);
            for (int t : b.tokenIds()) {
                w.i32(t);
            }
            if (b.loraId() != null) {
                w.i64(b.loraId());
            }
            if (b.loraName() != null) {
                w.string(b.loraName());
            }
            if (b.cacheSalt() != null) {
                w.string(b.cacheSalt());
            }
        }
    }

    public static BlockInfoList read(BodyReader r) {
        int n = r.count("block info count", 3 + 1 + 8);
        List<byte[]> keys = new ArrayList<>(n);
        List<BlockInfo> infos = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            keys.add(KeyList.readKey(r));
            int flags = r.u8("block info flags");
            if ((flags & ~(PARENT | LORA_ID | LORA_NAME | CACHE_SALT)) != 0) {
                throw new BadRequestException("block info flags 0x" + Integer.toHexString(flags) + " name unknown fields");
            }
            Long parent = (flags & PARENT) != 0 ? r.i64("parent block hash") : null;
            int blockSize = r.i32("block size");
            int[] tokens = new int[r.count("token count", 4)];
            for (int t = 0; t < tokens.length; t++) {
                tokens[t] = r.i32("token id");
            }
            Long loraId = (flags & LORA_ID) != 0 ? r.i64("LoRA id") : null;
            String loraName = (flags & LORA_NAME) != 0 ? r.string("LoRA name") : null;
            String salt = (flags & CACHE_SALT) != 0 ? r.string("cache salt") : null;
            try {
                infos.add(new BlockInfo(parent, blockSize, tokens, loraId, loraName, salt));
            } catch (IllegalArgumentException e) {
                throw new BadRequestException(e.getMessage() + " (key " + i + ")");
            }
        }
        return new BlockInfoList(keys, infos);
    }
}

package io.kvpool.master.events;

import org.msgpack.core.MessagePack;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.value.ValueType;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;

/**
 * Reads a vLLM {@code KVEventBatch} payload (this master's, or an engine's) into plain values: the
 * reading side of {@link EventBatchCodec}, for tests and tools. It takes both shapes vLLM has sent:
 * events as maps tagged by {@code "type"} (since mid-2026) and as arrays whose first item is the tag
 * (before). Only what a router needs of the pool's events is kept: the kind, the block hashes, the
 * medium, and of a store the parent hash, the tokens and the block size; other fields are read past.
 */
public final class EventBatchReader {

    /** One batch: its timestamp (seconds), its events, and the data-parallel rank (null: none). */
    public record Batch(double ts, List<Event> events, Long dataParallelRank) {
    }

    /**
     * One event: {@code type} is vLLM's class name ({@code BlockStored}, {@code BlockRemoved},
     * {@code AllBlocksCleared}); hashes are unsigned 64-bit values in longs (see {@link BlockHashes});
     * {@code medium} is null where the event has none; {@code parentBlockHash} (null: none), {@code tokenIds} and
     * {@code blockSize} are a {@code BlockStored}'s (empty and 0 otherwise).
     */
    public record Event(String type, List<Long> blockHashes, String medium, Long parentBlockHash,
                        List<Integer> tokenIds, int blockSize) {

        /** An event without store fields (a removal, a reset, or a store the pool knew nothing more of). */
        public Event(String type, List<Long> blockHashes, String medium) {
            this(type, blockHashes, medium, null, List.of(), 0);
        }
    }

    static {
        MsgpackBuffers.portable();
    }

    private EventBatchReader() {
    }

    /** Reads one payload; IllegalArgumentException if it is not an EventBatch. */
    public static Batch read(byte[] payload) {
        try (MessageUnpacker u = MessagePack.newDefaultUnpacker(payload)) {
            int n = u.unpackArrayHeader();
            if (n < 2 || n > 3) {
                throw new IllegalArgumentException("an EventBatch is an array of 2 or 3 items, got " + n);
            }
            double ts = u.getNextFormat().getValueType() == ValueType.INTEGER ? u.unpackLong() : u.unpackDouble();
            int count = u.unpackArrayHeader();
            List<Event> events = new ArrayList<>(count);
            for (int i = 0; i < count; i++) {
                events.add(u.getNextFormat().getValueType() == ValueType.MAP ? mapEvent(u) : arrayEvent(u));
            }
            Long rank = n == 3 && !u.tryUnpackNil() ? u.unpackLong() : null;
            return new Batch(ts, List.copyOf(events), rank);
        } catch (IOException | RuntimeException e) {
            throw new IllegalArgumentException("not a KV event batch: " + e.getMessage(), e);
        }
    }

    private static Event mapEvent(MessageUnpacker u) throws IOException {
        int fields = u.unpackMapHeader();
        String type = null;
        List<Long> hashes = List.of();
        String medium = null;
        Long parent = null;
        List<Integer> tokens = List.of();
        int blockSize = 0;
        for (int f = 0; f < fields; f++) {
            switch (u.unpackString()) {
                case "type" -> type = u.unpackString();
                case "block_hashes" -> hashes = hashes(u);
                case "medium" -> medium = u.tryUnpackNil() ? null : u.unpackString();
                case "parent_block_hash" -> parent = u.tryUnpackNil() ? null : hash(u);
                case "token_ids" -> tokens = tokens(u);
                case "block_size" -> blockSize = u.unpackInt();
                default -> u.skipValue();
            }
        }
        if (type == null) {
            throw new IllegalArgumentException("an event without a \"type\"");
        }
        return new Event(type, hashes, medium, parent, tokens, blockSize);
    }

    /** The older shape: [tag, fields in declaration order...]. */
    private static Event arrayEvent(MessageUnpacker u) throws IOException {
        int items = u.unpackArrayHeader();
        String type = u.unpackString();
        List<Long> hashes = List.of();
        String medium = null;
        Long parent = null;
        List<Integer> tokens = List.of();
        int blockSize = 0;
        boolean stored = type.equals("BlockStored");
        // BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...),
        // BlockRemoved(block_hashes, medium, ...)
        int mediumAt = switch (type) {
            case "BlockStored" -> 6;
            case "BlockRemoved" -> 2;
            default -> -1;
        };
        for (int i = 1; i < items; i++) {
            if (i == 1 && mediumAt > 0) {
                hashes = hashes(u);
            } else if (i == mediumAt) {
                medium = u.tryUnpackNil() ? null : u.unpackString();
            } else if (stored && i == 2) {
                parent = u.tryUnpackNil() ? null : hash(u);
            } else if (stored && i == 3) {
                tokens = tokens(u);
            } else if (stored && i == 4) {
                blockSize = u.unpackInt();
            } else {
                u.skipValue();
            }
        }
        return new Event(type, hashes, medium, parent, tokens, blockSize);
    }

    private static List<Integer> tokens(MessageUnpacker u) throws IOException {
        int n = u.unpackArrayHeader();
        List<Integer> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(u.unpackInt());
        }
        return List.copyOf(out);
    }

    private static List<Long> hashes(MessageUnpacker u) throws IOException {
        int n = u.unpackArrayHeader();
        List<Long> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(hash(u));
        }
        return List.copyOf(out);
    }

    private static long hash(MessageUnpacker u) throws IOException {
        if (u.getNextFormat().getValueType() == ValueType.BINARY) {
            // an engine sending hash bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): vLLM's int form is the low 8
            byte[] b = u.readPayload(u.unpackBinaryHeader());
            long v = 0;
            for (int j = Math.max(0, b.length - 8); j < b.length; j++) {
                v = (v << 8) | (b[j] & 0xFF);
            }
            return v;
        }
        // uint64 above 2^63 - 1 arrives as a BigInteger; its low 64 bits are the unsigned value
        return u.unpackBigInteger().longValue();
    }
}

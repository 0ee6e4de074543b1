package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.math.BigInteger;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.List;
import java.util.Objects;
import java.util.function.Function;

/**
 * vLLM's event payload: one {@code KVEventBatch} as {@code msgspec} encodes it in vLLM 0.32
 * ({@code vllm/distributed/kv_events.py}), so that vLLM's own decoder, and every router that reads
 * vLLM's events, reads the pool's.
 *
 * <pre>
 *  EventBatch: a msgpack array (array_like), 3 items
 *  +--------------------+-----------------------+------------------------------+
 *  | ts: float 64       | events: array         | data_parallel_rank: nil      |
 *  | (seconds, Unix)    | (the events below)    | (the pool is no engine rank) |
 *  +--------------------+-----------------------+------------------------------+
 *
 *  events: msgpack maps tagged by "type" (msgspec tag=True; the class name is the tag), keys in this order
 *  BlockStored    {"type": "BlockStored", "block_hashes": [uint64...], "parent_block_hash": uint64|nil,
 *                  "token_ids": [int...], "block_size": int, "lora_id": int|nil, "medium": "CPU"|"STORAGE",
 *                  "lora_name": str|nil[, "extra_keys": [[lora name?, salt?]|nil per block]]}
 *  BlockRemoved   {"type": "BlockRemoved", "block_hashes": [uint64...], "medium": "CPU"|"STORAGE"}
 *  AllBlocksCleared {"type": "AllBlocksCleared"}
 * </pre>
 * Every field vLLM declares without a default is present ({@code BlockStored} has seven). The parent hash,
 * the tokens, the block size and the LoRA come from what the connector said of the block ({@link BlockInfo},
 * BLOCK_INFO); for a key it said nothing of, the pool cannot know them and says so with nil, empty and 0.
 * {@code extra_keys} goes out only when a block has a LoRA name or a cache salt; the other fields with defaults
 * ({@code group_idx}, {@code locality}, ...) are left out, as msgspec's {@code omit_defaults} leaves them out.
 * The object key has no field in vLLM's schema and is not sent. Hashes are unsigned ({@link BlockHashes}): those
 * of 2^63 and above go out as uint64, as msgspec writes Python ints that large. Byte for byte what msgspec
 * writes for the same batch (checked against a vector msgspec made, in the tests).
 *
 * <p>Events of the same kind and medium that follow each other in a batch go out as one event with
 * all their hashes, in order (an eviction round lists thousands of keys one event each); stores with infos
 * go out together while each block's parent is the block before and the block size and LoRA stay the same,
 * their tokens one list, as vLLM sends a request's new blocks.
 */
final class EventBatchCodec {

    static {
        MsgpackBuffers.portable();
    }

    private static final BigInteger TWO_64 = BigInteger.ONE.shiftLeft(64);

    private EventBatchCodec() {
    }

    /** The payload of one batch of {@code events} (in order), stamped {@code tsSeconds}, without block infos. */
    static byte[] encode(double tsSeconds, List<KvEvent> events) {
        return encode(tsSeconds, events, key -> null);
    }

    /**
     * The payload of one batch of {@code events} (in order), stamped {@code tsSeconds}; {@code infos} gives what a
     * connector said of a key's block (BLOCK_INFO), or null.
     */
    static byte[] encode(double tsSeconds, List<KvEvent> events, Function<byte[], BlockInfo> infos) {
        List<Out> out = new ArrayList<>();
        for (int i = 0; i < events.size(); ) {
            int end = runEnd(events, i);
            switch (events.get(i)) {
                case KvEvent.Stored s -> stores(events, i, end, s.medium(), infos, out);
                case KvEvent.Removed r -> out.add(new Removed(hashes(events, i, end), r.medium()));
                case KvEvent.AllCleared c -> out.add(new Cleared());
            }
            i = end;
        }
        try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
            p.packArrayHeader(3);
            p.packDouble(tsSeconds);
            p.packArrayHeader(out.size());
            for (Out o : out) {
                switch (o) {
                    case Stored s -> stored(p, s);
                    case Removed r -> {
                        p.packMapHeader(3);
                        type(p, "BlockRemoved");
                        hashes(p, r.hashes());
                        p.packString("medium").packString(r.medium().wire());
                    }
                    case Cleared c -> {
                        p.packMapHeader(1);
                        type(p, "AllBlocksCleared");
                    }
                }
            }
            p.packNil();
            return p.toByteArray();
        } catch (IOException e) {
            throw new UncheckedIOException("encoding a KV event batch in memory", e);
        }
    }

    /** What goes out: an event of several blocks. */
    private sealed interface Out {
    }

    /** Blocks stored; {@code infos} all null (what the pool alone knows) or all set, one chain. */
    private record Stored(List<Long> hashes, List<BlockInfo> infos, Medium medium) implements Out {
    }

    private record Removed(List<Long> hashes, Medium medium) implements Out {
    }

    private record Cleared() implements Out {
    }

    /**
     * The stores of events {@code [from, to)} as vLLM would send them: blocks without info together, and blocks
     * with info in runs that vLLM sends as one {@code BlockStored} (each block's parent the block before, the same
     * block size and LoRA), their tokens one list.
     */
    private static void stores(List<KvEvent> events, int from, int to, Medium medium,
                               Function<byte[], BlockInfo> infos, List<Out> out) {
        List<Long> hashes = new ArrayList<>();
        List<BlockInfo> blocks = new ArrayList<>();
        for (int i = from; i < to; i++) {
            for (byte[] key : keys(events.get(i))) {
                hashes.add(BlockHashes.of(key));
                blocks.add(infos.apply(key));
            }
        }
        Stored cur = null;
        for (int i : parentsFirst(hashes, blocks)) {
            BlockInfo info = blocks.get(i);
            if (cur == null || !continues(cur, info)) {
                cur = new Stored(new ArrayList<>(), new ArrayList<>(), medium);
                out.add(cur);
            }
            cur.hashes().add(hashes.get(i));
            cur.infos().add(info);
        }
    }

    /**
     * The order to announce a run of stores in: each block after its parent when both are in the run, otherwise
     * as they came. A batch put's objects are listed in no particular order (its items commit shard by shard),
     * and a router that links a block to its parent wants the parent first, as an engine sends them.
     */
    private static int[] parentsFirst(List<Long> hashes, List<BlockInfo> blocks) {
        int n = hashes.size();
        Map<Long, Integer> at = new HashMap<>();
        for (int i = 0; i < n; i++) {
            at.putIfAbsent(hashes.get(i), i);
        }
        Map<Integer, List<Integer>> children = new HashMap<>();
        boolean[] child = new boolean[n];
        for (int i = 0; i < n; i++) {
            BlockInfo b = blocks.get(i);
            Integer parent = b == null || b.parentBlockHash() == null ? null : at.get(b.parentBlockHash());
            if (parent != null && parent != i) {
                children.computeIfAbsent(parent, x -> new ArrayList<>()).add(i);
                child[i] = true;
            }
        }
        if (children.isEmpty()) {
            int[] same = new int[n];
            Arrays.setAll(same, i -> i);
            return same;
        }
        int[] order = new int[n];
        int k = 0;
        boolean[] done = new boolean[n];
        ArrayDeque<Integer> stack = new ArrayDeque<>();
        for (int root = 0; root < n; root++) {
            if (child[root]) {
                continue;
            }
            stack.push(root);
            while (!stack.isEmpty()) {
                int i = stack.pop();
                if (done[i]) {
                    continue;
                }
                done[i] = true;
                order[k++] = i;
                List<Integer> c = children.getOrDefault(i, List.of());
                for (int j = c.size() - 1; j >= 0; j--) {
                    stack.push(c.get(j));
                }
            }
        }
        for (int i = 0; i < n; i++) { // only in a cycle of parents (malformed infos): as they came
            if (!done[i]) {
                order[k++] = i;
            }
        }
        return order;
    }


    private static boolean continues(Stored run, BlockInfo next) {
        BlockInfo last = run.infos().getLast();
        if (last == null || next == null) {
            return last == null && next == null;
        }
        return next.parentBlockHash() != null && next.parentBlockHash().longValue() == run.hashes().getLast().longValue()
                && next.blockSize() == last.blockSize() && Objects.equals(next.loraId(), last.loraId())
                && Objects.equals(next.loraName(), last.loraName());
    }

    /**
     * One {@code BlockStored}: vLLM's seven fields without defaults, and {@code extra_keys} when a block has a
     * LoRA name or a cache salt (per block: the LoRA name, then the salt, as vLLM lists them; nil for neither).
     */
    private static void stored(MessageBufferPacker p, Stored s) throws IOException {
        BlockInfo first = s.infos().getFirst();
        boolean extra = first != null && s.infos().stream().anyMatch(b -> b.loraName() != null || b.cacheSalt() != null);
        p.packMapHeader(extra ? 9 : 8);
        type(p, "BlockStored");
        hashes(p, s.hashes());
        p.packString("parent_block_hash");
        if (first == null || first.parentBlockHash() == null) {
            p.packNil();
        } else {
            unsigned(p, first.parentBlockHash());
        }
        p.packString("token_ids");
        if (first == null) {
            p.packArrayHeader(0);
        } else {
            p.packArrayHeader(s.infos().stream().mapToInt(b -> b.tokenIds().length).sum());
            for (BlockInfo b : s.infos()) {
                for (int t : b.tokenIds()) {
                    p.packInt(t);
                }
            }
        }
        p.packString("block_size").packInt(first == null ? 0 : first.blockSize());
        p.packString("lora_id");
        if (first == null || first.loraId() == null) {
            p.packNil();
        } else {
            p.packLong(first.loraId());
        }
        p.packString("medium").packString(s.medium().wire());
        p.packString("lora_name");
        if (first == null || first.loraName() == null) {
            p.packNil();
        } else {
            p.packString(first.loraName());
        }
        if (extra) {
            p.packString("extra_keys").packArrayHeader(s.infos().size());
            for (BlockInfo b : s.infos()) {
                int n = (b.loraName() != null ? 1 : 0) + (b.cacheSalt() != null ? 1 : 0);
                if (n == 0) {
                    p.packNil();
                    continue;
                }
                p.packArrayHeader(n);
                if (b.loraName() != null) {
                    p.packString(b.loraName());
                }
                if (b.cacheSalt() != null) {
                    p.packString(b.cacheSalt());
                }
            }
        }
    }

    private static void type(MessageBufferPacker p, String tag) throws IOException {
        p.packString("type").packString(tag);
    }

    /** The hashes of every key of events {@code [from, to)}. */
    private static List<Long> hashes(List<KvEvent> events, int from, int to) {
        List<Long> out = new ArrayList<>();
        for (int i = from; i < to; i++) {
            for (byte[] key : keys(events.get(i))) {
                out.add(BlockHashes.of(key));
            }
        }
        return out;
    }

    /** "block_hashes" and {@code hashes}. */
    private static void hashes(MessageBufferPacker p, List<Long> hashes) throws IOException {
        p.packString("block_hashes").packArrayHeader(hashes.size());
        for (long h : hashes) {
            unsigned(p, h);
        }
    }

    /** An unsigned 64-bit value carried in a long: 2^63 and above as uint64, as msgspec writes large ints. */
    private static void unsigned(MessageBufferPacker p, long h) throws IOException {
        if (h >= 0) {
            p.packLong(h);
        } else {
            p.packBigInteger(BigInteger.valueOf(h).add(TWO_64));
        }
    }

    private static List<byte[]> keys(KvEvent e) {
        return switch (e) {
            case KvEvent.Stored s -> s.keys();
            case KvEvent.Removed r -> r.keys();
            case KvEvent.AllCleared c -> List.of();
        };
    }

    /** Where the run of events that go out as one, starting at {@code i}, ends (exclusive). */
    private static int runEnd(List<KvEvent> events, int i) {
        KvEvent first = events.get(i);
        int j = i + 1;
        while (j < events.size() && sameRun(first, events.get(j))) {
            j++;
        }
        return j;
    }

    private static boolean sameRun(KvEvent a, KvEvent b) {
        return switch (a) {
            case KvEvent.Stored s -> b instanceof KvEvent.Stored t && s.medium() == t.medium();
            case KvEvent.Removed r -> b instanceof KvEvent.Removed t && r.medium() == t.medium();
            // two resets in a row say no more than one
            case KvEvent.AllCleared c -> b instanceof KvEvent.AllCleared;
        };
    }
}

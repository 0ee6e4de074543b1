package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;
import org.junit.jupiter.api.Test;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.value.ArrayValue;
import org.msgpack.value.MapValue;
import org.msgpack.value.Value;
import org.msgpack.value.ValueFactory;

import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/** vLLM's payload, byte for byte: each event kind, hashes of every size, runs merged, and the keys' hashes. */
class EventBatchCodecTest {

    /** A connector key whose block hash's low 64 bits are {@code low16} (16 hex digits). */
    private static byte[] connectorKey(String low16) {
        return ("kvp1/tiny-llama/v1/tp0of1-pp0of1/bf16/" + "ab".repeat(24) + low16).getBytes(StandardCharsets.US_ASCII);
    }

    private static Value decode(byte[] payload) throws Exception {
        try (MessageUnpacker u = MessagePack.newDefaultUnpacker(payload)) {
            Value v = u.unpackValue();
            assertThat(u.hasNext()).as("one value, nothing after it").isFalse();
            return v;
        }
    }

    private static Map<String, Value> fields(Value event) {
        Map<String, Value> out = new LinkedHashMap<>();
        MapValue m = event.asMapValue();
        for (Map.Entry<Value, Value> e : m.entrySet()) {
            out.put(e.getKey().asStringValue().asString(), e.getValue());
        }
        return out;
    }

    /**
     * The vector is what msgspec (vLLM 0.32's encoder) writes for
     * {@code KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[1, 2**64 - 1], parent_block_hash=None,
     * token_ids=[], block_size=0, lora_id=None, medium="CPU", lora_name=None), BlockRemoved(block_hashes=[5],
     * medium="STORAGE"), AllBlocksCleared()], data_parallel_rank=None)}; two stores in a row go out as one.
     */
    @Test
    void aBatchIsByteForByteWhatMsgspecWrites() {
        byte[] payload = EventBatchCodec.encode(1.5, List.of(
                new KvEvent.Stored(List.of(connectorKey("0000000000000001")), Medium.CPU),
                new KvEvent.Stored(List.of(connectorKey("ffffffffffffffff")), Medium.CPU),
                new KvEvent.Removed(List.of(connectorKey("0000000000000005")), Medium.STORAGE),
                new KvEvent.AllCleared()));
        String msgspec = "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cf"
                + "ffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a"
                + "6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d"
                + "6f766564ac626c6f636b5f6861736865739105a66d656469756da753544f5241474581a474797065b0416c6c426c6f63"
                + "6b73436c6561726564c0";
        assertThat(HexFormat.of().formatHex(payload)).isEqualTo(msgspec);
    }

    /**
     * With what connectors said of the blocks (BLOCK_INFO): the vector is msgspec's for {@code KVEventBatch(ts=1.5,
     * events=[BlockStored(block_hashes=[1, 2], parent_block_hash=2**64 - 1, token_ids=[10, 11, 12, 13], block_size=2,
     * lora_id=7, medium="CPU", lora_name="ad", extra_keys=[("ad", "salt"), ("ad",)]), BlockStored(block_hashes=[9],
     * parent_block_hash=None, token_ids=[5, 6], block_size=2, lora_id=None, medium="STORAGE", lora_name=None)],
     * data_parallel_rank=None)}: a chain of two blocks is one event, its tokens one list.
     */
    @Test
    void storesWithBlockInfosAreByteForByteWhatMsgspecWrites() {
        byte[] k1 = connectorKey("0000000000000001");
        byte[] k2 = connectorKey("0000000000000002");
        byte[] k9 = connectorKey("0000000000000009");
        Map<String, BlockInfo> infos = Map.of(
                new String(k1, StandardCharsets.US_ASCII), new BlockInfo(-1L, 2, new int[]{10, 11}, 7L, "ad", "salt"),
                new String(k2, StandardCharsets.US_ASCII), new BlockInfo(1L, 2, new int[]{12, 13}, 7L, "ad", null),
                new String(k9, StandardCharsets.US_ASCII), BlockInfo.of(null, 2, new int[]{5, 6}));
        byte[] payload = EventBatchCodec.encode(1.5, List.of(new KvEvent.Stored(List.of(k1), Medium.CPU),
                new KvEvent.Stored(List.of(k2), Medium.CPU), new KvEvent.Stored(List.of(k9), Medium.STORAGE)),
                k -> infos.get(new String(k, StandardCharsets.US_ASCII)));
        String msgspec = "93cb3ff80000000000009289a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920102"
                + "b1706172656e745f626c6f636b5f68617368cfffffffffffffffffa9746f6b656e5f696473940a0b0c0daa626c6f636b"
                + "5f73697a6502a76c6f72615f696407a66d656469756da3435055a96c6f72615f6e616d65a26164aa65787472615f6b65"
                + "79739292a26164a473616c7491a2616488a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
                + "9109b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920506aa626c6f636b5f73697a6502a7"
                + "6c6f72615f6964c0a66d656469756da753544f52414745a96c6f72615f6e616d65c0c0";
        assertThat(HexFormat.of().formatHex(payload)).isEqualTo(msgspec);
    }

    /** A batch put lists its objects in no particular order: a chain still goes out parent first, as one event. */
    @Test
    void aChainListedOutOfOrderGoesOutParentFirst() throws Exception {
        byte[] a = connectorKey("000000000000000a");
        byte[] b = connectorKey("000000000000000b");
        byte[] c = connectorKey("000000000000000c");
        byte[] x = connectorKey("000000000000000f");
        Map<String, BlockInfo> infos = Map.of(
                new String(a, StandardCharsets.US_ASCII), BlockInfo.of(null, 1, new int[]{1}),
                new String(b, StandardCharsets.US_ASCII), BlockInfo.of(0xaL, 1, new int[]{2}),
                new String(c, StandardCharsets.US_ASCII), BlockInfo.of(0xbL, 1, new int[]{3}));
        EventBatchReader.Batch batch = EventBatchReader.read(EventBatchCodec.encode(1.0, List.of(
                new KvEvent.Stored(List.of(c), Medium.CPU), new KvEvent.Stored(List.of(x), Medium.CPU),
                new KvEvent.Stored(List.of(b, a), Medium.CPU)), k -> infos.get(new String(k, StandardCharsets.US_ASCII))));
        assertThat(batch.events()).containsExactly(
                new EventBatchReader.Event("BlockStored", List.of(15L), "CPU"),
                new EventBatchReader.Event("BlockStored", List.of(10L, 11L, 12L), "CPU", null, List.of(1, 2, 3), 1));
    }

    /** A store joins the event before it only as the next block of its chain, and never mixes with unknown blocks. */
    @Test
    void aChainBreaksWhereTheParentIsNotTheBlockBeforeOrTheInfoIsMissing() throws Exception {
        byte[] a = connectorKey("000000000000000a");
        byte[] b = connectorKey("000000000000000b");
        byte[] c = connectorKey("000000000000000c");
        byte[] d = connectorKey("000000000000000d");
        byte[] e = connectorKey("000000000000000e");
        Map<String, BlockInfo> infos = Map.of(
                new String(a, StandardCharsets.US_ASCII), BlockInfo.of(null, 1, new int[]{1}),
                new String(b, StandardCharsets.US_ASCII), BlockInfo.of(0xaL, 1, new int[]{2}),
                new String(c, StandardCharsets.US_ASCII), BlockInfo.of(0xaL, 1, new int[]{3}), // a sibling of b
                new String(e, StandardCharsets.US_ASCII), BlockInfo.of(0xdL, 1, new int[]{5}));
        ArrayValue events = decode(EventBatchCodec.encode(1.0, List.of(new KvEvent.Stored(List.of(a, b, c, d, e),
                Medium.CPU)), k -> infos.get(new String(k, StandardCharsets.US_ASCII)))).asArrayValue().get(1)
                .asArrayValue();
        assertThat(events.size()).isEqualTo(4);
        assertThat(fields(events.get(0)).get("block_hashes")).isEqualTo(ValueFactory.newArray(ValueFactory.newInteger(10),
                ValueFactory.newInteger(11)));
        assertThat(fields(events.get(0)).get("token_ids")).isEqualTo(ValueFactory.newArray(ValueFactory.newInteger(1),
                ValueFactory.newInteger(2)));
        assertThat(fields(events.get(1)).get("parent_block_hash")).isEqualTo(ValueFactory.newInteger(10));
        assertThat(fields(events.get(2)).get("block_size").asIntegerValue().asInt()).as("d: no info").isZero();
        assertThat(fields(events.get(3)).get("parent_block_hash")).as("e's parent is d, which has no info")
                .isEqualTo(ValueFactory.newInteger(13));
    }

    @Test
    void blockStoredCarriesEveryFieldVllmRequiresAndNothingElse() throws Exception {
        byte[] key = connectorKey("8000000000000000");
        ArrayValue batch = decode(EventBatchCodec.encode(1_700_000_000.25,
                List.of(new KvEvent.Stored(List.of(key), Medium.STORAGE)))).asArrayValue();
        assertThat(batch.size()).isEqualTo(3);
        assertThat(batch.get(0).asFloatValue().toDouble()).isEqualTo(1_700_000_000.25);
        assertThat(batch.get(2).isNilValue()).as("data_parallel_rank").isTrue();
        Map<String, Value> f = fields(batch.get(1).asArrayValue().get(0));
        assertThat(f.keySet()).containsExactly("type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                "lora_id", "medium", "lora_name");
        assertThat(f.get("type").asStringValue().asString()).isEqualTo("BlockStored");
        // 2^63 is a uint64 on the wire, as msgspec writes a Python int that large
        assertThat(f.get("block_hashes")).isEqualTo(ValueFactory.newArray(
                ValueFactory.newInteger(new java.math.BigInteger("9223372036854775808"))));
        assertThat(f.get("parent_block_hash").isNilValue()).isTrue();
        assertThat(f.get("token_ids").asArrayValue().size()).isZero();
        assertThat(f.get("block_size").asIntegerValue().asInt()).isZero();
        assertThat(f.get("lora_id").isNilValue()).isTrue();
        assertThat(f.get("medium").asStringValue().asString()).isEqualTo("STORAGE");
        assertThat(f.get("lora_name").isNilValue()).isTrue();
    }

    @Test
    void blockRemovedAndAllBlocksCleared() throws Exception {
        ArrayValue events = decode(EventBatchCodec.encode(2.0, List.of(
                new KvEvent.Removed(List.of(connectorKey("000000000000002a"), connectorKey("000000000000002b")), Medium.CPU),
                new KvEvent.AllCleared(), new KvEvent.AllCleared()))).asArrayValue().get(1).asArrayValue();
        assertThat(events.size()).as("two resets in a row say one").isEqualTo(2);
        Map<String, Value> removed = fields(events.get(0));
        assertThat(removed.keySet()).containsExactly("type", "block_hashes", "medium");
        assertThat(removed.get("type").asStringValue().asString()).isEqualTo("BlockRemoved");
        assertThat(removed.get("block_hashes")).isEqualTo(ValueFactory.newArray(ValueFactory.newInteger(42),
                ValueFactory.newInteger(43)));
        assertThat(removed.get("medium").asStringValue().asString()).isEqualTo("CPU");
        assertThat(fields(events.get(1))).containsOnlyKeys("type");
        assertThat(fields(events.get(1)).get("type").asStringValue().asString()).isEqualTo("AllBlocksCleared");
    }

    @Test
    void runsOfOneKindAndMediumMergeAndOthersKeepTheirOrder() {
        byte[] a = connectorKey("0000000000000001");
        byte[] b = connectorKey("0000000000000002");
        byte[] c = connectorKey("0000000000000003");
        EventBatchReader.Batch batch = EventBatchReader.read(EventBatchCodec.encode(3.0, List.of(
                new KvEvent.Removed(List.of(a), Medium.CPU),
                new KvEvent.Stored(List.of(a), Medium.STORAGE),
                new KvEvent.Removed(List.of(b), Medium.CPU),
                new KvEvent.Removed(List.of(c), Medium.CPU),
                new KvEvent.Removed(List.of(c), Medium.STORAGE))));
        assertThat(batch.events()).containsExactly(
                new EventBatchReader.Event("BlockRemoved", List.of(1L), "CPU"),
                new EventBatchReader.Event("BlockStored", List.of(1L), "STORAGE"),
                new EventBatchReader.Event("BlockRemoved", List.of(2L, 3L), "CPU"),
                new EventBatchReader.Event("BlockRemoved", List.of(3L), "STORAGE"));
        assertThat(batch.dataParallelRank()).isNull();
    }

    /** The reader takes the older array-shaped events too (tag first, fields in declaration order). */
    @Test
    void theReaderTakesArrayShapedEvents() {
        // msgspec, array_like=True tag=True: [1.5, [["BlockStored", [7], None, [1, 2], 16, None, "GPU", None],
        // ["BlockRemoved", [7], "GPU"], ["AllBlocksCleared"]], 0]
        byte[] payload = HexFormat.of().parseHex("93cb3ff80000000000009398ab426c6f636b53746f7265649107c092010210c0"
                + "a3475055c093ac426c6f636b52656d6f7665649107a347505591b0416c6c426c6f636b73436c656172656400");
        EventBatchReader.Batch batch = EventBatchReader.read(payload);
        assertThat(batch.events()).containsExactly(
                new EventBatchReader.Event("BlockStored", List.of(7L), "GPU", null, List.of(1, 2), 16),
                new EventBatchReader.Event("BlockRemoved", List.of(7L), "GPU"),
                new EventBatchReader.Event("AllBlocksCleared", List.of(), null));
        assertThat(batch.dataParallelRank()).isZero();
    }

    /** Connector keys give vLLM's int form of their block hash; other keys the same form of their SHA-256. */
    @Test
    void blockHashesOfKeys() {
        String hash = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        // int.from_bytes(bytes(range(32)), "big") & (2**64 - 1)
        assertThat(BlockHashes.of(("kvp1/m/v/tp0of1-pp0of1/bf16/" + hash).getBytes(StandardCharsets.US_ASCII)))
                .isEqualTo(1736447835066146335L);
        assertThat(BlockHashes.of(hash.getBytes(StandardCharsets.US_ASCII))).as("a bare hash").isEqualTo(1736447835066146335L);
        // int.from_bytes(hashlib.sha256(b"blk/0").digest(), "big") & (2**64 - 1), and the same for the probe key
        assertThat(BlockHashes.of("blk/0".getBytes(StandardCharsets.US_ASCII))).isEqualTo(980530018798458897L);
        assertThat(Long.toUnsignedString(BlockHashes.of("kvpool-ready-probe".getBytes(StandardCharsets.US_ASCII))))
                .isEqualTo("14017431456151048727");
        // 63 or 65 digits, or a digit that is not hex, is not a block hash
        assertThat(BlockHashes.of(("x/" + hash.substring(1)).getBytes(StandardCharsets.US_ASCII)))
                .isNotEqualTo(BlockHashes.of(("y/" + hash.substring(1)).getBytes(StandardCharsets.US_ASCII)));
        assertThat(BlockHashes.of(("x/" + hash.substring(0, 63) + "g").getBytes(StandardCharsets.US_ASCII)))
                .isNotEqualTo(BlockHashes.of(("y/" + hash.substring(0, 63) + "g").getBytes(StandardCharsets.US_ASCII)));
    }
}

package io.kvpool.connector;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.Cbor;
import io.kvpool.connector.hash.KeyFormat;
import org.junit.jupiter.api.Test;

import java.io.InputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.IntStream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * vLLM's per-request {@code cache_salt}: it joins the extra keys of block 0 only, so every block
 * hash of a salted request differs from the unsalted ones, and a connector never matches a salted
 * request against KV saved without that salt.
 */
class CacheSaltTest {

    private static final int BS = 16;

    private static int[] tokens(int n) {
        return IntStream.range(0, n).toArray();
    }

    private static byte[] sha256(byte[] b) throws Exception {
        return MessageDigest.getInstance("SHA-256").digest(b);
    }

    @Test
    void theSaltJoinsTheExtraKeysOfTheFirstBlockOnly() {
        ConnectorRequest plain = new ConnectorRequest("p", tokens(48));
        ConnectorRequest salted = new ConnectorRequest("s", tokens(48), 48, null, "salt-a");
        ConnectorRequest lora = new ConnectorRequest("l", tokens(48), 48, List.of("adapter-a", 3), "salt-a");
        for (int b = 0; b < 3; b++) {
            assertThat(plain.extraKeysFor(b)).as("no keys, no salt: block %d", b).isNull();
        }
        assertThat(salted.extraKeysFor(0)).isEqualTo(List.of("salt-a"));
        assertThat(salted.extraKeysFor(1)).isNull();
        assertThat(salted.extraKeysFor(2)).isNull();
        assertThat(lora.extraKeysFor(0)).as("the salt follows the other keys").isEqualTo(List.of("adapter-a", 3, "salt-a"));
        assertThat(lora.extraKeysFor(1)).isEqualTo(List.of("adapter-a", 3));
        assertThat(new ConnectorRequest("e", tokens(16), 16, List.of(), null).extraKeysFor(0))
                .as("no keys at all hash as null, as in vLLM").isNull();
        assertThatThrownBy(() -> new ConnectorRequest("x", tokens(16), 16, null, ""))
                .hasMessageContaining("cache_salt");
    }

    @Test
    void everyBlockHashDiffersAndOnlyBlockZerosCborInputCarriesTheSalt() throws Exception {
        BlockHasher h = new BlockHasher(BS, "0");
        int[] t = tokens(64);
        ConnectorRequest salted = new ConnectorRequest("s", t, t.length, null, "salt-a");
        List<BlockHash> unsalted = h.hashes(t);
        List<BlockHash> got = h.hashes(t, t.length, salted::extraKeysFor);
        assertThat(got).hasSize(4);
        for (int b = 0; b < got.size(); b++) {
            assertThat(got.get(b)).as("block %d", b).isNotEqualTo(unsalted.get(b));
        }
        // the same chain by hand: [parent, [tokens], ["salt-a"]] for block 0, [parent, [tokens], null] after
        byte[] parent = h.root().bytes();
        for (int b = 0; b < 4; b++) {
            List<Object> block = new ArrayList<>();
            for (int i = b * BS; i < (b + 1) * BS; i++) {
                block.add(t[i]);
            }
            Object extra = b == 0 ? List.of("salt-a") : null;
            parent = sha256(Cbor.encode(new Object[]{parent, block, extra}));
            assertThat(got.get(b).bytes()).as("block %d", b).isEqualTo(parent);
        }
        // blocks after the first differ only through their parent: salting block 1 too would differ
        assertThat(h.next(got.get(0), t, BS, null)).isEqualTo(got.get(1));
        assertThat(h.next(got.get(0), t, BS, List.of("salt-a"))).isNotEqualTo(got.get(1));
    }

    @Test
    void matchesTheSaltedVectorsComputedInPython() throws Exception {
        JsonNode cases;
        try (InputStream in = CacheSaltTest.class.getResourceAsStream("/block-hash-vectors.json")) {
            cases = new ObjectMapper().readTree(in).get("cases");
        }
        int checked = 0;
        for (JsonNode c : cases) {
            String name = c.get("name").textValue();
            if (!name.endsWith("first block only")) { // the cases made with the script's salted()
                continue;
            }
            int[] t = new int[c.get("tokens").size()];
            Arrays.setAll(t, i -> c.get("tokens").get(i).intValue());
            List<?> lora = name.contains("LoRA") ? List.of("adapter-a", 3) : null;
            ConnectorRequest r = new ConnectorRequest("v", t, t.length, lora, "salt-a");
            BlockHasher h = new BlockHasher(c.get("blockSize").intValue(), c.get("seed").textValue());
            List<String> want = new ArrayList<>();
            c.get("blockHashes").forEach(x -> want.add(x.textValue()));
            assertThat(h.hashes(t, t.length, r::extraKeysFor)).as(name).extracting(BlockHash::hex).isEqualTo(want);
            checked++;
        }
        assertThat(checked).as("salted vector cases").isEqualTo(2);
    }

    /** Blocks of 1 KiB, 2 layers. */
    private static final class Blocks implements PagedKv, AutoCloseable {
        final Arena arena = Arena.ofShared();
        final MemorySegment all = arena.allocate(1024L * 16, 64);

        public int blockSize() {
            return BS;
        }

        public int numLayers() {
            return 2;
        }

        public long blockBytes() {
            return 1024;
        }

        public MemorySegment block(int id) {
            return all.asSlice(id * 1024L, 1024);
        }

        public void close() {
            arena.close();
        }
    }

    private static void save(KvConnector c, Blocks kv, ConnectorRequest r) {
        int[] table = {0, 1, 2};
        c.startLoadKv(c.buildConnectorMeta(List.of(new ScheduledRequest(r, table, 0, r.numTokens()))), kv);
        c.saveKvLayer(0, kv);
        c.saveKvLayer(1, kv);
        c.requestFinished(r, table);
    }

    @Test
    void aConnectorMatchesASaltedRequestOnlyAgainstKvSavedWithTheSameSalt() throws Exception {
        try (LocalOffloadConnector c = new LocalOffloadConnector(new BlockHasher(BS, "0"), KeyFormat.of("m", "v1", "f32"),
                1024, 16 * 1024, null, 0); Blocks kv = new Blocks()) {
            int[] t = tokens(48);
            save(c, kv, new ConnectorRequest("plain", t));
            assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("again", t), 0).tokens()).isEqualTo(48);
            assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("a", t, 48, null, "salt-a"), 0))
                    .as("salted against unsalted KV").isEqualTo(Match.NONE);
            save(c, kv, new ConnectorRequest("salted", t, 48, null, "salt-a"));
            assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("a2", t, 48, null, "salt-a"), 0).tokens())
                    .as("same salt").isEqualTo(48);
            assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("b", t, 48, null, "salt-b"), 0))
                    .as("another salt").isEqualTo(Match.NONE);
        }
    }
}

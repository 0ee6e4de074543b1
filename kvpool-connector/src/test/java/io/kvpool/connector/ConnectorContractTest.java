package io.kvpool.connector;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.client.PutStatus;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.DynamicContainer;
import org.junit.jupiter.api.DynamicNode;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.io.InputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.reflect.RecordComponent;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.fail;

/**
 * The connector contract ({@code connector-contract-vectors.json}, shared with the Python connector's
 * test) run against {@link PoolConnector}, over an in-memory store ({@link MemoryStore}), and against
 * {@link LocalOffloadConnector}: every scenario, each op checked as the vectors' about section says.
 */
class ConnectorContractTest {

    private static final JsonNode DOC = load();
    private static final JsonNode DEFAULTS = DOC.get("defaults");
    /** java-pool-layers: the pool connector moving KV layer by layer; it shares java-pool's skips. */
    private static final List<String> JAVA = List.of("java-pool", "java-pool-layers", "java-local");

    private static JsonNode load() {
        try (InputStream in = ConnectorContractTest.class.getResourceAsStream("/connector-contract-vectors.json")) {
            assertThat(in).as("connector-contract-vectors.json on the test class path").isNotNull();
            return new ObjectMapper().readTree(in);
        } catch (java.io.IOException e) {
            throw new IllegalStateException(e);
        }
    }

    @Test
    void theVectorsCoverEveryImplementationAndSayWhyAScenarioIsSkipped() {
        assertThat(DOC.get("implementations")).extracting(JsonNode::textValue).containsAll(JAVA);
        assertThat(DOC.get("scenarios").size()).isGreaterThanOrEqualTo(25);
        for (JsonNode s : DOC.get("scenarios")) {
            s.path("skip").properties().forEach(e -> assertThat(e.getValue().textValue())
                    .as("%s: why %s is skipped", s.get("name").textValue(), e.getKey()).isNotBlank());
        }
    }

    @TestFactory
    Stream<DynamicNode> everyScenarioOnEveryJavaConnector() {
        List<DynamicNode> out = new ArrayList<>();
        for (JsonNode s : DOC.get("scenarios")) {
            List<DynamicTest> impls = new ArrayList<>();
            for (String impl : JAVA) {
                impls.add(DynamicTest.dynamicTest(impl, () -> {
                    String why = s.path("skip").path(impl.equals("java-pool-layers") ? "java-pool" : impl).textValue();
                    Assumptions.assumeTrue(why == null, why);
                    try (Subject subject = Subject.of(impl, intOr(s, "blockSize"))) {
                        new Run(s, subject).all();
                    }
                }));
            }
            out.add(DynamicContainer.dynamicContainer(s.get("name").textValue(), impls));
        }
        return out.stream();
    }

    private static int intOr(JsonNode s, String field) {
        return s.has(field) ? s.get(field).intValue() : DEFAULTS.get(field).intValue();
    }

    /** The engine's paged KV: {@code blocks} blocks of {@code blockBytes}, {@code layers} layers. */
    static final class Blocks implements PagedKv, AutoCloseable {
        private final Arena arena = Arena.ofShared();
        private final int blockSize;
        private final long blockBytes = DEFAULTS.get("blockBytes").longValue();
        private final MemorySegment all = arena.allocate(blockBytes * DEFAULTS.get("blocks").intValue(), 64);

        Blocks(int blockSize) {
            this.blockSize = blockSize;
        }

        public int blockSize() {
            return blockSize;
        }

        public int numLayers() {
            return DEFAULTS.get("layers").intValue();
        }

        public long blockBytes() {
            return blockBytes;
        }

        public MemorySegment block(int id) {
            return all.asSlice(id * blockBytes, blockBytes);
        }

        public void close() {
            arena.close();
        }
    }

    /** The bytes of a computed block: its key's SHA-256, twice. */
    static byte[] content(String key) {
        try {
            byte[] h = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.US_ASCII));
            byte[] out = new byte[2 * h.length];
            System.arraycopy(h, 0, out, 0, h.length);
            System.arraycopy(h, 0, out, h.length, h.length);
            return out;
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A connector under test with the store it keeps blocks in. */
    interface Subject extends AutoCloseable {
        KvConnector connector();

        /** The store loses the block (eviction). */
        void evict(String key);

        /** Applies a fault op; only stores that can fail accept one. */
        void fault(JsonNode op);

        /** The keys lookups asked about since the last call, or null where no store is asked. */
        List<String> takeProbes(Map<String, String> keyByDigest);

        /** The bytes held under key (null: absent); a store that cannot show bytes gives its content(key). */
        byte[] held(String key);

        @Override
        void close();

        static Subject of(String impl, int blockSize) throws Exception {
            BlockHasher hasher = new BlockHasher(blockSize, DEFAULTS.get("seed").textValue());
            KeyFormat keys = KeyFormat.of(DEFAULTS.get("model").textValue(), DEFAULTS.get("weights").textValue(),
                    DEFAULTS.get("dtype").textValue());
            long bytes = DEFAULTS.get("blockBytes").longValue();
            return switch (impl) {
                case "java-pool" -> new PoolSubject(new MemoryStore(), hasher, keys, PoolConnector.Granularity.BLOCK);
                case "java-pool-layers" -> new PoolSubject(new MemoryStore(), hasher, keys, PoolConnector.Granularity.LAYER);
                case "java-local" -> new LocalSubject(new LocalOffloadConnector(hasher, keys, bytes, 64 * bytes, null, 0));
                default -> throw new IllegalArgumentException(impl);
            };
        }
    }

    record PoolSubject(MemoryStore store, PoolConnector connector) implements Subject {
        PoolSubject(MemoryStore store, BlockHasher hasher, KeyFormat keys, PoolConnector.Granularity granularity) {
            this(store, new PoolConnector(store, hasher, keys, PoolConnector.ResetScope.ALL_FENCED, granularity));
        }

        public void evict(String key) {
            assertThat(store.remove(key)).as("evict %s: the store held it", key).isTrue();
        }

        public void fault(JsonNode op) {
            if (op.has("fail")) {
                store.failNext(MemoryStore.Call.valueOf(op.get("fail").textValue().toUpperCase()));
            }
            op.path("shortRead").forEach(k -> store.readShort(k.textValue()));
            op.path("putStatus").properties().forEach(e ->
                    store.answerPut(e.getKey(), PutStatus.valueOf(e.getValue().textValue())));
        }

        public List<String> takeProbes(Map<String, String> keyByDigest) {
            return store.takeProbes().stream()
                    .map(d -> keyByDigest.getOrDefault(d[0] + ":" + d[1], "<a key no label names>")).toList();
        }

        public byte[] held(String key) {
            return store.get(key);
        }

        public void close() {
            connector.close();
        }
    }

    record LocalSubject(LocalOffloadConnector connector) implements Subject {
        public void evict(String key) {
            assertThat(connector.drop(key)).as("evict %s: native offload held it", key).isTrue();
        }

        public void fault(JsonNode op) {
            fail("native offload cannot be told to fail: the scenario should skip java-local");
        }

        public List<String> takeProbes(Map<String, String> keyByDigest) {
            return null;
        }

        public byte[] held(String key) {
            return connector.heldKeys().contains(key) ? content(key) : null;
        }

        public void close() {
            connector.close();
        }
    }

    /** One scenario on one connector: the ops in order. */
    static final class Run {
        private final JsonNode scenario;
        private final Subject subject;
        private final KvConnector c;
        private final Blocks kv;
        private final BlockHasher hasher;
        private KeyFormat keys;
        private final Map<String, String> labelKeys = new HashMap<>();
        private final Map<String, String> keyByDigest = new HashMap<>();
        private int opNo;

        Run(JsonNode scenario, Subject subject) {
            this.scenario = scenario;
            this.subject = subject;
            this.c = subject.connector();
            int bs = intOr(scenario, "blockSize");
            this.kv = new Blocks(bs);
            this.hasher = new BlockHasher(bs, DEFAULTS.get("seed").textValue());
            this.keys = KeyFormat.of(DEFAULTS.get("model").textValue(), DEFAULTS.get("weights").textValue(),
                    DEFAULTS.get("dtype").textValue());
            scenario.get("keys").properties().forEach(e -> {
                String key = e.getValue().textValue();
                labelKeys.put(e.getKey(), key);
                long[] d = io.kvpool.protocol.KeyDigest.of(key.getBytes(StandardCharsets.US_ASCII));
                keyByDigest.put(d[0] + ":" + d[1], key);
            });
        }

        void all() {
            try (kv) {
                checkKeys();
                for (JsonNode op : scenario.get("ops")) {
                    opNo++;
                    op(op);
                }
            }
        }

        private String where() {
            return "op " + opNo;
        }

        /** Java's keys for every label equal the vectors' (computed independently in Python). */
        private void checkKeys() {
            labelKeys.forEach((label, want) -> {
                String[] lw = label.split("@");
                String[] rb = lw[0].split("#");
                KeyFormat k = lw.length > 1 ? keys.withWeights(lw[1]) : keys;
                ConnectorRequest r = request(rb[0], -1);
                int b = Integer.parseInt(rb[1]);
                List<BlockHash> h = hasher.hashes(r.tokens(), r.tokens().length, r::extraKeysFor);
                assertThat(k.keyString(h.get(b))).as("the key of %s", label).isEqualTo(want);
            });
        }

        private String key(String label) {
            String k = labelKeys.get(label);
            assertThat(k).as("%s: label %s has a key in the vectors", where(), label).isNotNull();
            return k;
        }

        private ConnectorRequest request(String name, int numTokens) {
            JsonNode r = scenario.get("requests").get(name);
            assertThat(r).as("request %s", name).isNotNull();
            int[] t = new int[r.get("tokens").size()];
            for (int i = 0; i < t.length; i++) {
                t[i] = r.get("tokens").get(i).intValue();
            }
            int n = numTokens >= 0 ? numTokens : r.has("numTokens") ? r.get("numTokens").intValue() : t.length;
            List<Object> extra = null;
            if (r.has("extraKeys")) {
                extra = new ArrayList<>();
                for (JsonNode x : r.get("extraKeys")) {
                    extra.add(x.isIntegralNumber() ? (Object) x.longValue() : x.textValue());
                }
            }
            return new ConnectorRequest(name, t, n, extra, r.path("salt").textValue());
        }

        private static int[] ints(JsonNode a) {
            int[] out = new int[a.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = a.get(i).intValue();
            }
            return out;
        }

        /** Runs {@code call}; an expected error must be IllegalArgumentException, and then nothing else is checked. */
        private boolean refused(JsonNode expect, Runnable call) {
            boolean want = "invalid".equals(expect.path("error").textValue());
            try {
                call.run();
            } catch (IllegalArgumentException e) {
                assertThat(want).as("%s refused unexpectedly: %s", where(), e.getMessage()).isTrue();
                return true;
            }
            assertThat(want).as("%s: the connector should have refused", where()).isFalse();
            return false;
        }

        private void op(JsonNode op) {
            JsonNode expect = op.path("expect");
            switch (op.get("op").textValue()) {
                case "lookup" -> {
                    subject.takeProbes(keyByDigest);
                    Match[] m = new Match[1];
                    if (refused(expect, () -> m[0] = c.getNumNewMatchedTokens(request(op.get("req").textValue(), -1),
                            op.get("computed").intValue()))) {
                        return;
                    }
                    assertThat(m[0].tokens()).as("%s: tokens matched", where()).isEqualTo(expect.get("tokens").intValue());
                    List<String> probed = subject.takeProbes(keyByDigest);
                    if (probed != null && expect.has("probed")) {
                        assertThat(probed).as("%s: keys the lookup asked about", where()).isEqualTo(keys(expect.get("probed")));
                    }
                }
                case "alloc" -> refused(expect, () -> c.updateStateAfterAlloc(request(op.get("req").textValue(), -1),
                        ints(op.get("blocks")), op.get("external").intValue()));
                case "step" -> step(op, expect);
                case "finish" -> assertThat(c.requestFinished(request(op.get("req").textValue(), -1), ints(op.get("blocks"))))
                        .as("%s: keep the blocks", where()).isEqualTo(expect.get("keep").booleanValue());
                case "preempt" -> {
                    Set<String> ids = new HashSet<>();
                    op.get("reqs").forEach(r -> ids.add(r.textValue()));
                    c.waitForRequestSaves(ids);
                    for (int b : ints(op.get("blocks"))) {
                        kv.block(b).fill((byte) 0xDD); // the engine reuses the blocks at once
                    }
                }
                case "reset" -> checkReset(c.resetCache(), expect);
                case "switchWeights" -> {
                    long reclaimed;
                    try {
                        reclaimed = ((VersionedKeys) c).switchWeights(op.get("weights").textValue(),
                                op.get("reclaim").booleanValue()).get();
                    } catch (Exception e) {
                        throw new AssertionError(where() + ": switchWeights", e);
                    }
                    keys = keys.withWeights(op.get("weights").textValue());
                    if (expect.has("reclaimed")) {
                        assertThat(reclaimed).as("%s: reclaimed", where()).isEqualTo(expect.get("reclaimed").longValue());
                    }
                }
                case "evict" -> op.get("keys").forEach(l -> subject.evict(key(l.textValue())));
                case "fault" -> subject.fault(faultWithKeys(op));
                case "store" -> {
                    for (JsonNode l : op.path("holds")) {
                        assertThat(subject.held(key(l.textValue()))).as("%s: the store holds %s", where(), l.textValue())
                                .isEqualTo(content(key(l.textValue())));
                    }
                    for (JsonNode l : op.path("lacks")) {
                        assertThat(subject.held(key(l.textValue()))).as("%s: the store lacks %s", where(), l.textValue())
                                .isNull();
                    }
                }
                case "stats" -> {
                    Map<String, Long> got = stats(c.stats());
                    expect.properties().forEach(e -> assertThat(got.get(e.getKey())).as("%s: stats %s", where(), e.getKey())
                            .isEqualTo(e.getValue().longValue()));
                }
                default -> fail("%s: unknown op %s", where(), op);
            }
        }

        private JsonNode faultWithKeys(JsonNode op) {
            var m = new ObjectMapper();
            var out = m.createObjectNode();
            if (op.has("fail")) {
                out.put("fail", op.get("fail").textValue());
            }
            var shortRead = out.putArray("shortRead");
            op.path("shortRead").forEach(l -> shortRead.add(key(l.textValue())));
            var puts = out.putObject("putStatus");
            op.path("putStatus").properties().forEach(e -> puts.put(key(e.getKey()), e.getValue().textValue()));
            return out;
        }

        private List<String> keys(JsonNode labels) {
            List<String> out = new ArrayList<>();
            labels.forEach(l -> out.add(key(l.textValue())));
            return out;
        }

        private List<String> pairs(JsonNode expected) {
            List<String> out = new ArrayList<>();
            expected.forEach(p -> out.add(key(p.get(0).textValue()) + " -> block " + p.get(1).intValue()));
            return out;
        }

        private static List<String> loadPairs(List<ConnectorMeta.Load> loads) {
            return loads.stream().map(l -> l.key() + " -> block " + l.blockId()).toList();
        }

        private void checkReset(ResetResult r, JsonNode expect) {
            assertThat(r.success()).as("%s: reset succeeded (%s)", where(), r.message())
                    .isEqualTo(expect.get("success").booleanValue());
            if (expect.has("removed")) {
                assertThat(r.removed()).as("%s: objects removed", where()).isEqualTo(expect.get("removed").longValue());
            }
        }

        private void step(JsonNode op, JsonNode expect) {
            List<ScheduledRequest> scheduled = new ArrayList<>();
            ConnectorMeta[] built = new ConnectorMeta[1];
            if (refused(expect, () -> {
                for (JsonNode s : op.get("scheduled")) {
                    scheduled.add(new ScheduledRequest(request(s.get("req").textValue(), s.path("numTokens").asInt(-1)),
                            ints(s.get("blocks")), s.get("before").intValue(), s.get("after").intValue()));
                }
                built[0] = c.buildConnectorMeta(scheduled);
            })) {
                return;
            }
            ConnectorMeta meta = built[0];
            if (expect.has("loads")) {
                assertThat(loadPairs(meta.loads())).as("%s: loads", where()).isEqualTo(pairs(expect.get("loads")));
            }
            if (expect.has("voidLoads")) {
                assertThat(loadPairs(meta.voidLoads())).as("%s: void loads", where()).isEqualTo(pairs(expect.get("voidLoads")));
            }
            if (expect.has("saves")) {
                assertThat(meta.saves().stream().map(s -> s.key() + " -> block " + s.blockId()).toList())
                        .as("%s: saves", where()).isEqualTo(pairs(expect.get("saves")));
            }
            if (op.has("resetAfterPlanning")) {
                checkReset(c.resetCache(), op.get("resetAfterPlanning"));
            }
            for (List<ConnectorMeta.Load> list : List.of(meta.loads(), meta.voidLoads())) {
                for (ConnectorMeta.Load l : list) {
                    kv.block(l.blockId()).fill((byte) 0xEE); // what the block held before: never mistaken for a load
                }
            }
            c.startLoadKv(meta, kv);
            for (int layer = 0; layer < kv.numLayers(); layer++) {
                c.waitForLayerLoad(layer);
                if (layer == 0) {
                    compute(scheduled);
                }
            }
            for (int layer = 0; layer < kv.numLayers(); layer++) {
                c.saveKvLayer(layer, kv);
            }
            Set<Integer> errors = c.blockIdsWithLoadErrors();
            if (expect.has("loadErrors")) {
                Set<Integer> want = new HashSet<>();
                expect.get("loadErrors").forEach(b -> want.add(b.intValue()));
                assertThat(errors).as("%s: load errors", where()).isEqualTo(want);
            }
            if (!op.path("noWait").booleanValue()) {
                c.waitForSave();
            }
            for (ConnectorMeta.Load l : meta.loads()) {
                if (!errors.contains(l.blockId())) {
                    assertThat(kv.block(l.blockId()).toArray(ValueLayout.JAVA_BYTE))
                            .as("%s: block %d holds what was saved under %s", where(), l.blockId(), l.key())
                            .isEqualTo(content(l.key()));
                }
            }
        }

        /** The forward pass: every block the step computes gets its key's bytes (a partial block zeros). */
        private void compute(List<ScheduledRequest> scheduled) {
            int bs = hasher.blockSize();
            for (ScheduledRequest s : scheduled) {
                ConnectorRequest r = s.request();
                List<BlockHash> h = hasher.hashes(r.tokens(), s.computedAfter(), r::extraKeysFor);
                for (int b = s.computedBefore() / bs; b * bs < s.computedAfter() && b < s.blockIds().length; b++) {
                    MemorySegment dst = kv.block(s.blockIds()[b]);
                    if (b < h.size()) {
                        MemorySegment.copy(MemorySegment.ofArray(content(keys.keyString(h.get(b)))), 0, dst, 0,
                                kv.blockBytes());
                    } else {
                        dst.fill((byte) 0);
                    }
                }
            }
        }

        private static Map<String, Long> stats(ConnectorStats s) {
            Map<String, Long> out = new HashMap<>();
            for (RecordComponent rc : ConnectorStats.class.getRecordComponents()) {
                try {
                    out.put(rc.getName(), (Long) rc.getAccessor().invoke(s));
                } catch (ReflectiveOperationException e) {
                    throw new IllegalStateException(e);
                }
            }
            return out;
        }
    }
}

package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.OptionalLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Every client operation against a real master and two nodes. */
class ClientApiIT {

    private static InProcessCluster cluster;
    private static KvPoolClient client;

    @BeforeAll
    static void start() throws Exception {
        cluster = new InProcessCluster(2, Size.ofMiB(160));
        client = cluster.client();
    }

    @AfterAll
    static void stop() {
        client.close();
        cluster.close();
    }

    @BeforeEach
    void empty() {
        client.removeAll(true);
    }

    @Test
    void putGetRoundTripAndAlreadyExists() {
        byte[] v = Payloads.make("a", 1, 1000);
        assertThat(client.put("a", v)).isEqualTo(PutStatus.OK);
        assertThat(client.put("a", Payloads.make("a", 2, 1000))).isEqualTo(PutStatus.ALREADY_EXISTS);
        assertThat(client.get("a")).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
        assertThat(client.get("missing")).isEmpty();
        assertThat(client.size("a")).isEqualTo(OptionalLong.of(1000));
        assertThat(client.size("missing")).isEmpty();
    }

    @Test
    void upsertReplaces() {
        assertThat(client.put("u", Payloads.make("u", 1, 500))).isEqualTo(PutStatus.OK);
        assertThat(client.upsert("u", Payloads.make("u", 2, 700))).isEqualTo(PutStatus.OK);
        byte[] got = client.get("u").orElseThrow();
        assertThat(Payloads.decode(got)).isEqualTo(new Payloads.Decoded("u", 2, true));
        assertThat(client.stats().keys()).isEqualTo(1);
    }

    @Test
    void emptyAndLargeValues() {
        assertThat(client.put("empty", new byte[0])).isEqualTo(PutStatus.OK);
        assertThat(client.get("empty")).hasValueSatisfying(b -> assertThat(b).isEmpty());
        byte[] big = Payloads.make("big", 1, 64 << 20);
        assertThat(client.put("big", big)).isEqualTo(PutStatus.OK);
        assertThat(Payloads.decode(client.get("big").orElseThrow())).isEqualTo(new Payloads.Decoded("big", 1, true));
    }

    @Test
    void getIntoWritesStraightIntoTheCallersMemory() {
        byte[] v = Payloads.make("into", 3, 300_000);
        assertThat(client.put("into", v)).isEqualTo(PutStatus.OK);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment dst = arena.allocate(400_000);
            assertThat(client.getInto("into", dst)).isEqualTo(v.length);
            assertThat(dst.asSlice(0, v.length).toArray(ValueLayout.JAVA_BYTE)).isEqualTo(v);
            assertThat(client.getInto("nope", dst)).isEqualTo(KvPoolClient.MISS);
            MemorySegment small = arena.allocate(1000);
            assertThatThrownBy(() -> client.getInto("into", small))
                    .isInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("into").hasMessageContaining("300000");
        }
    }

    @Test
    void batchFormsMixHitsAndMisses() {
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < 50; i++) {
            String k = "batch/" + i;
            keys.add(k);
            values.add(MemorySegment.ofArray(Payloads.make(k, 1, 1000 + i * 997)));
        }
        assertThat(client.putBatch(keys, values)).containsOnly(PutStatus.OK).hasSize(50);
        assertThat(client.putBatch(keys.subList(0, 2), values.subList(0, 2))).containsOnly(PutStatus.ALREADY_EXISTS);

        List<String> ask = new ArrayList<>(keys);
        ask.add(3, "batch/missing");
        List<Optional<byte[]>> got = client.getBatch(ask);
        assertThat(got.get(3)).isEmpty();
        for (int i = 0; i < ask.size(); i++) {
            if (i == 3) {
                continue;
            }
            String k = ask.get(i);
            assertThat(Payloads.decode(got.get(i).orElseThrow())).as(k).isEqualTo(new Payloads.Decoded(k, 1, true));
        }
        boolean[] present = client.batchExists(ask);
        assertThat(present[3]).isFalse();
        assertThat(present[0]).isTrue();
        assertThat(present[50]).isTrue();
        assertThat(client.prefixMatch(ask)).isEqualTo(3);
        assertThat(client.prefixMatch(keys)).isEqualTo(50);

        try (Arena arena = Arena.ofConfined()) {
            List<MemorySegment> dsts = new ArrayList<>();
            for (int i = 0; i < ask.size(); i++) {
                dsts.add(arena.allocate(60_000));
            }
            long[] lens = client.getIntoBatch(ask, dsts);
            assertThat(lens[3]).isEqualTo(KvPoolClient.MISS);
            assertThat(lens[0]).isEqualTo(1000);
            assertThat(Payloads.decode(dsts.get(10).asSlice(0, lens[10]))).isEqualTo(new Payloads.Decoded(keys.get(9), 1, true));
        }
        assertThat(client.removeBatch(List.of("batch/0", "batch/1", "batch/missing"))).isEqualTo(2);
        assertThat(client.prefixMatch(keys)).isZero();
    }

    @Test
    void removalForms() {
        for (String k : List.of("m1/a", "m1/b", "m2/a")) {
            assertThat(client.put(k, Payloads.make(k, 1, 100))).isEqualTo(PutStatus.OK);
        }
        assertThat(client.remove("m2/a")).isTrue();
        assertThat(client.remove("m2/a")).isFalse();
        assertThat(client.removeByPrefix("m1/")).isEqualTo(2);
        assertThat(client.stats().keys()).isZero();
        assertThat(client.put("x", new byte[10])).isEqualTo(PutStatus.OK);
        long epoch = client.stats().epoch();
        assertThat(client.removeAll(false)).isEqualTo(1);
        assertThat(client.stats().epoch()).as("removeAll(false) keeps the epoch").isEqualTo(epoch);
        assertThat(client.put("x", new byte[10])).isEqualTo(PutStatus.OK);
        assertThat(client.removeAll(true)).isEqualTo(1);
        assertThat(client.stats().epoch()).isEqualTo(epoch + 1);
        assertThat(client.get("x")).isEmpty();
        assertThatThrownBy(() -> client.removeByPrefix("")).isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    @SuppressWarnings("restricted")
    void badInputIsAnExceptionNamingIt() {
        String longKey = "k".repeat(513);
        assertThatThrownBy(() -> client.put(longKey, new byte[1]))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("513").hasMessageContaining("512");
        assertThatThrownBy(() -> client.get(longKey)).isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> client.exists("")).isInstanceOf(IllegalArgumentException.class);
        String multibyte = "é".repeat(257); // 514 UTF-8 bytes, 257 chars
        assertThatThrownBy(() -> client.put(multibyte, new byte[1])).hasMessageContaining("514");
        assertThat(client.put("k".repeat(512), new byte[1])).isEqualTo(PutStatus.OK);
        // a view that is never touched: the size check happens before any byte moves
        MemorySegment huge = MemorySegment.NULL.reinterpret(client.maxValueBytes() + 1);
        assertThatThrownBy(() -> client.put("too-big", huge))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("too-big");
        assertThatThrownBy(() -> client.putBatch(List.of("a", "b"), List.of(MemorySegment.ofArray(new byte[1]))))
                .isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    void valueLargerThanAnySegmentIsPoolFullNotAnError() {
        // 200 MiB fits the value limit (256 MiB) but no 160 MiB segment
        MemorySegment big = Arena.global().allocate(200L << 20);
        assertThat(client.put("huge", big)).isEqualTo(PutStatus.POOL_FULL);
        assertThat(client.exists("huge")).isFalse();
    }

    @Test
    void placementPrefersTheNamedSegment() {
        PoolStats s = client.stats();
        assertThat(s.segments()).hasSize(2);
        String second = s.segments().get(1).name();
        for (int i = 0; i < 10; i++) {
            assertThat(client.put("pref/" + i, new byte[100], PutOptions.preferring(second))).isEqualTo(PutStatus.OK);
        }
        PoolStats after = client.stats();
        assertThat(after.segments().get(1).objects()).isEqualTo(10);
        assertThat(after.segments().get(0).objects()).isZero();
        // both nodes are on this host, so the client detects a local segment on its own
        assertThat(client.preferredSegment()).isIn(s.segments().get(0).name(), second);
        try (KvPoolClient other = cluster.client(c -> c.withPreferredSegment(s.segments().get(0).name()))) {
            assertThat(other.preferredSegment()).isEqualTo(s.segments().get(0).name());
            assertThat(other.put("pref/x", new byte[100])).isEqualTo(PutStatus.OK);
        }
        assertThat(client.stats().segments().get(0).objects()).isEqualTo(1);
    }

    @Test
    void replicasLandOnDistinctNodesAndSurviveLosingOne() throws Exception {
        try (InProcessCluster three = new InProcessCluster(3, Size.ofMiB(16));
             KvPoolClient c = three.client(cfg -> cfg.withReplicas(2).withAutoDetectLocal(false))) {
            byte[] v = Payloads.make("r", 1, 50_000);
            assertThat(c.put("r", v)).isEqualTo(PutStatus.OK);
            long holders = c.stats().segments().stream().filter(x -> x.objects() == 1).count();
            assertThat(holders).isEqualTo(2);
            // stop one holder: reads fall back to the other replica
            var victim = three.nodes.stream().filter(n -> n.objectCount() == 1).findFirst().orElseThrow();
            victim.close();
            assertThat(c.get("r")).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
        }
    }

    @Test
    void statsDescribeTheCluster() {
        assertThat(client.put("s", new byte[1000])).isEqualTo(PutStatus.OK);
        PoolStats s = client.stats();
        assertThat(s.keys()).isEqualTo(1);
        assertThat(s.capacityBytes()).isEqualTo(2 * (160L << 20));
        assertThat(s.allocatedBytes()).isGreaterThanOrEqualTo(1000);
        assertThat(s.activeClients()).isGreaterThanOrEqualTo(1);
        assertThat(s.segments()).allSatisfy(seg -> assertThat(seg.active()).isTrue());
        assertThat(Arrays.asList(s.segments().get(0).name().split(":"))).hasSize(2);
    }
}

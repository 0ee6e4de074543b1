package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.protocol.Opcode;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Repeated reads skip the master by remembering where objects are; what another client changes in
 * the meantime must still be seen: a replaced object reads as its new version, a removed one as a
 * miss, and nothing survives a removeAll. Run over TCP and over the same-machine path.
 */
class LocationCacheIT {

    @ParameterizedTest(name = "shared memory: {0}")
    @ValueSource(booleans = {false, true})
    void rememberedLocationsNeverServeWhatOthersReplacedOrRemoved(boolean sharedMemory) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(32));
             KvPoolClient reader = cluster.client(c -> c.withSharedMemory(sharedMemory));
             KvPoolClient writer = cluster.client(c -> c.withSharedMemory(sharedMemory))) {
            for (String k : List.of("lc/a", "lc/b", "lc/c")) {
                assertThat(writer.put(k, Payloads.make(k, 1, 50_000))).isEqualTo(PutStatus.OK);
            }
            assertThat(reader.getBatch(List.of("lc/a", "lc/b", "lc/c"))).allSatisfy(v -> assertThat(v).isPresent());

            // now remembered: more reads do not ask the master
            long lookups = masterLookups(cluster);
            for (int i = 0; i < 20; i++) {
                assertThat(Payloads.decode(reader.get("lc/a").orElseThrow())).isEqualTo(new Payloads.Decoded("lc/a", 1, true));
            }
            assertThat(masterLookups(cluster)).isEqualTo(lookups);

            // another client replaces lc/a, removes lc/b: the reader sees exactly that
            assertThat(writer.upsert("lc/a", Payloads.make("lc/a", 2, 70_000))).isEqualTo(PutStatus.OK);
            assertThat(writer.remove("lc/b")).isTrue();
            assertThat(Payloads.decode(reader.get("lc/a").orElseThrow())).isEqualTo(new Payloads.Decoded("lc/a", 2, true));
            assertThat(reader.get("lc/b")).isEmpty();
            assertThat(Payloads.decode(reader.get("lc/c").orElseThrow())).isEqualTo(new Payloads.Decoded("lc/c", 1, true));

            // a reset by another client leaves nothing to read
            writer.removeAll(true);
            assertThat(reader.getBatch(List.of("lc/a", "lc/c"))).allSatisfy(v -> assertThat(v).isEmpty());

            // a key put again after it was removed reads as the new object
            assertThat(writer.put("lc/c", Payloads.make("lc/c", 3, 10_000))).isEqualTo(PutStatus.OK);
            assertThat(Payloads.decode(reader.get("lc/c").orElseThrow())).isEqualTo(new Payloads.Decoded("lc/c", 3, true));
        }
    }

    private static long masterLookups(InProcessCluster cluster) {
        return cluster.master.requests(Opcode.GET_REPLICA_LIST) + cluster.master.requests(Opcode.BATCH_GET_REPLICA_LIST);
    }
}

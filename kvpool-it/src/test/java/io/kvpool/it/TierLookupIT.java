package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.protocol.TierCounts;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * TIER_LOOKUP end to end: a prompt's block keys, some in memory and some spilled to the SSD tier, counted by the
 * client and by the master's HTTP endpoint alike; an absent key ends the prefix; asking reads nothing from the nodes
 * (nothing moves back to memory however often a router asks, with promotion after one disk read).
 */
class TierLookupIT {

    private static final int VALUE = 256 << 10;

    @Test
    void theClientAndTheHttpEndpointCountEachTier(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(8), m -> m,
                n -> n.withDisk(disk, Size.ofMiB(128)).withPromoteAfter(1));
             KvPoolClient c = cluster.client(cfg -> cfg)) {
            List<String> keys = new ArrayList<>();
            for (int i = 0; i < 64; i++) { // 16 MiB into 8 MiB of memory: the oldest spill
                String k = "tiers/" + i;
                assertThat(c.put(k, Payloads.make(k, 1, VALUE))).as(k).isEqualTo(PutStatus.OK);
                keys.add(k);
            }
            Await.tiersSettled(c, keys.size()); // and nothing is read, so nothing is promoted
            TierCounts t = c.tierLookup(keys);
            assertThat(t.keys()).isEqualTo(64);
            assertThat(t.prefixBlocks()).isEqualTo(64);
            assertThat(t.storageBlocks()).as("the oldest spilled").isPositive();
            assertThat(t.memoryBlocks()).as("the newest are in memory").isPositive();
            assertThat(t.memoryBlocks() + t.storageBlocks()).isEqualTo(64);
            for (int i = 0; i < 5; i++) {
                assertThat(c.tierLookup(keys)).as("asking moves nothing (promote after one read)").isEqualTo(t);
            }

            List<String> gap = new ArrayList<>(keys.subList(0, 10));
            gap.add("tiers/absent");
            gap.addAll(keys.subList(10, 64));
            TierCounts g = c.tierLookup(gap);
            assertThat(g.prefixBlocks()).isEqualTo(10);
            assertThat(g.keys()).isEqualTo(65);

            HttpClient http = HttpClient.newHttpClient();
            String base = "http://127.0.0.1:" + cluster.master.httpPort() + "/api/tiers";
            HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(base + "?block_size=32"))
                    .POST(HttpRequest.BodyPublishers.ofString(String.join("\n", keys) + "\n")).build(),
                    HttpResponse.BodyHandlers.ofString());
            assertThat(r.statusCode()).isEqualTo(200);
            assertThat(r.body().strip()).isEqualTo(t.toJson(32));
            assertThat(r.body()).contains("\"tokens\":{\"prefix\":2048,");

            HttpResponse<String> get = http.send(HttpRequest.newBuilder(URI.create(base)).GET().build(),
                    HttpResponse.BodyHandlers.ofString());
            assertThat(get.statusCode()).isEqualTo(405);
            HttpResponse<String> bad = http.send(HttpRequest.newBuilder(URI.create(base + "?block_size=0"))
                    .POST(HttpRequest.BodyPublishers.ofString("tiers/0")).build(), HttpResponse.BodyHandlers.ofString());
            assertThat(bad.statusCode()).isEqualTo(400);
            assertThat(bad.body()).contains("block_size must be a whole number from 1 to 1048576, got '0'");
            HttpResponse<String> longKey = http.send(HttpRequest.newBuilder(URI.create(base))
                    .POST(HttpRequest.BodyPublishers.ofString("x".repeat(600))).build(), HttpResponse.BodyHandlers.ofString());
            assertThat(longKey.statusCode()).isEqualTo(400);
            assertThat(longKey.body()).contains("512");
        }
    }
}

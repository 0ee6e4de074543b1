package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The scale section's simulated nodes ({@link ScaleNodes}) against a real master in this JVM: they register and
 * take puts, the master's frees reach them, nodes fallen silent are dropped and come back under their names. What
 * the scale bench measures is only as good as these nodes behave like real ones on the wire.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class ScaleNodesTest {

    private static final int NODES = 20;

    private static void await(String what, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (!done.getAsBoolean()) {
            assertThat(System.nanoTime()).as(what).isLessThan(deadline);
            Thread.sleep(10);
        }
    }

    private static Set<String> activeNames(MasterServer m) {
        return m.service().segmentInfos().stream().filter(s -> s.state() == SegmentInfo.STATE_ACTIVE)
                .map(SegmentInfo::name).collect(Collectors.toSet());
    }

    @Test
    void simulatedNodesTakePutsAndFreesFallSilentAndComeBack() throws Exception {
        MasterConfig cfg = MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withNodeTtl(Duration.ofSeconds(2))
                .withSummaryInterval(Duration.ZERO);
        try (MasterServer m = new MasterServer(cfg);
             ScaleNodes nodes = new ScaleNodes(() -> new HostPort("127.0.0.1", m.port()), NODES, 1 << 20,
                     Duration.ofMillis(100))) {
            await("every simulated node active", () -> activeNames(m).size() == NODES);
            Set<String> all = activeNames(m);

            try (FrameConnection c = FrameConnection.connect(new HostPort("127.0.0.1", m.port()), Duration.ofSeconds(5),
                    Limits.DEFAULT)) {
                MetadataBench.putBatch(c, 0, 64);
            }
            assertThat(m.service().keyCount()).isEqualTo(64);
            assertThat(m.service().segmentInfos().stream().filter(s -> s.objects() > 0).count())
                    .as("placed over several nodes").isGreaterThan(1);
            try (KvPoolClient client = KvPoolClient.connect("127.0.0.1:" + m.port())) {
                for (int i = 0; i < 64; i++) {
                    assertThat(client.remove(new String(MetadataBench.key(i), StandardCharsets.US_ASCII))).isTrue();
                }
            }
            await("the master's frees of the 64 regions at the nodes", () -> nodes.freed() == 64);
            assertThat(nodes.heartbeats()).isPositive();

            List<String> silent = nodes.silence(2);
            await("the two silent nodes dropped", () -> activeNames(m).stream().noneMatch(silent::contains));
            long registered = nodes.registrations();
            nodes.rejoin(2);
            await("the two nodes back under their names", () -> activeNames(m).equals(all)
                    && nodes.registrations() >= registered + 2);
            nodes.check();
        }
    }
}

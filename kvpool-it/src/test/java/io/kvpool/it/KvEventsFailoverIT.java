package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.master.events.EventBatchReader;
import org.junit.jupiter.api.Test;
import org.zeromq.ZContext;

import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * KV events across a failover of elected masters (real etcd, masters and a node as processes): the new
 * leader's stream starts at its term << 32, above every number the old leader sent, and announces what
 * it rebuilt from the node's inventory, which a subscriber that missed the start replays from there.
 */
class KvEventsFailoverIT {

    private static final int OBJECTS = 8;

    private static String[] events(int pub, int replay) {
        return new String[]{"--kv-events-endpoint", "tcp://127.0.0.1:" + pub, "--kv-events-replay-endpoint",
                "tcp://127.0.0.1:" + replay};
    }

    /** Block hashes stored in CPU, by the batches of a replay. */
    private static Set<Long> storedInCpu(List<Map.Entry<Long, byte[]>> batches) {
        Set<Long> out = new HashSet<>();
        for (Map.Entry<Long, byte[]> b : batches) {
            for (EventBatchReader.Event e : EventBatchReader.read(b.getValue()).events()) {
                if (e.type().equals("BlockStored") && "CPU".equals(e.medium())) {
                    out.addAll(e.blockHashes());
                }
            }
        }
        return out;
    }

    @Test
    void aNewLeaderNumbersItsStreamAboveTheOldOneAndAnnouncesWhatItRebuilt() throws Exception {
        int[] ports = {ProcessCluster.freePort(), ProcessCluster.freePort(), ProcessCluster.freePort(),
                ProcessCluster.freePort()};
        try (HaCluster ha = new HaCluster("kv-events-failover", 0); ZContext ctx = new ZContext()) {
            ha.startMaster("m1", events(ports[0], ports[1]));
            LeaderRecord first = ha.awaitLeader(LeaderRecord::ready, "the first leader");
            ha.startMaster("m2", events(ports[2], ports[3]));
            ha.startNode("64MiB");
            Set<Long> hashes = new HashSet<>();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url))) {
                ProcessCluster.awaitActive(c, 1, "the node registered");
                for (long i = 1; i <= OBJECTS; i++) {
                    assertThat(c.put(KvEventsIT.key(i), new byte[4096])).isEqualTo(PutStatus.OK);
                    hashes.add(i);
                }
                ha.awaitNodesListed(1);
            }
            List<Map.Entry<Long, byte[]>> old = KvEventsIT.replay(ctx, "tcp://127.0.0.1:" + ports[1], 0);
            assertThat(old.getFirst().getKey()).as("the first leadership's stream").isEqualTo(first.term() << 32);
            assertThat(storedInCpu(old)).containsAll(hashes);
            long oldLast = old.getLast().getKey();

            ha.master(first.id()).kill9();
            LeaderRecord next = ha.awaitLeader(r -> r.ready() && r.term() > first.term(), "a new leader");
            assertThat(next.id()).isEqualTo("m2");
            String replay = "tcp://127.0.0.1:" + ports[3];
            Await.until("the new leader announced every object it rebuilt",
                    () -> storedInCpu(KvEventsIT.replay(ctx, replay, 0)).containsAll(hashes));
            List<Map.Entry<Long, byte[]>> fresh = KvEventsIT.replay(ctx, replay, next.term() << 32);
            assertThat(fresh.getFirst().getKey()).as("the new stream starts at the new term << 32")
                    .isEqualTo(next.term() << 32).isGreaterThan(oldLast);
        }
    }
}

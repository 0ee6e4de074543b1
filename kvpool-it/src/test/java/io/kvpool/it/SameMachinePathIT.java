package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The same-machine path: with the node's segment in shared memory, a client on the same host moves
 * bytes with memory copies (the node serves no read traffic); where the segment cannot be mapped,
 * the client falls back to TCP by itself.
 */
class SameMachinePathIT {

    private static void roundTrip(KvPoolClient c, String prefix) {
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            keys.add(prefix + i);
            values.add(MemorySegment.ofArray(Payloads.make(prefix + i, 1, 10_000 + i * 4099)));
        }
        assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
        assertThat(c.put(prefix + "single", Payloads.make(prefix + "single", 1, 70_000))).isEqualTo(PutStatus.OK);
        var got = c.getBatch(keys);
        for (int i = 0; i < keys.size(); i++) {
            assertThat(got.get(i)).as(keys.get(i)).hasValue(values.get(i).toArray(ValueLayout.JAVA_BYTE));
        }
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment dst = arena.allocate(100_000);
            assertThat(c.getInto(prefix + "single", dst)).isEqualTo(70_000);
            assertThat(Payloads.decode(dst.asSlice(0, 70_000))).isEqualTo(new Payloads.Decoded(prefix + "single", 1, true));
        }
        assertThat(c.upsert(prefix + "single", Payloads.make(prefix + "single", 2, 30_000))).isEqualTo(PutStatus.OK);
        assertThat(Payloads.decode(c.get(prefix + "single").orElseThrow()).version()).isEqualTo(2);
    }

    @Test
    void sharedSegmentIsReadWithoutTheNode() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            assertThat(node.shmPath()).isNotEmpty();
            roundTrip(c, "shm/");
            assertThat(node.bytesRead()).as("reads bypass the node").isZero();
            assertThat(node.bytesWritten()).as("writes are completed through the node").isPositive();
        }
    }

    @Test
    void tcpWhenSharedMemoryIsOff() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(false))) {
            roundTrip(c, "tcp/");
            assertThat(cluster.nodes.getFirst().bytesRead()).isPositive();
        }
    }

    @Test
    void fallsBackToTcpWhenTheSegmentCannotBeMapped() throws Exception {
        // anonymous memory: nothing to map, so the client must use TCP by itself
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32), m -> m, n -> n.withShmDir(null));
             KvPoolClient c = cluster.client()) {
            assertThat(cluster.nodes.getFirst().shmPath()).isEmpty();
            roundTrip(c, "anon/");
            assertThat(cluster.nodes.getFirst().bytesRead()).isPositive();
        }
    }
}

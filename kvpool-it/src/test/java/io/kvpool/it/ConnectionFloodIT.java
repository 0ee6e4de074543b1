package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.protocol.FrameHeader;
import io.kvpool.protocol.Opcode;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A master process under a connection flood from other addresses of this machine: 500 connections
 * that never speak, 500 that send half a header and stop, and 48 whose header announces a 64 MiB
 * body of which 1 KiB follows (before limits were enforced, the last alone made a 256 MiB master
 * allocate 3 GiB and fail with OutOfMemoryError; now the first of them reserves the whole 64 MiB body
 * budget and the others wait their turn and are refused naming it). While they are open an ordinary
 * client puts and reads byte-exact; the master's resident memory is measured; then every one of them
 * is closed, at the frame timeout or refused for the budget, and the master's connections come back
 * to what its real peers hold.
 */
@Timeout(180)
class ConnectionFloodIT {

    private static long rssKiB(long pid) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc", "" + pid, "status"))) {
            if (line.startsWith("VmRSS:")) {
                return Long.parseLong(line.replaceAll("\\D", ""));
            }
        }
        throw new IOException("no VmRSS for " + pid);
    }

    private static SocketChannel from(String local, int port) throws IOException {
        SocketChannel ch = SocketChannel.open();
        ch.bind(new InetSocketAddress(local, 0));
        ch.connect(new InetSocketAddress("127.0.0.1", port));
        return ch;
    }

    private static void putAndRead(KvPoolClient c, String prefix) {
        for (int i = 0; i < 100; i++) {
            byte[] v = Payloads.make(prefix + i, i, 4096 + i);
            assertThat(c.put(prefix + i, v)).isEqualTo(PutStatus.OK);
        }
        for (int i = 0; i < 100; i++) {
            byte[] want = Payloads.make(prefix + i, i, 4096 + i);
            assertThat(c.get(prefix + i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(want));
        }
    }

    @Test
    void idleHalfOpenAndHugeBodyConnectionsNeitherExhaustTheMasterNorDisturbOthers() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("ConnectionFloodIT")) {
            cluster.startNode("64MiB");
            List<SocketChannel> hostile = new ArrayList<>();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withSharedMemory(false))) {
                ProcessCluster.awaitStats(c, s -> s.segments().stream().anyMatch(PoolStats.SegmentStats::active),
                        "the node registered");
                putAndRead(c, "before/");
                double base = cluster.metric("master_connections_open");
                long rssBefore = rssKiB(cluster.masterPid());
                for (int i = 0; i < 500; i++) {
                    hostile.add(from("127.0.0.2", cluster.masterPort));
                }
                for (int i = 0; i < 500; i++) {
                    SocketChannel ch = from("127.0.0.3", cluster.masterPort);
                    ch.write(ByteBuffer.wrap(new byte[]{0x4B, 0x50, FrameHeader.VERSION, 0x01}));
                    hostile.add(ch);
                }
                for (int i = 0; i < 48; i++) {
                    SocketChannel ch = from("127.0.0.4", cluster.masterPort);
                    ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), Opcode.BATCH_EXIST_KEY.code, false, 0, 1,
                            (64 << 20) - 64, 0);
                    ch.write(h);
                    ch.write(ByteBuffer.allocate(1024));
                    hostile.add(ch);
                }
                Await.untilChecked("the master counts the " + hostile.size() + " hostile connections open",
                        Await.DEFAULT, () -> cluster.metric("master_connections_open") >= base + hostile.size());
                // everyone else is served while the flood holds its connections
                putAndRead(c, "during/");
                long rssDuring = rssKiB(cluster.masterPid());
                double heap = cluster.metric("jvm_memory_used_bytes{area=\"heap\"}");
                System.out.printf("ConnectionFloodIT: master RSS %,d KiB before, %,d KiB with %d hostile connections"
                                + " open (+%,d KiB, %.1f KiB each); heap in use %.0f MiB%n", rssBefore, rssDuring,
                        hostile.size(), rssDuring - rssBefore, (rssDuring - rssBefore) / (double) hostile.size(),
                        heap / (1 << 20));
                // 48 announced 64 MiB bodies would be 3 GiB; what the master holds stays far below its 256 MiB heap
                assertThat(heap).isLessThan(200.0 * (1 << 20));
                assertThat(rssDuring - rssBefore).as("resident growth, KiB").isLessThan(512L << 10);
                // the bodies in flight come out of the process's budget: an eighth of 256 MiB, raised to the 64 MiB floor
                assertThat(cluster.metric("master_body_budget_bytes")).isEqualTo(64 << 20);
                // every one of them is closed: the silent and half-header ones at the frame timeout, and of the
                // 48 huge bodies the first (holding the whole budget, its body never sent) at the frame timeout
                // too, the others refused for the budget when their turn did not come in half of it
                Await.untilChecked("all " + hostile.size() + " hostile connections were closed", Duration.ofSeconds(120),
                        () -> cluster.metric("master_frames_timed_out_total")
                                + cluster.metric("master_large_bodies_refused_total") >= hostile.size());
                assertThat(cluster.metric("master_large_bodies_refused_total")).isEqualTo(47);
                // all 1,048 are gone; the client itself may have opened another pooled connection meanwhile
                assertThat(cluster.metric("master_connections_open")).isLessThanOrEqualTo(base + 4);
                putAndRead(c, "after/");
            } finally {
                for (SocketChannel ch : hostile) {
                    ch.close();
                }
            }
        }
    }
}

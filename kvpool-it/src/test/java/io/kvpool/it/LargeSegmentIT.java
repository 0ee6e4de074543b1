package io.kvpool.it;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * A segment larger than 2 GiB: objects far past the 2 GiB mark are written and read back through the
 * node's ordinary data path. The segment is a sparse file in /dev/shm, so only the pages touched
 * cost memory.
 */
class LargeSegmentIT {

    @Test
    void objectsBeyondTwoGiBRoundTrip() throws Exception {
        Path shm = Path.of("/dev/shm");
        assumeTrue(Files.isDirectory(shm) && Files.getFileStore(shm).getUsableSpace() > (6L << 30),
                "needs /dev/shm with room for a sparse 6 GiB file");
        // a master only to register with: a node takes writes only once registered; the writes below go
        // straight to the node, at offsets of this test's choosing, which nothing else is placed on
        try (MasterServer master = new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", 0, 0)
                .withSummaryInterval(Duration.ZERO));
             StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", master.port()),
                     Size.ofGiB(6)).withListen("127.0.0.1", 0));
             FrameConnection c = FrameConnection.connect(new HostPort("127.0.0.1", node.port()), Duration.ofSeconds(5),
                     Limits.DEFAULT)) {
            assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
            assertThat(node.capacity()).isEqualTo(6L << 30);
            long[] offsets = {(2L << 30) - 64, 3L << 30, (6L << 30) - (1 << 20)};
            for (int i = 0; i < offsets.length; i++) {
                String key = "big/" + i;
                byte[] value = Payloads.make(key, 1, 200_000 + i);
                long offset = offsets[i];
                if (offset + ObjectLayout.regionLength(key.length(), value.length) > node.capacity()) {
                    offset = node.capacity() - ObjectLayout.regionLength(key.length(), value.length);
                    offset &= -ObjectLayout.ALIGNMENT;
                }
                BodyWriter w = new BodyWriter();
                new NodeMessages.Write(0, 0, List.of(new NodeMessages.WriteItem(offset, 100 + i, key.getBytes(), value.length,
                        ObjectLayout.valueCrc(MemorySegment.ofArray(value)), WriteGrant.none()))).write(w);
                assertThat(MasterMessages.Codes.read(c.call(Opcode.NODE_WRITE, w, Duration.ofSeconds(10),
                        ByteBuffer.wrap(value)).body()).codes()).containsExactly(ResultCode.OK);

                BodyWriter r = new BodyWriter();
                new NodeMessages.Read(List.of(new NodeMessages.ReadItem(offset, 100 + i, value.length))).write(r);
                assertThat(MasterMessages.Codes.read(c.call(Opcode.NODE_READ, r, Duration.ofSeconds(10)).body()).codes())
                        .containsExactly(ResultCode.OK);
                byte[] got = new byte[value.length];
                c.readPayload(MemorySegment.ofArray(got), Duration.ofSeconds(10));
                assertThat(got).as("object at offset " + offset).isEqualTo(value);
            }
            assertThat(node.objectCount()).isEqualTo(3);
        }
    }
}

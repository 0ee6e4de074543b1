package io.kvpool.it;

import io.kvpool.config.HostPort;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** Single frames to a master or a node, for tests that drive the protocol below the client. */
final class RawFrames {

    static final Duration T = Duration.ofSeconds(10);

    private RawFrames() {
    }

    /** What the master says about a key: its generation, length and first replica. */
    record Where(long generation, long length, Replica replica) {
    }

    /** The master's GET_REPLICA_LIST answer for a key that must be present. */
    static Where where(InProcessCluster cluster, String key) throws Exception {
        try (FrameConnection m = FrameConnection.connect(HostPort.parse(cluster.masterAddress()), T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new KeyList(List.of(key.getBytes(StandardCharsets.UTF_8))).write(w);
            MasterMessages.ReplicaList rl = MasterMessages.ReplicaListReply.read(
                    m.call(Opcode.GET_REPLICA_LIST, w, T).body()).items().getFirst();
            assertThat(rl.code()).isEqualTo(ResultCode.OK);
            return new Where(rl.generation(), rl.valueLength(), rl.replicas().getFirst());
        }
    }

    /** One NODE_READ item (offset, generation, length, tier) that must be answered OK; its value. */
    static byte[] read(StorageNode node, long offset, long generation, int length, Tier tier) throws Exception {
        try (FrameConnection c = FrameConnection.connect(HostPort.parse(node.name()), T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new NodeMessages.Read(List.of(new NodeMessages.ReadItem(offset, generation, length, tier))).write(w);
            FrameConnection.Reply r = c.call(Opcode.NODE_READ, w, T);
            assertThat(MasterMessages.Codes.read(r.body()).codes()).containsExactly(ResultCode.OK);
            byte[] out = new byte[length];
            c.readPayload(MemorySegment.ofArray(out), T);
            return out;
        }
    }
}

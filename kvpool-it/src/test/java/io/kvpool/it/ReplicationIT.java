package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * NODE_REPLICATE, the node-to-node copy the master's repair uses, driven frame by frame against real
 * nodes: a copy lands byte-exact under the object's generation; a copy the node no longer holds is
 * NOT_FOUND; an unreachable target is FAILED; the target fences a copy from before a reset; and a node
 * copies only for the master it registered with (its control token), whatever term a frame names.
 */
class ReplicationIT {

    private static final Duration T = RawFrames.T;

    private static HostPort address(StorageNode n) {
        return HostPort.parse(n.name());
    }

    private static List<ResultCode> replicate(StorageNode source, NodeMessages.Replicate frame) throws Exception {
        try (FrameConnection c = FrameConnection.connect(address(source), T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            frame.write(w);
            return MasterMessages.Codes.read(c.call(Opcode.NODE_REPLICATE, w, T).body()).codes();
        }
    }

    /** A one-item NODE_WRITE of a 100-byte value, as a writer that holds no grant on an open pool sends it. */
    private static ResultCode nodeWrite(StorageNode node, long epoch, long term, String key, long offset)
            throws Exception {
        byte[] value = new byte[100];
        try (FrameConnection c = FrameConnection.connect(address(node), T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new NodeMessages.Write(epoch, term, List.of(new NodeMessages.WriteItem(offset, 1L << 40,
                    key.getBytes(StandardCharsets.UTF_8), value.length,
                    ObjectLayout.valueCrc(MemorySegment.ofArray(value)), WriteGrant.none()))).write(w);
            return MasterMessages.Codes.read(c.call(Opcode.NODE_WRITE, w, T, ByteBuffer.wrap(value)).body()).codes()
                    .getFirst();
        }
    }

    private static byte[] read(StorageNode node, long offset, long generation, int length) throws Exception {
        return RawFrames.read(node, offset, generation, length, Tier.MEMORY);
    }

    @Test
    void aCopyLandsByteExactAndTheNodeChecksWhatItIsAskedToCopy() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(64));
             KvPoolClient c = cluster.client()) {
            StorageNode a = cluster.nodes.get(0);
            StorageNode b = cluster.nodes.get(1);
            byte[] value = Payloads.make("rep/a", 1, 10_000);
            assertThat(c.put("rep/a", value, PutOptions.preferring(a.name()))).isEqualTo(PutStatus.OK);
            RawFrames.Where w = RawFrames.where(cluster, "rep/a");
            byte[] key = "rep/a".getBytes(StandardCharsets.UTF_8);
            long epoch = c.stats().epoch();
            long target = b.capacity() / 2; // a region nobody uses: the master placed nothing on b yet
            NodeMessages.ReplicateItem item = new NodeMessages.ReplicateItem(key, w.generation(), w.length(), Tier.MEMORY,
                    w.replica().offset(), target);

            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", b.port(), List.of(item))))
                    .containsExactly(ResultCode.OK);
            assertThat(read(b, target, w.generation(), value.length)).isEqualTo(value);

            // a generation the node does not hold, and a key that is not the one stored there
            NodeMessages.ReplicateItem stale = new NodeMessages.ReplicateItem(key, w.generation() + 1, w.length(),
                    Tier.MEMORY, w.replica().offset(), target + (1 << 20));
            NodeMessages.ReplicateItem otherKey = new NodeMessages.ReplicateItem("rep/b".getBytes(StandardCharsets.UTF_8),
                    w.generation(), w.length(), Tier.MEMORY, w.replica().offset(), target + (2 << 20));
            // a disk copy the node has neither on disk nor (on its way there) at the offset named
            NodeMessages.ReplicateItem onDisk = new NodeMessages.ReplicateItem(key, w.generation(), w.length(), Tier.DISK,
                    w.replica().offset() + (4 << 20), target + (3 << 20));
            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", b.port(),
                    List.of(stale, otherKey, onDisk)))).containsExactly(ResultCode.NOT_FOUND, ResultCode.NOT_FOUND,
                    ResultCode.NOT_FOUND);
            // a disk copy on its way (the master lists a spill on disk with its memory offset at once): copied from there
            NodeMessages.ReplicateItem spilling = new NodeMessages.ReplicateItem(key, w.generation(), w.length(), Tier.DISK,
                    w.replica().offset(), target + (4 << 20));
            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", b.port(),
                    List.of(spilling)))).containsExactly(ResultCode.OK);
            assertThat(read(b, target + (4 << 20), w.generation(), value.length)).isEqualTo(value);

            // a target nobody listens on
            int closed = ProcessCluster.freePort();
            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", closed, List.of(item))))
                    .containsExactly(ResultCode.FAILED);

            // the target fences a copy of an epoch older than its own, as it fences a client's write
            c.removeAll(true);
            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", b.port(), List.of(item))))
                    .as("the source's copy went with the reset").containsExactly(ResultCode.NOT_FOUND);
            assertThat(c.put("rep/c", value, PutOptions.preferring(a.name()))).isEqualTo(PutStatus.OK);
            RawFrames.Where wc = RawFrames.where(cluster, "rep/c");
            assertThat(replicate(a, new NodeMessages.Replicate(epoch, 0, a.controlToken(), "127.0.0.1", b.port(), List.of(
                    new NodeMessages.ReplicateItem("rep/c".getBytes(StandardCharsets.UTF_8), wc.generation(), wc.length(),
                            Tier.MEMORY, wc.replica().offset(), target)))))
                    .as("a copy under the epoch before the reset").containsExactly(ResultCode.FENCED);
        }
    }

    @Test
    void aNodeCopiesOnlyForTheMasterItRegisteredWithAndNoFrameMovesItsTerm() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(64));
             KvPoolClient c = cluster.client()) {
            StorageNode a = cluster.nodes.get(0);
            StorageNode b = cluster.nodes.get(1);
            byte[] value = Payloads.make("rep/t", 1, 1000);
            assertThat(c.put("rep/t", value, PutOptions.preferring(a.name()))).isEqualTo(PutStatus.OK);
            RawFrames.Where w = RawFrames.where(cluster, "rep/t");
            PoolStats s = c.stats();
            NodeMessages.ReplicateItem item = new NodeMessages.ReplicateItem("rep/t".getBytes(StandardCharsets.UTF_8),
                    w.generation(), w.length(), Tier.MEMORY, w.replica().offset(), b.capacity() / 2);
            // anyone but a's master: another node's token, a guess, none
            for (ControlToken t : List.of(b.controlToken(), ControlToken.random(), ControlToken.NONE)) {
                assertThatThrownBy(() -> replicate(a, new NodeMessages.Replicate(s.epoch(), 0, t, "127.0.0.1",
                        b.port(), List.of(item)))).isInstanceOf(RemoteException.class)
                        .hasMessageContaining("only from the master it registered with");
            }
            // a's token with a term other than the one a registered under: only a registration moves a term
            assertThatThrownBy(() -> replicate(a, new NodeMessages.Replicate(s.epoch(), 7, a.controlToken(), "127.0.0.1",
                    b.port(), List.of(item)))).isInstanceOf(RemoteException.class).hasMessageContaining("term 7")
                    .hasMessageContaining("registered under term 0");
            assertThat(a.term()).isZero();
            assertThat(a.refusedAdmin()).isEqualTo(4);
            // a frame of the master's own term with its token: b takes the copy; a write naming a newer term
            // than b follows is taken as current, but does not move b's term either
            assertThat(replicate(a, new NodeMessages.Replicate(s.epoch(), 0, a.controlToken(), "127.0.0.1", b.port(),
                    List.of(item)))).containsExactly(ResultCode.OK);
            assertThat(read(b, b.capacity() / 2, w.generation(), value.length)).isEqualTo(value);
            assertThat(nodeWrite(b, s.epoch(), 7, "rep/w", b.capacity() / 4)).isEqualTo(ResultCode.OK);
            assertThat(b.term()).isZero();
            // the real master still administers both
            assertThat(c.remove("rep/t")).isTrue();
            Await.until("a freed rep/t", () -> a.objectCount() == 0);
        }
    }
}

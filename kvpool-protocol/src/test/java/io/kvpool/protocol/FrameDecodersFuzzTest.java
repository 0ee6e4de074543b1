package io.kvpool.protocol;

import com.code_intelligence.jazzer.junit.FuzzTest;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.LeaseMessages;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteLeaseMessages;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.List;
import java.util.function.Function;

/**
 * Fuzz targets for every body decoder master and nodes run on what a peer sends, and for the frame
 * header check that comes before them (Jazzer). Under plain JUnit each runs in regression mode on
 * the empty input and the seeds in {@code src/test/resources/io/kvpool/protocol/FrameDecodersFuzzTestInputs/};
 * {@code scripts/fuzz.sh} runs a campaign.
 *
 * <p>The contract checked: whatever the bytes, a decoder either returns a message that used the
 * whole body, or refuses with {@link MalformedFrameException}, {@link BadRequestException} or
 * {@link IllegalArgumentException} (which servers answer as a bad frame or a bad request). Any
 * other exception, an allocation beyond the body's size (OutOfMemoryError under the campaign's
 * small heap) or a hang is a finding.
 */
class FrameDecodersFuzzTest {

    /** The decoders, chosen by the input's first byte (modulo their count). */
    static final List<Function<BodyReader, Object>> DECODERS = List.of(
            MasterMessages.Hello::read, MasterMessages.HelloReply::read, MasterMessages.Ping::read,
            MasterMessages.PutStart::read, MasterMessages.PutStartReply::read, MasterMessages.PutEnd::read,
            MasterMessages.Codes::read, MasterMessages.ReplicaListReply::read, MasterMessages.Flags::read,
            MasterMessages.Sizes::read, MasterMessages.Prefix::read, MasterMessages.RemoveAll::read,
            MasterMessages.Removed::read, MasterMessages.ClusterStats::read, MasterMessages.RegisterNode::read,
            MasterMessages.RegisterReply::read, MasterMessages.TierStats::read, MasterMessages.Heartbeat::read,
            MasterMessages.HeartbeatReply::read, MasterMessages.Inventory::read,
            NodeMessages.Write::read, NodeMessages.Read::read, NodeMessages.ShmWriteEnd::read,
            NodeMessages.ShmLease::read, NodeMessages.Free::read, NodeMessages.Reset::read,
            NodeMessages.Replicate::read, NodeMessages.ReadRange::read, NodeMessages.PartWrite::read,
            NodeMessages.PartEnd::read,
            WriteLeaseMessages.Grant::read, WriteLeaseMessages.Granted::read, WriteLeaseMessages.Commit::read,
            WriteLeaseMessages.Release::read, LeaseMessages.LeaseRequest::read, LeaseMessages.LeaseReply::read,
            KeyList::read, DigestList::read);

    @FuzzTest(maxDuration = "10m")
    void everyBodyDecoderAcceptsWholeBodiesOrRefusesCleanly(byte[] data) {
        if (data.length == 0) {
            return;
        }
        Function<BodyReader, Object> decoder = DECODERS.get((data[0] & 0xFF) % DECODERS.size());
        BodyReader r = new BodyReader(ByteBuffer.wrap(Arrays.copyOfRange(data, 1, data.length))
                .order(ByteOrder.LITTLE_ENDIAN));
        try {
            decoder.apply(r);
            r.end("fuzzed body");
        } catch (MalformedFrameException | BadRequestException | IllegalArgumentException refused) {
            // a clean refusal: the server answers it and, for a bad frame, closes that connection
        }
    }

    @FuzzTest(maxDuration = "10m")
    void frameHeadersAreCheckedBeforeAnythingIsAllocated(byte[] data) {
        ByteBuffer b = FrameHeader.allocate();
        b.put(data, 0, Math.min(data.length, b.capacity()));
        b.clear();
        Limits limits = new Limits(1 << 20, 1 << 30);
        try {
            FrameHeader.Decoded h = FrameHeader.decode(b, limits);
            if (h.bodyLength() < 0 || h.bodyLength() > limits.maxBodyBytes() || h.payloadLength() < 0
                    || h.payloadLength() > limits.maxPayloadBytes()) {
                throw new AssertionError("a header past the limits was accepted: " + h);
            }
        } catch (MalformedFrameException refused) {
            // refused before any body buffer exists
        }
    }
}

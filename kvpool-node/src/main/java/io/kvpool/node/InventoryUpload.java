package io.kvpool.node;

import io.kvpool.node.disk.DiskStore;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * What a registering node lists to the master (NODE_INVENTORY, in chunks): its SSD tier's objects
 * first, then the objects of its segment, each re-read from its self-describing header and checked
 * against its value checksum (one that fails is dropped, not listed). The master answers each item OK
 * (taken) or ALREADY_EXISTS (drop it): refused disk copies leave the tier, refused memory copies the
 * ledger. The last chunk makes the segment active at the master. {@link MasterLink} runs it with
 * writes closed ({@link WriteGate}), so the regions it is handed are all the node holds.
 */
final class InventoryUpload {

    private static final Logger log = LoggerFactory.getLogger(InventoryUpload.class);

    /** What the master took, refused, and what failed verification here. */
    record Counts(long kept, long dropped, long corrupt) {
    }

    private final LocalSegment node;
    /** The SSD tier, or null. */
    private final DiskTier disk;
    private final long incarnation;

    InventoryUpload(LocalSegment node, DiskTier disk, long incarnation) {
        this.node = node;
        this.disk = disk;
        this.incarnation = incarnation;
    }

    /**
     * Lists {@code regions} (and the SSD tier's objects) to the master as segment {@code id}; with
     * {@code keep} false (the node's objects are from an older epoch) only an empty last chunk, after
     * the tier was reset to {@code epoch}.
     */
    Counts send(FrameConnection conn, Duration timeout, int id, boolean keep, long epoch,
                List<RegionLedger.Region> regions) throws IOException {
        RegionLedger ledger = node.ledger();
        long kept = 0;
        long dropped = 0;
        long corrupt = 0;
        if (disk != null && keep) {
            List<DiskStore.Entry> onDisk = disk.entries();
            for (int from = 0; from < onDisk.size(); from += MasterLink.INVENTORY_CHUNK) {
                List<DiskStore.Entry> chunk = onDisk.subList(from, Math.min(onDisk.size(), from + MasterLink.INVENTORY_CHUNK));
                List<InventoryItem> items = new ArrayList<>(chunk.size());
                for (DiskStore.Entry e : chunk) {
                    items.add(new InventoryItem(0, e.generation(), e.epoch(), e.key(), e.valueLength(), Tier.DISK));
                }
                List<ResultCode> codes = call(conn, timeout, new Inventory(id, incarnation, false, items));
                for (int j = 0; j < chunk.size(); j++) {
                    if (codes.get(j) == ResultCode.OK) {
                        kept++;
                    } else {
                        dropped++;
                        disk.rejected(chunk.get(j));
                    }
                }
            }
        } else if (disk != null) {
            disk.reset(epoch);
        }
        List<RegionLedger.Region> listed = keep ? regions : List.of();
        int i = 0;
        do {
            List<RegionLedger.Region> chunk = listed.subList(i, Math.min(listed.size(), i + MasterLink.INVENTORY_CHUNK));
            List<InventoryItem> items = new ArrayList<>(chunk.size());
            List<RegionLedger.Region> sent = new ArrayList<>(chunk.size());
            for (RegionLedger.Region r : chunk) {
                InventoryItem item = verified(r);
                if (item == null) {
                    corrupt++;
                    ledger.free(r.offset, r.generation);
                } else {
                    items.add(item);
                    sent.add(r);
                }
            }
            i += chunk.size();
            List<ResultCode> codes = call(conn, timeout, new Inventory(id, incarnation, i >= listed.size(), items));
            for (int j = 0; j < sent.size(); j++) {
                if (codes.get(j) == ResultCode.OK) {
                    kept++;
                } else {
                    dropped++;
                    ledger.free(sent.get(j).offset, sent.get(j).generation);
                }
            }
        } while (i < listed.size());
        return new Counts(kept, dropped, corrupt);
    }

    private static List<ResultCode> call(FrameConnection conn, Duration timeout, Inventory inv) throws IOException {
        BodyWriter w = new BodyWriter(64 + inv.items().size() * 128);
        inv.write(w);
        return MasterMessages.Codes.read(conn.call(Opcode.NODE_INVENTORY, w, timeout).body()).codes();
    }

    /**
     * Re-reads an object from its header in the segment and checks it against the ledger and its
     * value checksum; null if anything disagrees.
     */
    private InventoryItem verified(RegionLedger.Region r) {
        RegionLedger ledger = node.ledger();
        RegionLedger.Region pinned = ledger.beginRead(r.offset, r.generation);
        if (pinned == null) {
            return null;
        }
        try {
            ObjectLayout.Header h = ObjectLayout.readHeader(node.segment(), r.offset, node.segment().byteSize());
            if (h == null || h.generation() != r.generation || h.state() != ObjectLayout.STATE_COMPLETE
                    || h.valueLength() != r.valueLength || !Arrays.equals(h.key(), r.key)) {
                return null;
            }
            int crc = ObjectLayout.valueCrc(node.segment().asSlice(r.valueOffset(), r.valueLength));
            if (crc != h.valueCrc()) {
                log.warn("node {}: object '{}' at offset {} fails its checksum; not listed", node.name(),
                        Keys.decode(r.key), r.offset);
                return null;
            }
            return new InventoryItem(r.offset, r.generation, h.epoch(), h.key(), h.valueLength());
        } finally {
            ledger.endRead(pinned);
        }
    }
}

package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * A registration under a name already registered (protocol 4.37, invariant I15): whether it may
 * replace that segment, and what the segment it replaces had placed that is still on its way.
 *
 * <h2>Who may replace a segment</h2>
 * The same node, or nobody's: the registration presents the old registration's control token (only
 * that node and its next run, which adopted its segment file or holds its SSD tier's directory, ever
 * had it), or it arrives on the master connection the old registration last spoke on, or that
 * connection has closed, or the old registration is silent past the node TTL. Anything else is a
 * forged registration or a second node given a live node's address: refused, and nothing changes.
 *
 * <h2>What the replaced segment had placed</h2>
 * Puts still pending on it and the unused ranges of its write leases may still be written (a slow
 * writer, a same-machine copy); {@link #pendingOn} lists the pending puts' regions, which the
 * {@link WriteLeases} hold on the new segment until their deadlines. A put pending only on the
 * replaced segment can no longer complete and is forgotten when that segment is dropped
 * ({@link #onlyOn}), so the object its node lists whole is taken.
 *
 * <p>Callers hold the epoch write lock; the index is reached through {@link ObjectIndex#forEachShard}.
 */
final class SegmentReplacement {

    private final MasterConfig config;
    private final ObjectIndex index;

    SegmentReplacement(MasterConfig config, ObjectIndex index) {
        this.config = config;
        this.index = index;
    }

    /**
     * Why registration {@code r} (on connection {@code peer}; null in-process) may not replace
     * {@code existing}, a segment of the same name; null when it may.
     */
    String refusal(Segment existing, RegisterNode r, String peer, long nowMillis) {
        long silent = nowMillis - existing.lastHeartbeatMillis;
        String link = existing.link;
        if (existing.controlToken.matches(r.previousToken()) || link == null || link.equals(peer)
                || silent > config.nodeTtl().toMillis()) {
            return null;
        }
        return "register_node of segment " + r.name() + " from " + (peer == null ? "this process" : peer)
                + " refused: that segment is registered (id " + existing.id + ", its node last heard from " + silent
                + " ms ago on the connection from " + link + ") and this registration does not prove it is that"
                + " node's next run (it does not carry the control token of that registration). If that node"
                + " restarted, it registers once its old connection is closed or its registration expires (node TTL "
                + config.nodeTtl().toMillis() + " ms); if another node was started with the same address, give each"
                + " node its own --advertise-host and --port";
    }

    /** The regions pending two-phase puts reserved on {@code seg}, with their deadlines and generations. */
    List<WriteLeases.Held> pendingOn(Segment seg) {
        List<WriteLeases.Held> out = new ArrayList<>();
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> collect = shard -> {
            for (Map.Entry<Key, ObjectIndex.PendingPut> e : shard.pending.entrySet()) {
                ObjectIndex.PendingPut p = e.getValue();
                for (int i = 0; i < p.segments.length; i++) {
                    if (p.segments[i] == seg.id) {
                        out.add(new WriteLeases.Held(p.offsets[i],
                                ObjectLayout.regionLength(e.getKey().bytes.length, p.valueLength), p.deadlineMillis,
                                p.generation, p.epoch));
                    }
                }
            }
        };
        index.forEachShard(collect);
        return out;
    }

    /** Whether every replica of pending put {@code p} is on segment {@code id} (it dies with that segment). */
    static boolean onlyOn(ObjectIndex.PendingPut p, int id) {
        for (int s : p.segments) {
            if (s != id) {
                return false;
            }
        }
        return true;
    }
}

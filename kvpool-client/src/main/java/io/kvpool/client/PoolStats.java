package io.kvpool.client;

import java.util.List;

/**
 * The pool as the master sees it at one moment.
 *
 * @param epoch          cluster epoch; moves on every removeAll(force)
 * @param keys           complete objects
 * @param pendingPuts    puts reserved but not yet completed
 * @param allocatedBytes bytes reserved in active segments (object headers and padding included)
 * @param capacityBytes  bytes contributed by active segments
 * @param activeClients  clients seen recently
 * @param segments       one row per segment
 */
public record PoolStats(long epoch, long keys, long pendingPuts, long allocatedBytes, long capacityBytes,
                        int activeClients, List<SegmentStats> segments) {

    /**
     * One segment.
     *
     * @param active             false while the node is still listing its objects after (re)joining
     * @param heartbeatAgeMillis time since the node's last heartbeat
     * @param shmPath            the shared-memory file backing the segment on the node's machine, or ""
     * @param diskCapacityBytes  the node's SSD tier, or 0 without one
     * @param diskUsedBytes      bytes in the SSD tier's files
     * @param diskObjects        objects in the SSD tier
     */
    public record SegmentStats(int id, String name, String host, int port, long capacityBytes, long usedBytes,
                               long objects, boolean active, long heartbeatAgeMillis, String shmPath,
                               long diskCapacityBytes, long diskUsedBytes, long diskObjects, boolean draining) {

        /** What the master says of it: joining (listing its objects), active, or draining (its node stops for a restart). */
        public String state() {
            return draining ? "draining" : active ? "active" : "joining";
        }
    }
}

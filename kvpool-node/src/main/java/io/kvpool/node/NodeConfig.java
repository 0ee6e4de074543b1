package io.kvpool.node;

import io.kvpool.config.Durations;
import io.kvpool.config.HostPort;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.config.Size;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Tls;

import java.nio.file.Path;
import java.time.Duration;

/**
 * Everything a storage node is configured with, typed, with defaults in one place.
 *
 * @param master            the master's address, or the etcd endpoints that elect it ({@code etcd://...})
 * @param listenHost        interface to listen on for reads, writes and master control
 * @param port              port to listen on; 0 picks a free one
 * @param advertiseHost     address clients use to reach this node; null detects one
 * @param segmentSize       bytes of off-heap memory this node contributes
 * @param shmDir            where to put the shared-memory file backing the segment, and the group (if any)
 *                          allowed to open it besides the node's user; null for anonymous memory
 * @param heartbeatInterval how often the node tells the master it is alive
 * @param regionWait        how long a write waits for reads of the region it overwrites to finish
 * @param frameTimeout      how long a frame may take to arrive once it began
 * @param verifyWrites      recompute each written value's CRC32C and refuse mismatches
 * @param limits            frame size limits
 * @param prefault          commit every page of a shared-memory segment at start (before registering),
 *                          so no write pays for first-touch page faults
 * @param diskDir           directory of the SSD tier; null turns the tier off (no disk thread, file or buffer)
 * @param diskSize          capacity of the SSD tier (required with a directory)
 * @param promoteAfter      disk hits after which an object moves back to memory; 0 never promotes
 * @param adoptSegment      at start, take over the shared-memory segment file a previous run of this
 *                          node (same name, same size) left behind, with the objects in it that verify
 */
public record NodeConfig(MasterAddress master, String listenHost, int port, String advertiseHost, Size segmentSize,
                         ShmDir shmDir, Duration heartbeatInterval, Duration regionWait, Duration frameTimeout,
                         boolean verifyWrites, Limits limits, boolean prefault, Path diskDir, Size diskSize,
                         int promoteAfter, boolean adoptSegment, Secrets secrets) {

    /** Default port a node listens on. */
    public static final int DEFAULT_PORT = 50052;
    /** Default segment size. */
    public static final Size DEFAULT_SEGMENT_SIZE = Size.ofGiB(1);
    /** Default heartbeat period; the master drops a node after its TTL (default 10 s) of silence. */
    public static final Duration DEFAULT_HEARTBEAT_INTERVAL = Duration.ofSeconds(1);
    /** Default bound on how long a write waits for in-flight reads of the space it reuses. */
    public static final Duration DEFAULT_REGION_WAIT = Duration.ofSeconds(5);
    /** Default bound on one frame's transfer once it started. */
    public static final Duration DEFAULT_FRAME_TIMEOUT = Duration.ofSeconds(30);
    /** Default number of disk hits after which an object moves back to memory. */
    public static final int DEFAULT_PROMOTE_AFTER = 2;
    /** Default shared-memory directory. */
    public static final Path DEFAULT_SHM_DIR = Path.of("/dev/shm");

    public NodeConfig {
        if (secrets == null) {
            throw new IllegalArgumentException("node: secrets must not be null (Secrets.NONE for an open node)");
        }
        if (secrets.present() && !secrets.hasAdmin()) {
            throw new IllegalArgumentException("node: the cluster secret needs the admin secret too"
                    + " (--admin-secret-file or KVPOOL_ADMIN_SECRET_FILE): nodes register with it");
        }
        if (master == null) {
            throw new IllegalArgumentException("node: master address is required (--master HOST:PORT or etcd://HOST:PORT,...)");
        }
        if (segmentSize == null || segmentSize.bytes() < 1 << 20) {
            throw new IllegalArgumentException("node: segment size (--segment-size) must be at least 1MiB, got " + segmentSize);
        }
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("node: port (--port) " + port + " is out of range 0..65535");
        }
        Durations.requirePositive("node: heartbeat interval (--heartbeat-interval)", heartbeatInterval);
        if (diskDir != null && (diskSize == null || diskSize.bytes() < (4 << 20))) {
            throw new IllegalArgumentException("node: a disk tier (--disk-dir " + diskDir + ") needs --disk-size of at"
                    + " least 4MiB, got " + (diskSize == null ? "none" : diskSize));
        }
        if (diskDir == null && diskSize != null) {
            throw new IllegalArgumentException("node: --disk-size " + diskSize + " given without --disk-dir");
        }
        if (promoteAfter < 0) {
            throw new IllegalArgumentException("node: --promote-after must be 0 (never) or more, got " + promoteAfter);
        }
        Durations.requirePositive("node: region wait", regionWait);
        Durations.requirePositive("node: frame timeout", frameTimeout);
    }

    /** A config with every default, for the given master and segment size. */
    public static NodeConfig defaults(HostPort master, Size segmentSize) {
        return defaults(MasterAddress.of(master), segmentSize);
    }

    /** A config with every default, for the master (fixed or elected) and segment size. */
    public static NodeConfig defaults(MasterAddress master, Size segmentSize) {
        return new NodeConfig(master, "0.0.0.0", DEFAULT_PORT, null, segmentSize, ShmDir.ownerOnly(DEFAULT_SHM_DIR),
                DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_REGION_WAIT, DEFAULT_FRAME_TIMEOUT, false, Limits.DEFAULT, true, null, null,
                DEFAULT_PROMOTE_AFTER, true, Secrets.NONE);
    }

    public NodeConfig withPort(int p) {
        return new NodeConfig(master, listenHost, p, advertiseHost, segmentSize, shmDir, heartbeatInterval, regionWait,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withListen(String host, int p) {
        return new NodeConfig(master, host, p, advertiseHost, segmentSize, shmDir, heartbeatInterval, regionWait,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withAdvertiseHost(String host) {
        return new NodeConfig(master, listenHost, port, host, segmentSize, shmDir, heartbeatInterval, regionWait,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withHeartbeatInterval(Duration d) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, d, regionWait,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    /** The segment file's directory (null: anonymous memory), keeping the group given access to it. */
    public NodeConfig withShmDir(Path path) {
        return withShm(path == null ? null : new ShmDir(path, shmDir == null ? null : shmDir.group()));
    }

    /** Where the segment file goes and who may open it (null: anonymous memory). */
    public NodeConfig withShm(ShmDir dir) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, dir, heartbeatInterval, regionWait,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withRegionWait(Duration d) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval, d,
                frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    /** An SSD tier in {@code dir} of {@code size}, or none when {@code dir} is null. */
    public NodeConfig withDisk(Path dir, Size size) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, verifyWrites, limits, prefault, dir, size, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withPromoteAfter(int hits) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, hits, adoptSegment, secrets);
    }

    /** Whether a restarted node takes over the segment file its previous run left (default on). */
    public NodeConfig withAdoptSegment(boolean v) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, v, secrets);
    }

    /**
     * The TLS identity of this node's port and of its connections to the master and other nodes
     * ({@link Tls#NONE}: plain TCP); it travels with the secrets ({@link Secrets#tls()}).
     */
    public Tls tls() {
        return secrets.tls();
    }

    /** This config with {@code t} as its TLS identity ({@link Tls#NONE}: plain TCP). */
    public NodeConfig withTls(Tls t) {
        return withSecrets(secrets.withTls(t));
    }

    /** The secrets this node checks connections against and proves to the master ({@link Secrets#NONE}: open). */
    public NodeConfig withSecrets(Secrets s) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, verifyWrites, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, s);
    }

    public NodeConfig withPrefault(boolean v) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, verifyWrites, limits, v, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }

    public NodeConfig withVerifyWrites(boolean v) {
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shmDir, heartbeatInterval,
                regionWait, frameTimeout, v, limits, prefault, diskDir, diskSize, promoteAfter, adoptSegment, secrets);
    }
}

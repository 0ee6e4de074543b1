package io.kvpool.cli;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.ShmDir;
import io.kvpool.protocol.Secrets;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.time.Duration;

/** Node flags, shared by {@code kvpool node} and {@code kvpool serve}. */
final class NodeOptions {

    @Option(names = "--segment-size", paramLabel = "SIZE",
            description = "Off-heap memory this node contributes, e.g. 8GiB (default: 1GiB).")
    Size segmentSize = NodeConfig.DEFAULT_SEGMENT_SIZE;

    @Option(names = "--shm-dir", paramLabel = "DIR",
            description = "Directory for the shared-memory file backing the segment; 'none' for anonymous memory"
                    + " (default: ${DEFAULT-VALUE}).")
    String shmDir = NodeConfig.DEFAULT_SHM_DIR.toString();

    @Option(names = "--shm-group", paramLabel = "NAME",
            description = "Give the shared-memory segment file to this group, readable and writable by it (mode 0660),"
                    + " so same-machine clients running as other users in the group can map it (default: none, the"
                    + " file is the node's user's alone, mode 0600).")
    String shmGroup;

    @Option(names = "--heartbeat-interval", paramLabel = "DURATION",
            description = "How often the node heartbeats to the master (default: 1s).")
    Duration heartbeatInterval = NodeConfig.DEFAULT_HEARTBEAT_INTERVAL;

    @Option(names = "--verify-writes", description = "Check each written value against its CRC32C before accepting it.")
    boolean verifyWrites;

    @Option(names = "--no-prefault", negatable = false,
            description = "Do not commit the shared-memory segment's pages at start (faster start; the first write"
                    + " to each page pays a page fault instead).")
    boolean noPrefault;

    @Option(names = "--disk-dir", paramLabel = "DIR",
            description = "Directory of an SSD tier: memory evictions spill there and are read back (default: none, no"
                    + " disk tier).")
    Path diskDir;

    @Option(names = "--disk-size", paramLabel = "SIZE", description = "Capacity of the SSD tier, e.g. 200GiB.")
    Size diskSize;

    @Option(names = "--promote-after", paramLabel = "N",
            description = "Disk hits after which an object moves back to memory; 0 never (default: ${DEFAULT-VALUE}).")
    int promoteAfter = NodeConfig.DEFAULT_PROMOTE_AFTER;

    @Option(names = "--no-adopt-segment",
            description = "Start with an empty segment even when a previous run of this node (same host:port and"
                    + " segment size) left its shared-memory segment file; by default the node takes it over and"
                    + " keeps the objects in it that verify.")
    boolean noAdoptSegment;

    @Option(names = "--orphan-grace", paramLabel = "DURATION",
            description = "How long the shared-memory segment file of a node that died without closing it (kill -9,"
                    + " a crash) is kept for that node to restart and adopt it, before another node on the machine"
                    + " deletes it; sooner when a starting node needs the memory. 0s deletes it at once"
                    + " (default: 10m).")
    Duration orphanGrace = ShmDir.DEFAULT_ORPHAN_GRACE;

    NodeConfig toConfig(MasterAddress master, String listenHost, int port, String advertiseHost,
                        ExposureOptions exposure) {
        long memory = Bounds.machineMemory();
        if (memory > 0 && segmentSize.bytes() > memory) {
            throw new IllegalArgumentException("--segment-size " + segmentSize + " is more than this machine's memory ("
                    + Size.human(memory) + "): a segment is memory the node allocates and keeps");
        }
        if (diskDir != null && diskSize != null) {
            long space = diskSpace(diskDir);
            if (space > 0) {
                Bounds.sizeAtMost("--disk-size", diskSize, space, "the file system of --disk-dir " + diskDir + " holds");
            }
        }
        NodeConfig d = NodeConfig.defaults(master, segmentSize);
        ShmDir shm = shm();
        return new NodeConfig(master, listenHost, port, advertiseHost, segmentSize, shm, heartbeatInterval,
                d.regionWait(), d.frameTimeout(), verifyWrites, exposure.apply(d.limits()), !noPrefault, diskDir, diskSize,
                promoteAfter, !noAdoptSegment, Secrets.NONE)
                .withSecrets(exposure.secrets("node", listenHost)); // after the flags' own checks
    }

    /** The size of the file system {@code dir} is on (or would be: its nearest existing parent's), 0 when unknown. */
    private static long diskSpace(Path dir) {
        for (Path p = dir.toAbsolutePath(); p != null; p = p.getParent()) {
            if (java.nio.file.Files.isDirectory(p)) {
                try {
                    return java.nio.file.Files.getFileStore(p).getTotalSpace();
                } catch (java.io.IOException e) {
                    return 0;
                }
            }
        }
        return 0;
    }

    /** The directory of the node's segment file; null for anonymous memory. */
    Path shmPath() {
        return "none".equalsIgnoreCase(shmDir) ? null : Path.of(shmDir);
    }

    /** The segment file's directory and group; null for anonymous memory. */
    private ShmDir shm() {
        if ("none".equalsIgnoreCase(shmDir)) {
            if (shmGroup != null) {
                throw new IllegalArgumentException("--shm-group " + shmGroup + " needs a shared-memory directory, not"
                        + " --shm-dir none (anonymous memory has no file to share)");
            }
            return null;
        }
        return new ShmDir(Path.of(shmDir), shmGroup, orphanGrace);
    }
}

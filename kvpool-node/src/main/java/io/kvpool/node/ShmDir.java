package io.kvpool.node;

import io.kvpool.config.Durations;

import java.nio.file.Path;
import java.time.Duration;

/**
 * Where a node's shared-memory segment file goes, who besides the node's user may open it, and how
 * long the files of nodes that died there are kept for them.
 *
 * @param path        the directory (normally {@code /dev/shm})
 * @param group       null: the file is the node user's alone (mode 0600); a group name: the file is given
 *                    to that group, readable and writable by it (mode 0660), so same-machine clients running
 *                    as other users in the group can map it. Resolved when the node starts: an unknown group
 *                    fails the start.
 * @param orphanGrace how long the segment file of a node that died without closing it (SIGKILL, a crash)
 *                    is kept for that node to restart and adopt it, before another node deletes it
 *                    ({@link OrphanedSegments}); it goes sooner when a starting node needs the memory.
 *                    Zero: deleted as soon as another node sees it.
 */
public record ShmDir(Path path, String group, Duration orphanGrace) {

    /** Default {@link #orphanGrace}: time for a supervisor (systemd, Kubernetes at its longest back-off) to restart a node. */
    public static final Duration DEFAULT_ORPHAN_GRACE = Duration.ofMinutes(10);
    /** Shortest and longest {@link #sweepInterval()}. */
    static final Duration MIN_SWEEP_INTERVAL = Duration.ofSeconds(1);
    static final Duration MAX_SWEEP_INTERVAL = Duration.ofSeconds(10);

    public ShmDir {
        if (path == null) {
            throw new IllegalArgumentException("node: the shared-memory directory must not be null (no ShmDir means"
                    + " anonymous memory)");
        }
        if (group != null && (group.isBlank() || !group.equals(group.strip()))) {
            throw new IllegalArgumentException("node: --shm-group must be a group name, got '" + group + "'");
        }
        if (orphanGrace == null || orphanGrace.isNegative()) {
            throw new IllegalArgumentException("node: --orphan-grace must be 0s or more, got "
                    + (orphanGrace == null ? "none" : Durations.format(orphanGrace)));
        }
    }

    /** The directory and group, with the default orphan grace. */
    public ShmDir(Path path, String group) {
        this(path, group, DEFAULT_ORPHAN_GRACE);
    }

    /** The directory, with the file the node user's alone. */
    public static ShmDir ownerOnly(Path path) {
        return new ShmDir(path, null);
    }

    /** The same directory, its segment file given to {@code group} (null: the node user's alone). */
    public ShmDir withGroup(String g) {
        return new ShmDir(path, g, orphanGrace);
    }

    /** The same directory, the files of dead nodes kept for {@code grace}. */
    public ShmDir withOrphanGrace(Duration grace) {
        return new ShmDir(path, group, grace);
    }

    /**
     * How often a running node looks for orphans and reclaims those whose grace ran out: a quarter of
     * the grace, between {@link #MIN_SWEEP_INTERVAL} and {@link #MAX_SWEEP_INTERVAL}. A new orphan is
     * seen within one interval, and reclaimed at most one interval after its grace.
     */
    Duration sweepInterval() {
        Duration q = orphanGrace.dividedBy(4);
        return q.compareTo(MIN_SWEEP_INTERVAL) < 0 ? MIN_SWEEP_INTERVAL : q.compareTo(MAX_SWEEP_INTERVAL) > 0
                ? MAX_SWEEP_INTERVAL : q;
    }
}

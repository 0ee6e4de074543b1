package io.kvpool.node;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileTime;
import java.time.Duration;
import java.time.Instant;
import java.time.InstantSource;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * When a dead node's segment file goes: kept through its grace for the node to come back and adopt
 * it (whoever else starts on the machine meanwhile), reclaimed once a running node has seen it for
 * the grace, at once by its own node when that node does not take it, and early when a starting node
 * needs the memory. The clock and the free space are injected: nothing waits.
 */
@Timeout(60) // a guard against hangs only; no assertion depends on timing
class OrphanedSegmentsTest {

    /** Above the largest pid_max Linux allows (2^22), so no process can have it. */
    private static final long DEAD_PID = (1L << 22) + 12345;
    private static final Duration GRACE = Duration.ofMinutes(10);
    private static final Instant T0 = Instant.parse("2026-11-20T10:00:00Z");

    @TempDir
    Path dir;

    private final AtomicReference<Instant> now = new AtomicReference<>(T0);
    private final InstantSource clock = now::get;

    @Test
    void anOrphanIsKeptThroughItsGraceAndReclaimedOnceItRanOut() throws Exception {
        // modified long ago (an idle node's file looks old): the grace counts from when it was first seen
        Path orphan = orphan("127.0.0.1:7001", 1 << 20, T0.minus(Duration.ofDays(1)));
        OrphanedSegments orphans = new OrphanedSegments(dir, GRACE, clock);
        assertThat(orphans.reclaimExpired()).as("first seen now").isZero();

        now.set(T0.plus(GRACE).minusSeconds(1));
        assertThat(orphans.reclaimExpired()).isZero();
        assertThat(orphan).as("one second inside its grace").exists();

        now.set(T0.plus(GRACE));
        assertThat(orphans.reclaimExpired()).isEqualTo(1);
        assertThat(orphan).doesNotExist();
    }

    @Test
    void aLiveNodesFileIsNoOrphanHoweverLongSinceItWasMarked() throws Exception {
        Path live = file(OrphanedSegments.filePrefix("live:1") + ProcessHandle.current().pid() + ".seg", 4096,
                Instant.EPOCH);
        now.set(Instant.EPOCH.plus(Duration.ofDays(365)));
        assertThat(new OrphanedSegments(dir, Duration.ZERO, clock).reclaimExpired()).isZero();
        assertThat(live).exists();
    }

    @Test
    void itsOwnNodeStartingAgainReclaimsItAtOnceAndLeavesOtherNodesFiles() throws Exception {
        Path mine = orphan("node", 4096, T0);
        Path longerName = orphan("node-1", 4096, T0); // shares the prefix "kvpool-node-": not this node's
        Path other = orphan("127.0.0.1:7002", 4096, T0);
        assertThat(new OrphanedSegments(dir, GRACE, clock).reclaimOwn(OrphanedSegments.filePrefix("node")))
                .isEqualTo(1);
        assertThat(mine).doesNotExist();
        assertThat(longerName).exists();
        assertThat(other).exists();
    }

    @Test
    void aNodeShortOfMemoryReclaimsOrphansInTheirGraceOldestFirstUntilItFits() throws Exception {
        long mib4 = 4L << 20;
        Path oldest = orphan("a:1", mib4, T0);
        Path middle = orphan("b:1", mib4, T0.plusSeconds(60));
        Path newest = orphan("c:1", mib4, T0.plusSeconds(120));
        now.set(T0.plusSeconds(180)); // every one of them well within its grace
        long capacity = 16L << 20; // a 16 MiB shared-memory directory holding 12 MiB of orphans
        OrphanedSegments orphans = new OrphanedSegments(dir, GRACE, clock);

        assertThat(orphans.makeRoom(4L << 20, () -> capacity - segmentBytes())).as("4 MiB fit already").isZero();
        assertThat(orphans.makeRoom(7L << 20, () -> capacity - segmentBytes())).isEqualTo(1);
        assertThat(oldest).doesNotExist();
        assertThat(middle).exists();
        assertThat(newest).exists();
        assertThat(orphans.makeRoom(15L << 20, () -> capacity - segmentBytes())).as("all there is").isEqualTo(2);
        assertThat(middle).doesNotExist();
        assertThat(newest).doesNotExist();
    }

    /** The race of issue 25, at the level of the files: another node starts first, then the dead one adopts. */
    @Test
    void aNodeStartingBesideADeadOneLeavesItsFileAndTheDeadOneAdoptsItWithItsBytes() throws Exception {
        Path orphan = orphan("127.0.0.1:7001", 1 << 20, T0);
        try (FileChannel ch = FileChannel.open(orphan, StandardOpenOption.WRITE)) {
            ch.write(ByteBuffer.wrap("adopt me".getBytes()), 4096);
        }
        ShmDir shm = ShmDir.ownerOnly(dir);
        try (SegmentMemory other = SegmentMemory.allocate(1 << 20, shm, "127.0.0.1:7002", false, true)) {
            assertThat(other.adopted()).isFalse();
            assertThat(orphan).as("kept for its node, within the default grace").exists();
            try (SegmentMemory back = SegmentMemory.allocate(1 << 20, shm, "127.0.0.1:7001", false, true)) {
                assertThat(back.adopted()).isTrue();
                byte[] got = new byte[8];
                back.segment().asSlice(4096, 8).asByteBuffer().get(got);
                assertThat(new String(got)).isEqualTo("adopt me");
                assertThat(back.segment().get(ValueLayout.JAVA_BYTE, 0)).isZero();
            }
        }
    }

    @Test
    void aRunningNodeReclaimsTheOrphansItHasSeenForTheGraceAndNeverItsOwnFile() throws Exception {
        Path before = orphan("gone:1", 4096, T0);
        ShmDir shm = ShmDir.ownerOnly(dir).withOrphanGrace(GRACE);
        OrphanedSegments orphans = new OrphanedSegments(dir, GRACE, clock);
        try (SegmentMemory m = SegmentMemory.allocate(1 << 20, shm, "live:1", false, false, orphans);
             ShmKeeper keeper = new ShmKeeper(orphans, shm.sweepInterval(), false)) {
            assertThat(before).as("kept at the node's start: first seen then").exists();
            now.set(T0.plus(GRACE).minusSeconds(5));
            Path later = orphan("gone:2", 4096, T0); // a node that died while this one runs
            keeper.runOnce();
            assertThat(before).exists();
            now.set(T0.plus(GRACE));
            keeper.runOnce();
            assertThat(before).as("seen for the grace").doesNotExist();
            assertThat(later).as("seen for 5 s only").exists();
            now.set(T0.plus(GRACE).plus(GRACE));
            keeper.runOnce();
            assertThat(later).doesNotExist();
            assertThat(m.file()).as("the node's own file, however old").exists();
        }
    }

    @Test
    void theGraceIsNeverNegativeAndTheMarkIntervalFollowsIt() {
        assertThatThrownBy(() -> ShmDir.ownerOnly(dir).withOrphanGrace(Duration.ofSeconds(-1)))
                .hasMessageContaining("--orphan-grace must be 0s or more, got -1s");
        assertThat(ShmDir.ownerOnly(dir).orphanGrace()).isEqualTo(ShmDir.DEFAULT_ORPHAN_GRACE);
        assertThat(ShmDir.ownerOnly(dir).sweepInterval()).isEqualTo(Duration.ofSeconds(10));
        assertThat(ShmDir.ownerOnly(dir).withOrphanGrace(Duration.ofSeconds(20)).sweepInterval())
                .isEqualTo(Duration.ofSeconds(5));
        assertThat(ShmDir.ownerOnly(dir).withOrphanGrace(Duration.ZERO).sweepInterval()).isEqualTo(Duration.ofSeconds(1));
    }

    // ------------------------------------------------------------------ helpers

    /** A dead node's segment file of {@code bytes} (sparse), last modified at {@code modified}. */
    private Path orphan(String node, long bytes, Instant modified) throws IOException {
        return file(OrphanedSegments.filePrefix(node) + DEAD_PID + ".seg", bytes, modified);
    }

    private Path file(String name, long bytes, Instant mtime) throws IOException {
        Path p = dir.resolve(name);
        try (FileChannel ch = FileChannel.open(p, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
            ch.write(ByteBuffer.wrap(new byte[1]), bytes - 1);
        }
        Files.setLastModifiedTime(p, FileTime.from(mtime));
        return p;
    }

    /** What the segment files in the directory add up to (their sizes, as tmpfs would count them full). */
    private long segmentBytes() {
        try (Stream<Path> files = Files.list(dir)) {
            return files.filter(f -> f.toString().endsWith(".seg")).mapToLong(f -> {
                try {
                    return Files.size(f);
                } catch (IOException e) {
                    return 0;
                }
            }).sum();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }
}

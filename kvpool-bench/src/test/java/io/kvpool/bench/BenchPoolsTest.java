package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The benchmark's own pools (issue 25, fault 5). {@code bench --quick} failed in its restore section
 * with "the pool has 0 of 2048 tokens (evicted? the pool is too small)" when its pool process had
 * died (a SIGKILL: the kernel's OOM killer, on a machine short of memory): the connector counts a
 * failed lookup as a miss, and the bench blamed eviction. And the failover section left its node's
 * 512 MiB shared-memory file behind: it stopped the node with SIGKILL. Each pool process here runs
 * in its own JVM, as in the bench.
 */
@Timeout(value = 180, unit = TimeUnit.SECONDS)
class BenchPoolsTest {

    private static final Path SHM = Path.of("/dev/shm");

    @BeforeAll
    static void needsShm() {
        assumeTrue(Files.isDirectory(SHM), "no /dev/shm on this machine: nodes use anonymous memory, no file to check");
    }

    /** The segment files process {@code pid} created: {@code kvpool-<name>-<pid>.seg}. */
    private static List<Path> segmentFilesOf(long pid) throws IOException {
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(SHM, "kvpool-*-" + pid + ".seg")) {
            ds.forEach(files::add);
        }
        return files;
    }

    /** SIGKILL, as the kernel's OOM killer sends it, and the wait for the process to be gone. */
    private static void kill9(long pid) throws Exception {
        ProcessHandle p = ProcessHandle.of(pid).orElseThrow();
        p.destroyForcibly();
        p.onExit().get(30, TimeUnit.SECONDS);
    }

    @Test
    void aRestoreWhosePoolProcessDiedSaysSoInsteadOfBlamingEviction() throws Exception {
        try (PoolProcess pool = PoolProcess.start("64MiB", "256m");
             KvPoolClient c = KvPoolClient.connect(pool.masterAddress());
             RestoreBench.Stored s = RestoreBench.store(c, "pool-death", 1024, 2, 256)) {
            RestoreBench.measure(c, pool, s, 0.05); // the live pool holds every block
            kill9(pool.pid);
            assertThatThrownBy(() -> RestoreBench.measure(c, pool, s, 0.05))
                    .hasMessageContaining("pool process (pid " + pool.pid + ")")
                    .hasMessageContaining("SIGKILL")
                    .hasMessageNotContaining("evicted");
        }
    }

    @Test
    void aPoolProcessKilledDuringItsSectionLeavesNoSegmentFileOnceClosed() throws Exception {
        PoolProcess pool = PoolProcess.start("32MiB", "256m");
        long pid = pool.pid;
        try {
            assertThat(segmentFilesOf(pid)).hasSize(1);
            kill9(pid);
        } finally {
            pool.close();
        }
        assertThat(segmentFilesOf(pid)).as("segment files of the pool process %d", pid).isEmpty();
    }

    @Test
    void theFailoverSectionsNodeLeavesNoSegmentFileWhenTheSectionStops() throws Exception {
        Process node = FailoverBench.start("node", "127.0.0.1:1", "32MiB"); // no master: the node keeps trying
        try {
            assertThat(segmentFilesOf(node.pid())).hasSize(1);
        } finally {
            FailoverBench.stop(List.of(node));
        }
        assertThat(segmentFilesOf(node.pid())).as("segment files of the node process %d", node.pid()).isEmpty();
    }
}

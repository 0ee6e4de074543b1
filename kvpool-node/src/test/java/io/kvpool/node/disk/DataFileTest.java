package io.kvpool.node.disk;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/** Direct reads of a log file whose end is not on a block boundary. */
class DataFileTest {

    @Test
    void aDirectReadStopsAtAnEndOfFileMidBlock(@TempDir Path dir) throws Exception {
        int block = DiskIo.ioBlock(dir);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment probe = arena.allocate(block, block);
            assumeTrue(DiskIo.probeDirect(dir, probe), "the file system of " + dir + " takes O_DIRECT");
            DataFile f = DataFile.create(dir, 1);
            try {
                MemorySegment aligned = arena.allocate(3L * block, block);
                for (long i = 0; i < aligned.byteSize(); i++) {
                    aligned.set(ValueLayout.JAVA_BYTE, i, (byte) i);
                }
                f.writeAligned(aligned, 0, true);
                // a compaction copy goes through the page cache: the file now ends 100 bytes into a block
                byte[] tail = new byte[100];
                java.util.Arrays.fill(tail, (byte) 7);
                f.writeFully(ByteBuffer.wrap(tail), 3L * block);
                MemorySegment dst = arena.allocate(4L * block, block);
                long got = f.readDirect(dst, 0, block);
                assertThat(got).isEqualTo(3L * block + 100);
                assertThat(dst.get(ValueLayout.JAVA_BYTE, 3L * block + 99)).isEqualTo((byte) 7);
                assertThat(dst.get(ValueLayout.JAVA_BYTE, 5)).isEqualTo((byte) 5);
            } finally {
                f.closeAndDelete();
            }
        }
    }
}

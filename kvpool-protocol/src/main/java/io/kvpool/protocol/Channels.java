package io.kvpool.protocol;

import java.io.EOFException;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ReadableByteChannel;

/** Loops that move whole buffers through a blocking channel (a socket, or TLS over one). */
public final class Channels {

    /** Heap buffers are written in slices of this size so the JDK's temporary direct copy stays small. */
    private static final int HEAP_CHUNK = 1 << 20;
    /** Views over segments are limited to this many bytes each (ByteBuffer capacity is an int). */
    private static final long VIEW_CHUNK = 1L << 30;

    private Channels() {
    }

    public static void readFully(ReadableByteChannel ch, ByteBuffer dst) throws IOException {
        while (dst.hasRemaining()) {
            if (ch.read(dst) < 0) {
                throw new EOFException("connection closed by peer with " + dst.remaining() + " bytes still expected");
            }
        }
    }

    /** Reads exactly {@code dst.byteSize()} bytes from the socket straight into {@code dst}. */
    public static void readFully(ReadableByteChannel ch, MemorySegment dst) throws IOException {
        long off = 0;
        long len = dst.byteSize();
        while (off < len) {
            long n = Math.min(len - off, VIEW_CHUNK);
            readFully(ch, dst.asSlice(off, n).asByteBuffer());
            off += n;
        }
    }

    /** Reads and drops {@code n} bytes. */
    public static void skip(ReadableByteChannel ch, long n, ByteBuffer scratch) throws IOException {
        while (n > 0) {
            scratch.clear();
            scratch.limit((int) Math.min(scratch.capacity(), n));
            readFully(ch, scratch);
            n -= scratch.limit();
        }
    }

    /** Writes every buffer in full, gathering direct buffers and slicing heap ones. */
    public static void writeFully(GatheringByteChannel ch, ByteBuffer... bufs) throws IOException {
        boolean anyLargeHeap = false;
        for (ByteBuffer b : bufs) {
            if (!b.isDirect() && b.remaining() > HEAP_CHUNK) {
                anyLargeHeap = true;
                break;
            }
        }
        if (!anyLargeHeap) {
            long left = 0;
            for (ByteBuffer b : bufs) {
                left += b.remaining();
            }
            while (left > 0) {
                left -= ch.write(bufs);
            }
            return;
        }
        for (ByteBuffer b : bufs) {
            if (b.isDirect() || b.remaining() <= HEAP_CHUNK) {
                while (b.hasRemaining()) {
                    ch.write(b);
                }
            } else {
                while (b.hasRemaining()) {
                    ByteBuffer slice = b.slice(b.position(), Math.min(HEAP_CHUNK, b.remaining()));
                    while (slice.hasRemaining()) {
                        ch.write(slice);
                    }
                    b.position(b.position() + slice.capacity());
                }
            }
        }
    }

    /** Views of a segment as ByteBuffers of at most 1 GiB each, for gathering writes. */
    public static void addViews(java.util.List<ByteBuffer> out, MemorySegment seg) {
        long off = 0;
        long len = seg.byteSize();
        while (off < len) {
            long n = Math.min(len - off, VIEW_CHUNK);
            out.add(seg.asSlice(off, n).asByteBuffer());
            off += n;
        }
    }
}

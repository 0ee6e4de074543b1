package io.kvpool.jmh;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.MasterMessages.ReplicaListReply;
import io.kvpool.protocol.msg.Replica;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.Warmup;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * Encoding and decoding of the frame bodies that carry batches of keys: PUT_START (1, 64 and 1024
 * items), a KeyList of 1024 keys (the body of GET_REPLICA_LIST, EXIST_KEY, PREFIX_MATCH, REMOVE)
 * and a ReplicaListReply of 1024 items (the master's answer to GET_REPLICA_LIST).
 *
 * <p>Why it matters: every metadata round trip encodes a body on one side and decodes it on the
 * other, and an engine looks up a whole prompt's worth of block keys (hundreds to thousands of
 * 81-byte keys such as {@code llama3-8b@v7/tp0/<64 hex chars>}) per request. The codec runs on the
 * master's request threads, so its cost per key bounds the master's key rate.
 *
 * <p>Writers are created the way the client and the master create them (the client presizes at
 * 64 bytes per item, the master starts from the default and grows). Decoding includes the
 * per-key validation the master does. Results are average time per body; divide by the item count
 * for a per-key cost.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class FrameCodecBench {

    /** A realistic block key: model and version, tensor-parallel rank, SHA-256 of the token prefix. 81 bytes. */
    static byte[] key(SplittableRandom rnd) {
        byte[] hash = new byte[32];
        rnd.nextBytes(hash);
        return ("llama3-8b@v7/tp0/" + HexFormat.of().formatHex(hash)).getBytes(StandardCharsets.UTF_8);
    }

    static List<byte[]> keys(int n, long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        List<byte[]> keys = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            keys.add(key(rnd));
        }
        return keys;
    }

    /** A PUT_START batch of {@code items} keys, each a 2 MiB KV block, and its encoded form. */
    @State(Scope.Thread)
    public static class PutStartState {

        @Param({"1", "64", "1024"})
        public int items;

        PutStart message;
        ByteBuffer encoded;

        @Setup(Level.Trial)
        public void setUp() {
            List<PutStartItem> list = new ArrayList<>(items);
            for (byte[] k : keys(items, 1)) {
                list.add(new PutStartItem(k, 2L << 20));
            }
            message = new PutStart(false, 1, "", List.copyOf(list));
            BodyWriter w = new BodyWriter(64 + items * 64);
            message.write(w);
            encoded = w.buffer();
            // sanity: the body round-trips
            if (PutStart.read(new BodyReader(encoded)).items().size() != items) {
                throw new IllegalStateException("PutStart does not round-trip");
            }
        }
    }

    /** 1024 keys as a KeyList and a ReplicaListReply (one replica each), plus their encoded forms. */
    @State(Scope.Thread)
    public static class BatchState {

        static final int N = 1024;

        KeyList keyList;
        ByteBuffer keyListEncoded;
        ReplicaListReply replicaListReply;
        ByteBuffer replicaListEncoded;

        @Setup(Level.Trial)
        public void setUp() {
            keyList = new KeyList(List.copyOf(keys(N, 2)));
            BodyWriter w = new BodyWriter(16 + N * 64);
            keyList.write(w);
            keyListEncoded = w.buffer();

            SplittableRandom rnd = new SplittableRandom(3);
            List<ReplicaList> items = new ArrayList<>(N);
            long generation = 1_700_000_000_000L << 10;
            for (int i = 0; i < N; i++) {
                long offset = rnd.nextLong(1L << 42) & -64;
                items.add(new ReplicaList(ResultCode.OK, 2L << 20, ++generation,
                        List.of(new Replica(1 + rnd.nextInt(8), offset))));
            }
            replicaListReply = new ReplicaListReply(List.copyOf(items));
            BodyWriter rw = new BodyWriter();
            replicaListReply.write(rw);
            replicaListEncoded = rw.buffer();
            if (KeyList.read(new BodyReader(keyListEncoded)).keys().size() != N
                    || ReplicaListReply.read(new BodyReader(replicaListEncoded)).items().size() != N) {
                throw new IllegalStateException("batch bodies do not round-trip");
            }
        }
    }

    // ------------------------------------------------------------------ PUT_START (client encodes, master decodes)

    @Benchmark
    public ByteBuffer putStartEncode(PutStartState s) {
        BodyWriter w = new BodyWriter(64 + s.items * 64);
        s.message.write(w);
        return w.buffer();
    }

    @Benchmark
    public PutStart putStartDecode(PutStartState s) {
        return PutStart.read(new BodyReader(s.encoded));
    }

    // ------------------------------------------------------------------ KeyList of 1024 (client encodes, master decodes)

    @Benchmark
    public ByteBuffer keyList1024Encode(BatchState s) {
        BodyWriter w = new BodyWriter(16 + BatchState.N * 64);
        s.keyList.write(w);
        return w.buffer();
    }

    @Benchmark
    public KeyList keyList1024Decode(BatchState s) {
        return KeyList.read(new BodyReader(s.keyListEncoded));
    }

    // ------------------------------------------------------------------ ReplicaListReply of 1024 (master encodes, client decodes)

    @Benchmark
    public ByteBuffer replicaListReply1024Encode(BatchState s) {
        BodyWriter w = new BodyWriter();
        s.replicaListReply.write(w);
        return w.buffer();
    }

    @Benchmark
    public ReplicaListReply replicaListReply1024Decode(BatchState s) {
        return ReplicaListReply.read(new BodyReader(s.replicaListEncoded));
    }
}

package io.kvpool.master.events;

import org.junit.jupiter.api.Test;
import org.zeromq.SocketType;
import org.zeromq.ZContext;
import org.zeromq.ZMQ;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.time.InstantSource;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The publisher on real sockets (loopback, free ports): PUB frames as vLLM sends them, sequence
 * numbers from the leadership's start, replay from a sequence number up to vLLM's end marker. Waits
 * poll with generous deadlines; nothing depends on how long anything takes.
 */
class KvEventPublisherTest {

    private static final Duration DEADLINE = Duration.ofSeconds(60);
    private static final InstantSource CLOCK = InstantSource.fixed(Instant.ofEpochSecond(1_700_000_000, 500_000_000));

    private static byte[] key(String low16) {
        return ("kvp1/m/v1/tp0of1-pp0of1/bf16/" + "0".repeat(48) + low16).getBytes(StandardCharsets.US_ASCII);
    }

    /** A message's frames. */
    private static List<byte[]> receive(ZMQ.Socket s) {
        byte[] first = s.recv(0);
        if (first == null) {
            return null;
        }
        List<byte[]> frames = new ArrayList<>();
        frames.add(first);
        while (s.hasReceiveMore()) {
            frames.add(s.recv(0));
        }
        return frames;
    }

    private static long seq(byte[] b) {
        assertThat(b).hasSize(8);
        return ByteBuffer.wrap(b).getLong();
    }

    /**
     * Receives the subscriber's first message: a subscription takes a moment to reach the PUB socket
     * (ZMQ's slow joiner), so {@code announce} is repeated until one arrives.
     */
    private static List<byte[]> firstMessage(ZMQ.Socket sub, Runnable announce) {
        long deadline = System.nanoTime() + DEADLINE.toNanos();
        while (System.nanoTime() < deadline) {
            announce.run();
            List<byte[]> m = receive(sub);
            if (m != null) {
                return m;
            }
        }
        throw new AssertionError("no KV event reached the subscriber in " + DEADLINE.toSeconds() + " s");
    }

    @Test
    void publishesVllmFramesFromTheLeadershipsFirstSequenceAndReplaysThem() throws Exception {
        KvEventsConfig config = KvEventsConfig.at("tcp://127.0.0.1:*").withReplay("tcp://127.0.0.1:*").withTopic("kv@pool");
        long first = KvEventPublisher.firstSequence(3);
        assertThat(first).isEqualTo(3L << 32);
        try (KvEventPublisher p = new KvEventPublisher(config, first, CLOCK); ZContext ctx = new ZContext()) {
            ZMQ.Socket sub = ctx.createSocket(SocketType.SUB);
            sub.subscribe("kv@pool".getBytes(StandardCharsets.UTF_8));
            sub.setReceiveTimeOut(200);
            sub.connect(p.endpoint());
            byte[] probe = key("00000000000000ff");
            List<byte[]> m = firstMessage(sub, () -> p.sink().stored(List.of(probe), Medium.CPU));
            assertThat(m).hasSize(3);
            assertThat(new String(m.get(0), StandardCharsets.UTF_8)).isEqualTo("kv@pool");
            long previous = seq(m.get(1));
            assertThat(previous).isGreaterThanOrEqualTo(first);
            EventBatchReader.Batch b = EventBatchReader.read(m.get(2));
            assertThat(b.ts()).isEqualTo(1_700_000_000.5);
            assertThat(b.events()).first().isEqualTo(new EventBatchReader.Event("BlockStored", List.of(255L), "CPU"));

            p.sink().stored(List.of(key("0000000000000001")), Medium.CPU);
            p.sink().removed(List.of(key("0000000000000001")), Medium.CPU);
            p.sink().stored(List.of(key("0000000000000001")), Medium.STORAGE);
            p.sink().allCleared();
            List<EventBatchReader.Event> seen = new ArrayList<>();
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (!seen.contains(new EventBatchReader.Event("AllBlocksCleared", List.of(), null))) {
                assertThat(System.nanoTime()).as("the events arrive").isLessThan(deadline);
                List<byte[]> next = receive(sub);
                if (next == null) {
                    continue;
                }
                long s = seq(next.get(1));
                assertThat(s).as("consecutive sequence numbers").isEqualTo(previous + 1);
                previous = s;
                seen.addAll(EventBatchReader.read(next.get(2)).events());
            }
            // the probe may have been announced more times than the subscriber heard; the rest came in order
            assertThat(seen.stream().filter(e -> !e.blockHashes().equals(List.of(255L))).toList()).containsExactly(
                    new EventBatchReader.Event("BlockStored", List.of(1L), "CPU"),
                    new EventBatchReader.Event("BlockRemoved", List.of(1L), "CPU"),
                    new EventBatchReader.Event("BlockStored", List.of(1L), "STORAGE"),
                    new EventBatchReader.Event("AllBlocksCleared", List.of(), null));
            long last = previous;
            assertThat(p.lastSequence()).isEqualTo(last);

            ZMQ.Socket dealer = ctx.createSocket(SocketType.DEALER);
            dealer.setReceiveTimeOut(30_000);
            dealer.connect(p.replayEndpoint());
            // not three frames at the ROUTER (identity, empty, start): ignored, as vLLM ignores it
            dealer.send(KvEventPublisher.seqBytes(0), 0);
            List<Long> all = replay(dealer, 0);
            assertThat(all).as("every batch, oldest first").hasSize((int) (last - first + 1));
            assertThat(all.getFirst()).isEqualTo(first);
            assertThat(all.getLast()).isEqualTo(last);
            assertThat(replay(dealer, last)).containsExactly(last);
            assertThat(replay(dealer, last + 1)).isEmpty();
            assertThat(p.replays()).isEqualTo(3);
        }
    }

    /** Asks for every batch from {@code start}; returns their sequence numbers, checked up to the end marker. */
    private static List<Long> replay(ZMQ.Socket dealer, long start) {
        dealer.sendMore(new byte[0]);
        dealer.send(KvEventPublisher.seqBytes(start), 0);
        List<Long> seqs = new ArrayList<>();
        while (true) {
            List<byte[]> m = receive(dealer);
            assertThat(m).as("a replay reply").isNotNull().hasSize(4);
            assertThat(m.get(0)).as("the empty delimiter").isEmpty();
            long s = seq(m.get(2));
            if (s == -1) {
                assertThat(m.get(1)).as("the end marker's topic").isEmpty();
                assertThat(m.get(3)).as("the end marker's payload").isEmpty();
                return seqs;
            }
            assertThat(new String(m.get(1), StandardCharsets.UTF_8)).isEqualTo("kv@pool");
            EventBatchReader.read(m.get(3));
            seqs.add(s);
        }
    }

    @Test
    void closeSendsWhatIsWaiting() throws Exception {
        KvEventPublisher p = new KvEventPublisher(KvEventsConfig.at("tcp://127.0.0.1:*"), 0, CLOCK);
        for (int i = 0; i < 100; i++) {
            p.sink().stored(List.of(key("%016x".formatted(i))), Medium.CPU);
        }
        p.close();
        assertThat(p.publishedEvents() + p.droppedEvents()).isEqualTo(100);
        assertThat(p.droppedEvents()).isZero();
        assertThat(p.lastSequence()).isEqualTo(p.publishedBatches() - 1);
    }

    @Test
    void aPortInUseIsRefusedNamingTheFlag() throws Exception {
        try (KvEventPublisher p = new KvEventPublisher(KvEventsConfig.at("tcp://127.0.0.1:*"), 0, CLOCK)) {
            org.assertj.core.api.Assertions.assertThatThrownBy(() -> new KvEventPublisher(KvEventsConfig.at(p.endpoint()),
                    0, CLOCK)).hasMessageContaining("--kv-events-endpoint").hasMessageContaining(p.endpoint())
                    .hasMessageContaining("in use");
        }
    }

    @Test
    void sequencesOfLaterLeadershipsStartHigher() {
        assertThat(KvEventPublisher.firstSequence(0)).isZero();
        assertThat(KvEventPublisher.firstSequence(1)).isEqualTo(1L << 32);
        assertThat(KvEventPublisher.firstSequence(1_000_000)).isGreaterThan(KvEventPublisher.firstSequence(999_999));
        assertThat(KvEventPublisher.firstSequence(Long.MAX_VALUE)).isPositive();
        assertThat(KvEventPublisher.startOf(new byte[]{0, 0, 0, 0, 0, 0, 0, 0, 0, 7})).isEqualTo(7);
        assertThat(KvEventPublisher.startOf(new byte[]{1, 0, 0, 0, 0, 0, 0, 0, 0, 7})).isEqualTo(-1);
        assertThat(KvEventPublisher.startOf(new byte[]{1, 2})).isEqualTo(0x102);
    }
}

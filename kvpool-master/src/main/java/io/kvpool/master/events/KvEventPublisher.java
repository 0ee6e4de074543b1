package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.zeromq.SocketType;
import org.zeromq.ZContext;
import org.zeromq.ZMQ;
import org.zeromq.ZMQException;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.InstantSource;
import java.util.ArrayList;
import java.util.List;

/**
 * Publishes what the master lists as KV events in vLLM's wire format, for routers (Dynamo, llm-d):
 * a ZMQ PUB socket, and a ROUTER socket that replays recent batches on request, as vLLM's
 * {@code ZmqEventPublisher} does (vLLM 0.32, {@code vllm/distributed/kv_events.py}).
 *
 * <h2>Threads and back-pressure</h2>
 * The master's threads call the {@link #sink()}, an {@link EventQueue} of {@code queueSize} events: an
 * offer never waits, and an event that finds the queue full is dropped and counted
 * ({@code master_kv_events_dropped_total}). One publisher thread, started here, owns both sockets (a
 * ZMQ socket belongs to one thread): it takes the first waiting event, with it everything else waiting
 * (at most {@link #MAX_BATCH_EVENTS}), and sends that as one batch, so batches grow with the load and an
 * idle pool sends nothing. The PUB socket never blocks: a subscriber that falls {@code hwm} messages
 * behind loses messages (ZMQ drops them and does not say); it can ask for them again by sequence number
 * from the replay socket. Between batches, and at least every {@link #POLL_MILLIS} ms, the thread
 * answers waiting replay requests. So a slow subscriber costs the master nothing, and a slow publisher
 * costs it only dropped events.
 *
 * <h2>Frames</h2>
 * <pre>
 *  PUB, one message per batch:
 *  +----------------+-------------------------------+------------------------------+
 *  | topic (UTF-8)  | seq: 8 bytes, big-endian      | payload: msgpack EventBatch  |
 *  +----------------+-------------------------------+------------------------------+
 *
 *  replay request, received on the ROUTER (a DEALER client sends [empty, start]):
 *  +----------------+-------+-------------------------------+
 *  | identity       | empty | start seq: 8 bytes big-endian |
 *  +----------------+-------+-------------------------------+
 *
 *  replay reply: one message per batch kept with seq >= start, oldest first, then the end marker
 *  +----------+-------+-------+---------+---------+      +----------+-------+----+---------------+----+
 *  | identity | empty | topic | seq (8) | payload | ...  | identity | empty | "" | -1 (8 bytes)  | "" |
 *  +----------+-------+-------+---------+---------+      +----------+-------+----+---------------+----+
 * </pre>
 * The payload is {@link EventBatchCodec}'s. A request of other than three frames is ignored with a
 * warning, as vLLM ignores it.
 *
 * <h2>Sequence numbers across master failovers</h2>
 * vLLM numbers batches from 0. An elected master (docs/architecture.md, "Masters elected through
 * etcd") starts its stream at {@link #firstSequence}{@code (term)} = term &lt;&lt; 32: the term is the
 * etcd revision that created the leader key, so it rises with every leadership, and a new leader's
 * numbers are above every number an earlier leader sent (unless one leader sent 2^32 batches). A
 * subscriber that sees the sequence jump forward (a failover, or lost messages) asks the replay socket
 * of the new stream for what it missed; after a failover the replay starts at the new leader's first
 * batch, and the new leader announces, as {@code BlockStored}, everything it rebuilds from the nodes'
 * inventories. A single master (term 0) starts at 0, as vLLM does, and so does a single master after a
 * restart: a subscriber that sees the sequence go back has met a new stream.
 */
public final class KvEventPublisher implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(KvEventPublisher.class);

    /** Most events in one batch (an eviction round's thousands of keys go out in a few). */
    static final int MAX_BATCH_EVENTS = 1024;
    /** Longest the publisher thread waits for an event before it looks at the replay socket again. */
    static final long POLL_MILLIS = 10;
    /** The end marker's sequence number: -1, as vLLM's {@code END_SEQ}. */
    private static final byte[] END_SEQ = seqBytes(-1);
    private static final byte[] EMPTY = new byte[0];

    private final KvEventsConfig config;
    private final InstantSource clock;
    private final EventQueue queue;
    private final BlockInfoTable infos;
    /** Holds a store back for its parent (publisher thread only). */
    private final ChainOrder chains;
    private final ReplayBuffer buffer;
    private final byte[] topic;
    private final ZContext context;
    private final ZMQ.Socket pub;
    private final ZMQ.Socket replay;
    private final String boundEndpoint;
    private final String boundReplayEndpoint;
    private final Thread thread;
    private volatile boolean running = true;

    /** The next batch's sequence number (publisher thread only). */
    private long nextSeq;
    private volatile long lastSeq = -1;
    private volatile long publishedEvents;
    private volatile long publishedBatches;
    private volatile long replays;

    /**
     * Binds the sockets and starts the publisher thread.
     *
     * @param firstSeq the first batch's sequence number ({@link #firstSequence})
     * @throws IOException an endpoint cannot be bound (naming the flag and the endpoint)
     */
    public KvEventPublisher(KvEventsConfig config, long firstSeq, InstantSource clock) throws IOException {
        if (!config.enabled()) {
            throw new IllegalArgumentException("KV events are off: there is nothing to publish");
        }
        this.config = config;
        this.clock = clock;
        this.queue = new EventQueue(config.queueSize());
        this.infos = new BlockInfoTable(config.infoBytes());
        this.chains = new ChainOrder(infos::get, System::nanoTime);
        this.buffer = new ReplayBuffer(config.bufferSteps());
        this.topic = config.topic().getBytes(StandardCharsets.UTF_8);
        this.nextSeq = firstSeq;
        this.context = new ZContext();
        try {
            this.pub = context.createSocket(SocketType.PUB);
            pub.setSndHWM(config.hwm());
            this.boundEndpoint = bind(pub, config.endpoint(), "--kv-events-endpoint");
            if (config.replayEndpoint() != null) {
                this.replay = context.createSocket(SocketType.ROUTER);
                this.boundReplayEndpoint = bind(replay, config.replayEndpoint(), "--kv-events-replay-endpoint");
            } else {
                this.replay = null;
                this.boundReplayEndpoint = null;
            }
        } catch (IOException | RuntimeException e) {
            context.close();
            throw e;
        }
        this.thread = Thread.ofPlatform().daemon().name("kvpool-kv-events").start(this::run);
        log.info("KV events: publishing on {}{}, topic '{}', from sequence {}", boundEndpoint,
                boundReplayEndpoint == null ? "" : ", replay on " + boundReplayEndpoint, config.topic(), firstSeq);
    }

    /**
     * Where a leadership of {@code term} starts its stream: {@code term << 32} (0 for a single master).
     * Terms past 2^31 - 1 (an etcd that made two billion revisions) all start at the last such value.
     */
    public static long firstSequence(long term) {
        return Math.min(Math.max(term, 0), Integer.MAX_VALUE) << 32;
    }

    private static String bind(ZMQ.Socket socket, String endpoint, String flag) throws IOException {
        try {
            socket.bind(endpoint);
        } catch (ZMQException e) {
            throw new IOException("master: cannot bind the KV events socket (" + flag + ") to " + endpoint + ": "
                    + ZMQ.Error.findByCode(e.getErrorCode()).getMessage(), e);
        } catch (IllegalArgumentException e) {
            throw new IOException("master: cannot bind the KV events socket (" + flag + ") to " + endpoint + ": "
                    + e.getMessage(), e);
        }
        return socket.getLastEndpoint();
    }

    /** Where the master's threads hand their events. */
    public KvEventSink sink() {
        return queue;
    }

    /**
     * Keeps what a connector said of the blocks of {@code keys} (BLOCK_INFO) for their {@code BlockStored}
     * events (events already sent are not sent again). Returns how many are kept: all, unless
     * {@code --kv-events-info-bytes} is too small for them. Any thread; never waits for the publisher.
     */
    public int describe(List<byte[]> keys, List<BlockInfo> blockInfos) {
        for (int i = 0; i < keys.size(); i++) {
            infos.put(keys.get(i), blockInfos.get(i));
        }
        int kept = 0;
        for (byte[] k : keys) {
            kept += infos.get(k) != null ? 1 : 0;
        }
        return kept;
    }

    /** Block infos kept now, and their estimated bytes. */
    public int blockInfos() {
        return infos.size();
    }

    public long blockInfoBytes() {
        return infos.bytes();
    }

    /** Block infos let go for room. */
    public long blockInfosLetGo() {
        return infos.letGo();
    }

    /** The PUB socket's endpoint as bound (a port of {@code *} or 0 resolved). */
    public String endpoint() {
        return boundEndpoint;
    }

    /** The replay socket's endpoint as bound, or null without replay. */
    public String replayEndpoint() {
        return boundReplayEndpoint;
    }

    /** Events sent (an event of several keys counts once per event the master handed over). */
    public long publishedEvents() {
        return publishedEvents;
    }

    /** Batches sent. */
    public long publishedBatches() {
        return publishedBatches;
    }

    /** Events dropped because the queue was full. */
    public long droppedEvents() {
        return queue.dropped();
    }

    /** The last batch's sequence number, or -1 before the first. */
    public long lastSequence() {
        return lastSeq;
    }

    /** Replay requests answered. */
    public long replays() {
        return replays;
    }

    /** Events waiting for the publisher thread now. */
    public int queued() {
        return queue.size();
    }

    private void run() {
        List<KvEvent> batch = new ArrayList<>();
        try {
            while (running) {
                serveReplays();
                KvEvent first = queue.poll(POLL_MILLIS);
                if (first != null) {
                    batch.add(first);
                    queue.drainTo(batch, MAX_BATCH_EVENTS - 1);
                }
                if (first != null || chains.holding()) {
                    publish(chains.next(batch));
                    batch.clear();
                }
            }
            // closing: what is waiting now still goes out (the master stopped handing events over)
            while (queue.drainTo(batch, MAX_BATCH_EVENTS) > 0 || chains.holding()) {
                publish(chains.next(batch));
                batch.clear();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (RuntimeException e) {
            log.error("KV events: the publisher stopped; routers hear nothing more from this master", e);
        } finally {
            context.close();
        }
    }

    private void publish(List<KvEvent> batch) {
        if (batch.isEmpty()) {
            return; // every store of the cycle waits for its parent
        }
        Instant now = clock.instant();
        byte[] payload = EventBatchCodec.encode(now.getEpochSecond() + now.getNano() / 1e9, batch, infos::get);
        long seq = nextSeq++;
        try {
            pub.sendMore(topic);
            pub.sendMore(seqBytes(seq));
            pub.send(payload, 0);
        } catch (ZMQException e) {
            log.warn("KV events: batch {} not sent ({}); it can still be replayed", seq, e.getMessage());
        }
        buffer.add(seq, payload);
        lastSeq = seq;
        publishedEvents += batch.size();
        publishedBatches++;
    }

    /** Answers every replay request waiting now. */
    private void serveReplays() {
        if (replay == null) {
            return;
        }
        byte[] first;
        while ((first = replay.recv(ZMQ.DONTWAIT)) != null) {
            List<byte[]> frames = new ArrayList<>(3);
            frames.add(first);
            while (replay.hasReceiveMore()) {
                frames.add(replay.recv(0));
            }
            if (frames.size() != 3) {
                log.warn("KV events: a replay request of {} frames ignored (identity, empty, 8-byte start sequence"
                        + " expected)", frames.size());
                continue;
            }
            byte[] identity = frames.getFirst();
            buffer.forEachFrom(startOf(frames.get(2)), (seq, payload) -> {
                replay.sendMore(identity);
                replay.sendMore(EMPTY);
                replay.sendMore(topic);
                replay.sendMore(seqBytes(seq));
                replay.send(payload, ZMQ.DONTWAIT);
            });
            replay.sendMore(identity);
            replay.sendMore(EMPTY);
            replay.sendMore(EMPTY);
            replay.sendMore(END_SEQ);
            replay.send(EMPTY, ZMQ.DONTWAIT);
            replays++;
        }
    }

    /**
     * A replay request's start sequence: the frame read as an unsigned big-endian number, as vLLM
     * reads it ({@code int.from_bytes(b, "big")}); one past every sequence if it is longer than 8 bytes
     * and does not fit.
     */
    static long startOf(byte[] b) {
        long v = 0;
        for (int i = 0; i < b.length; i++) {
            if (i < b.length - 8) {
                if (b[i] != 0) {
                    return -1; // 2^64 - 1 unsigned: no batch has it
                }
                continue;
            }
            v = (v << 8) | (b[i] & 0xFF);
        }
        return v;
    }

    static byte[] seqBytes(long seq) {
        return ByteBuffer.allocate(8).putLong(seq).array();
    }

    /** Stops the thread once it sent what is waiting, and closes the sockets. */
    @Override
    public void close() {
        if (!running) {
            return;
        }
        running = false;
        try {
            thread.join(5_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (thread.isAlive()) {
            log.warn("KV events: the publisher thread did not stop within 5 s");
        }
    }

    @Override
    public String toString() {
        return "KV events on " + boundEndpoint + (boundReplayEndpoint == null ? "" : " (replay " + boundReplayEndpoint + ")")
                + ", topic '" + config.topic() + "'";
    }
}

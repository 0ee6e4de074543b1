package io.kvpool.master.events;

import java.util.regex.Pattern;

/**
 * KV events for routers, as the master is configured (docs/operations.md, "KV events"). vLLM's
 * {@code KVEventsConfig} under the same names where it has them, with its defaults.
 *
 * @param endpoint       where the PUB socket binds ({@code --kv-events-endpoint}), e.g. {@code tcp://*:5557}
 *                       (a port of {@code *} or 0 picks a free one); null: no events
 * @param replayEndpoint where the ROUTER socket that answers replay requests binds
 *                       ({@code --kv-events-replay-endpoint}); null: no replay
 * @param topic          the first frame of every message ({@code --kv-events-topic}); vLLM's default is empty
 * @param bufferSteps    batches kept for replay ({@code --kv-events-buffer-steps}; vLLM's {@code buffer_steps})
 * @param queueSize      events waiting for the publisher at most; more are dropped and counted
 *                       ({@code --kv-events-queue-size}; vLLM's {@code max_queue_size}, in events, not batches)
 * @param hwm            messages the PUB socket queues per subscriber before it drops
 *                       ({@code --kv-events-hwm}; vLLM's {@code hwm}; 0: no limit)
 * @param infoBytes      memory for the block infos connectors send (tokens, parent hash, block size, LoRA, salt)
 *                       for the events' {@code BlockStored} ({@code --kv-events-info-bytes}); the oldest are let go
 *                       beyond it; 0 keeps none
 */
public record KvEventsConfig(String endpoint, String replayEndpoint, String topic, int bufferSteps, int queueSize,
                             int hwm, long infoBytes) {

    /** vLLM's default endpoint, to bind when events are turned on without one. */
    public static final String DEFAULT_ENDPOINT = "tcp://*:5557";
    public static final String DEFAULT_TOPIC = "";
    public static final int DEFAULT_BUFFER_STEPS = 10_000;
    public static final int DEFAULT_QUEUE_SIZE = 100_000;
    public static final int DEFAULT_HWM = 100_000;
    /** 64 MiB: about 400,000 blocks of 16 tokens. */
    public static final long DEFAULT_INFO_BYTES = 64L << 20;
    /** Most batches kept for replay: a batch can hold thousands of hashes. */
    public static final int MAX_BUFFER_STEPS = 1_000_000;
    /** Most events waiting: a removed or stored key is about its own length in memory. */
    public static final int MAX_QUEUE_SIZE = 10_000_000;

    /** Events off. */
    public static final KvEventsConfig OFF = new KvEventsConfig(null, null, DEFAULT_TOPIC, DEFAULT_BUFFER_STEPS,
            DEFAULT_QUEUE_SIZE, DEFAULT_HWM, DEFAULT_INFO_BYTES);

    private static final Pattern ENDPOINT = Pattern.compile("tcp://(\\[[0-9A-Fa-f:.]+]|[^\\s:/\\[\\]]+):(\\*|\\d{1,5})"
            + "|ipc://\\S+|inproc://\\S+");

    public KvEventsConfig {
        if (endpoint != null) {
            checkEndpoint("KV events endpoint (--kv-events-endpoint)", endpoint);
        }
        if (replayEndpoint != null) {
            if (endpoint == null) {
                throw new IllegalArgumentException("master: a KV events replay endpoint (--kv-events-replay-endpoint)"
                        + " needs the events endpoint (--kv-events-endpoint) too");
            }
            checkEndpoint("KV events replay endpoint (--kv-events-replay-endpoint)", replayEndpoint);
            if (replayEndpoint.equals(endpoint) && !endpoint.endsWith(":*") && !endpoint.endsWith(":0")) {
                throw new IllegalArgumentException("master: the KV events replay endpoint (--kv-events-replay-endpoint)"
                        + " must differ from the events endpoint (--kv-events-endpoint), both are " + endpoint);
            }
        }
        if (topic == null) {
            throw new IllegalArgumentException("master: KV events topic (--kv-events-topic) must not be null (\"\" for none)");
        }
        if (bufferSteps < 1 || bufferSteps > MAX_BUFFER_STEPS) {
            throw new IllegalArgumentException("master: KV events buffer steps (--kv-events-buffer-steps) must be 1.."
                    + MAX_BUFFER_STEPS + ", got " + bufferSteps);
        }
        if (queueSize < 1 || queueSize > MAX_QUEUE_SIZE) {
            throw new IllegalArgumentException("master: KV events queue size (--kv-events-queue-size) must be 1.."
                    + MAX_QUEUE_SIZE + ", got " + queueSize);
        }
        if (hwm < 0) {
            throw new IllegalArgumentException("master: KV events high-water mark (--kv-events-hwm) must be 0 (no limit)"
                    + " or more, got " + hwm);
        }
        if (infoBytes < 0) {
            throw new IllegalArgumentException("master: KV events block info memory (--kv-events-info-bytes) must be 0"
                    + " (keep none) or more, got " + infoBytes);
        }
    }

    private static void checkEndpoint(String what, String endpoint) {
        var m = ENDPOINT.matcher(endpoint);
        if (!m.matches()) {
            throw new IllegalArgumentException("master: " + what + " '" + endpoint + "' must be tcp://HOST:PORT"
                    + " (HOST may be *, PORT may be * for a free one), ipc://PATH or inproc://NAME");
        }
        if (endpoint.startsWith("tcp://") && !m.group(2).equals("*") && Integer.parseInt(m.group(2)) > 65535) {
            throw new IllegalArgumentException("master: " + what + " '" + endpoint + "': port " + m.group(2)
                    + " is out of range 0..65535");
        }
    }

    /** Whether the master publishes events. */
    public boolean enabled() {
        return endpoint != null;
    }

    /** Events on at {@code endpoint}, the rest at vLLM's defaults. */
    public static KvEventsConfig at(String endpoint) {
        return new KvEventsConfig(endpoint, null, DEFAULT_TOPIC, DEFAULT_BUFFER_STEPS, DEFAULT_QUEUE_SIZE, DEFAULT_HWM,
                DEFAULT_INFO_BYTES);
    }

    public KvEventsConfig withReplay(String replay) {
        return new KvEventsConfig(endpoint, replay, topic, bufferSteps, queueSize, hwm, infoBytes);
    }

    public KvEventsConfig withTopic(String t) {
        return new KvEventsConfig(endpoint, replayEndpoint, t, bufferSteps, queueSize, hwm, infoBytes);
    }

    public KvEventsConfig withBufferSteps(int n) {
        return new KvEventsConfig(endpoint, replayEndpoint, topic, n, queueSize, hwm, infoBytes);
    }

    public KvEventsConfig withQueueSize(int n) {
        return new KvEventsConfig(endpoint, replayEndpoint, topic, bufferSteps, n, hwm, infoBytes);
    }

    public KvEventsConfig withInfoBytes(long n) {
        return new KvEventsConfig(endpoint, replayEndpoint, topic, bufferSteps, queueSize, hwm, n);
    }
}

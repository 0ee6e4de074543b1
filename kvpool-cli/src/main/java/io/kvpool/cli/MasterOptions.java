package io.kvpool.cli;

import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.Tenant;
import io.kvpool.master.events.KvEventsConfig;
import io.kvpool.protocol.Secrets;
import picocli.CommandLine.Option;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/** Master flags, shared by {@code kvpool master} and {@code kvpool serve}. */
final class MasterOptions {

    @Option(names = "--port", paramLabel = "PORT", description = "Master RPC port (default: ${DEFAULT-VALUE}).")
    int port = MasterConfig.DEFAULT_PORT;

    @Option(names = "--http-port", paramLabel = "PORT",
            description = "Port for /metrics and /health; -1 turns HTTP off (default: ${DEFAULT-VALUE}).")
    int httpPort = MasterConfig.DEFAULT_HTTP_PORT;

    @Option(names = "--node-ttl", paramLabel = "DURATION",
            description = "Drop a node after this long without a heartbeat (default: 10s).")
    Duration nodeTtl = MasterConfig.DEFAULT_NODE_TTL;

    @Option(names = "--read-lease", paramLabel = "DURATION",
            description = "How long a client may read from locations it remembers without hearing from the master;"
                    + " also the longest a removal or reset waits for a client that does not answer (default: 2s).")
    Duration readLease = MasterConfig.DEFAULT_READ_LEASE;

    @Option(names = "--put-timeout", paramLabel = "DURATION",
            description = "Reclaim a put not completed within this long (default: 30s).")
    Duration putTimeout = MasterConfig.DEFAULT_PUT_TIMEOUT;

    @Option(names = "--eviction-high-watermark", paramLabel = "FRACTION",
            description = "Start evicting when this fraction of capacity is used (default: ${DEFAULT-VALUE}).")
    double highWatermark = MasterConfig.DEFAULT_HIGH_WATERMARK;

    @Option(names = "--eviction-ratio", paramLabel = "FRACTION",
            description = "Each eviction round frees this fraction of capacity (default: ${DEFAULT-VALUE}).")
    double evictionRatio = MasterConfig.DEFAULT_EVICTION_RATIO;

    @Option(names = "--max-value-size", paramLabel = "SIZE", description = "Largest value accepted (default: 256MiB).")
    Size maxValueSize = MasterConfig.DEFAULT_MAX_VALUE_SIZE;

    @Option(names = "--replicas", paramLabel = "N",
            description = "Copies per object unless a client asks otherwise, best effort (default: ${DEFAULT-VALUE}).")
    int replicas = 1;

    @Option(names = "--max-pinned", paramLabel = "FRACTION",
            description = "Most of the memory capacity pinned objects may hold; a pin past it is refused and the"
                    + " object stored unpinned (default: ${DEFAULT-VALUE}).")
    double maxPinned = MasterConfig.DEFAULT_MAX_PINNED;

    @Option(names = "--summary-interval", paramLabel = "DURATION",
            description = "Log a one-line summary this often; 0s turns it off (default: 10s).")
    Duration summaryInterval = MasterConfig.DEFAULT_SUMMARY_INTERVAL;

    @Option(names = "--kv-events-endpoint", paramLabel = "ENDPOINT",
            description = "Publish KV events for routers (vLLM's format: ZMQ PUB, msgpack) on this endpoint, which the"
                    + " master binds: tcp://HOST:PORT (PORT * picks a free one), ipc://PATH or inproc://NAME; vLLM's"
                    + " default is tcp://*:5557 (default: off).")
    String kvEventsEndpoint;

    @Option(names = "--kv-events-replay-endpoint", paramLabel = "ENDPOINT",
            description = "Answer KV event replay requests (an 8-byte start sequence) on this ROUTER endpoint"
                    + " (default: no replay).")
    String kvEventsReplayEndpoint;

    @Option(names = "--kv-events-topic", paramLabel = "TOPIC",
            description = "The topic frame of every KV event message (default: empty, as vLLM's).")
    String kvEventsTopic = KvEventsConfig.DEFAULT_TOPIC;

    @Option(names = "--kv-events-buffer-steps", paramLabel = "N",
            description = "KV event batches kept for replay (default: ${DEFAULT-VALUE}).")
    int kvEventsBufferSteps = KvEventsConfig.DEFAULT_BUFFER_STEPS;

    @Option(names = "--kv-events-queue-size", paramLabel = "N",
            description = "KV events waiting for the publisher at most; more are dropped and counted in"
                    + " master_kv_events_dropped_total (default: ${DEFAULT-VALUE}).")
    int kvEventsQueueSize = KvEventsConfig.DEFAULT_QUEUE_SIZE;

    @Option(names = "--kv-events-hwm", paramLabel = "N",
            description = "KV event messages queued per subscriber before ZMQ drops them; 0: no limit"
                    + " (default: ${DEFAULT-VALUE}).")
    int kvEventsHwm = KvEventsConfig.DEFAULT_HWM;

    @Option(names = "--kv-events-info-bytes", paramLabel = "SIZE",
            description = "Memory for the block infos connectors send (tokens, parent hash, block size, LoRA, salt) for"
                    + " the KV events' BlockStored; the oldest are let go beyond it; 0 keeps none (default: 64MiB).")
    Size kvEventsInfoBytes = Size.ofBytes(KvEventsConfig.DEFAULT_INFO_BYTES);

    @Option(names = "--tenant", paramLabel = "NAME=PREFIX[,PREFIX...]:MEMORY[:DISK[:refuse|evict]]",
            description = "A namespace of keys by prefix and its quotas (repeatable): MEMORY and DISK are sizes or"
                    + " none; over its memory quota a put is refused (QUOTA_EXCEEDED) or evicts the tenant's own"
                    + " objects. An elected master takes the list kept in etcd instead, once one was set at run time"
                    + " (PUT /api/tenants). Default: no tenants.")
    List<String> tenants = new ArrayList<>();

    @Option(names = "--tenants-file", paramLabel = "FILE",
            description = "Tenants as JSON, {\"tenants\": [{\"name\", \"prefixes\", \"memory\", \"disk\","
                    + " \"over_quota\"}]} (what kvpool launch writes from the offload config's tenants; added to --tenant).")
    java.nio.file.Path tenantsFile;

    private List<Tenant> tenantList() {
        List<Tenant> out = new ArrayList<>(tenants.stream().map(Tenant::parse).toList());
        if (tenantsFile != null) {
            try {
                out.addAll(Tenant.fromJson(java.nio.file.Files.readString(tenantsFile)));
            } catch (java.io.IOException e) {
                throw new IllegalArgumentException("--tenants-file " + tenantsFile + ": cannot read it: " + e.getMessage(), e);
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("--tenants-file " + tenantsFile + ": " + e.getMessage(), e);
            }
        }
        return out;
    }

    /** Builds the typed config; a bad combination raises IllegalArgumentException naming the field. */
    MasterConfig toConfig(String listenHost, ExposureOptions exposure) {
        MasterConfig d = MasterConfig.defaults();
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, d.clientTtl(), readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, replicas, d.tickInterval(), summaryInterval, d.frameTimeout(),
                exposure.apply(d.limits()), 0, maxPinned, Secrets.NONE, new KvEventsConfig(kvEventsEndpoint,
                kvEventsReplayEndpoint, kvEventsTopic, kvEventsBufferSteps, kvEventsQueueSize, kvEventsHwm,
                kvEventsInfoBytes.bytes()), tenantList())
                .withSecrets(exposure.secrets("master", listenHost)); // after the flags' own checks
    }
}

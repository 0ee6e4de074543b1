package io.kvpool.master;

import io.kvpool.config.Durations;
import io.kvpool.config.Size;
import io.kvpool.master.events.KvEventsConfig;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Tls;

import java.time.Duration;
import java.util.List;

/**
 * Everything the master is configured with, typed, with defaults in one place.
 *
 * @param listenHost        interface for the RPC and HTTP ports
 * @param port              RPC port (clients and nodes); 0 picks a free one
 * @param httpPort          HTTP port for /metrics and /health; 0 picks a free one, -1 disables HTTP
 * @param nodeTtl           a node silent this long is dropped and its objects become misses
 * @param clientTtl         a client silent this long no longer counts as active
 * @param readLease         how long a client may read from locations it remembers without hearing from the
 *                          master; also the longest a removal, reset or upsert waits for a client that does
 *                          not answer (see {@code ReadLeases})
 * @param putTimeout        a put reserved but not completed within this long is revoked (dead writer)
 * @param highWatermark     eviction starts when used/capacity reaches this fraction
 * @param evictionRatio     each eviction round frees this fraction of capacity
 * @param maxValueSize      largest value accepted
 * @param defaultReplicas   copies per object when the client does not ask for a number
 * @param tickInterval      how often timers (TTL, put timeout, watermark) are checked
 * @param summaryInterval   how often the one-line summary is logged; zero disables it
 * @param frameTimeout      how long a frame may take to arrive once it began
 * @param limits            frame size limits
 * @param term              the leadership term this master serves (docs/architecture.md, "Masters
 *                          elected through etcd"); 0 for a master that is not elected. Not a flag: the
 *                          election sets it for each leadership.
 * @param maxPinnedFraction most of the memory capacity pinned objects may hold (their regions times
 *                          their copies); a put asking for a pin past it is stored unpinned, and says so
 * @param secrets           what connections prove ({@link Secrets#NONE}: an open master)
 * @param kvEvents          KV events for routers ({@link KvEventsConfig#OFF} by default)
 * @param tenants           namespaces by key prefix and their quotas ({@link Tenant}; none by default); an elected
 *                          master takes the list kept in etcd instead when there is one (changed at run time)
 */
public record MasterConfig(String listenHost, int port, int httpPort, Duration nodeTtl, Duration clientTtl,
                           Duration readLease, Duration putTimeout, double highWatermark, double evictionRatio, Size maxValueSize,
                           int defaultReplicas, Duration tickInterval, Duration summaryInterval, Duration frameTimeout,
                           Limits limits, long term, double maxPinnedFraction, Secrets secrets,
                           KvEventsConfig kvEvents, List<Tenant> tenants) {

    public static final int DEFAULT_PORT = 50051;
    public static final int DEFAULT_HTTP_PORT = 9003;
    /** A node is dropped after this much silence (ten missed heartbeats at the default interval). */
    public static final Duration DEFAULT_NODE_TTL = Duration.ofSeconds(10);
    public static final Duration DEFAULT_CLIENT_TTL = Duration.ofSeconds(10);
    /**
     * A client's read lease: bounds how long a removal or reset can wait for a frozen or partitioned
     * client (about this plus 1% and 50 ms); renewed about four times per lease by a long poll.
     */
    public static final Duration DEFAULT_READ_LEASE = Duration.ofSeconds(2);
    /** Shortest read lease accepted: renewals come every quarter lease. */
    public static final Duration MIN_READ_LEASE = Duration.ofMillis(100);
    /** A reserved put must complete within this long, or its space is reclaimed. */
    public static final Duration DEFAULT_PUT_TIMEOUT = Duration.ofSeconds(30);
    /** Fraction of capacity in use at which eviction starts. */
    public static final double DEFAULT_HIGH_WATERMARK = 0.90;
    /** Fraction of capacity one eviction round frees. */
    public static final double DEFAULT_EVICTION_RATIO = 0.05;
    public static final Size DEFAULT_MAX_VALUE_SIZE = Size.ofMiB(256);
    public static final Duration DEFAULT_TICK = Duration.ofMillis(200);
    public static final Duration DEFAULT_SUMMARY_INTERVAL = Duration.ofSeconds(10);
    /** Pins may hold at most this fraction of the memory capacity. */
    public static final double DEFAULT_MAX_PINNED = 0.25;
    /** Most replicas an object can have. */
    public static final int MAX_REPLICAS = 8;

    public MasterConfig {
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("master: port (--port) " + port + " is out of range 0..65535");
        }
        if (httpPort < -1 || httpPort > 65535) {
            throw new IllegalArgumentException("master: http port (--http-port) " + httpPort + " is out of range 0..65535 (or -1 to disable)");
        }
        Durations.requirePositive("master: node ttl (--node-ttl)", nodeTtl);
        Durations.requirePositive("master: client ttl", clientTtl);
        if (readLease == null || readLease.compareTo(MIN_READ_LEASE) < 0 || readLease.compareTo(Duration.ofMinutes(10)) > 0) {
            throw new IllegalArgumentException("master: read lease (--read-lease) must be between "
                    + Durations.format(MIN_READ_LEASE) + " and 10m, got " + (readLease == null ? "nothing" : Durations.format(readLease)));
        }
        Durations.requirePositive("master: put timeout (--put-timeout)", putTimeout);
        Durations.requirePositive("master: tick interval", tickInterval);
        Durations.requirePositive("master: frame timeout", frameTimeout);
        if (summaryInterval == null || summaryInterval.isNegative()) {
            throw new IllegalArgumentException("master: summary interval (--summary-interval) must be zero (off) or positive");
        }
        if (term < 0) {
            throw new IllegalArgumentException("master: a leadership term is never negative, got " + term);
        }
        if (!(maxPinnedFraction >= 0 && maxPinnedFraction <= 0.9)) {
            throw new IllegalArgumentException("master: pinned fraction (--max-pinned) must be in [0, 0.9] (pins must"
                    + " leave room for unpinned objects), got " + maxPinnedFraction);
        }
        if (!(highWatermark > 0 && highWatermark <= 1)) {
            throw new IllegalArgumentException("master: eviction high watermark (--eviction-high-watermark) must be in (0, 1], got " + highWatermark);
        }
        if (!(evictionRatio > 0 && evictionRatio <= 1)) {
            throw new IllegalArgumentException("master: eviction ratio (--eviction-ratio) must be in (0, 1], got " + evictionRatio);
        }
        if (defaultReplicas < 1 || defaultReplicas > MAX_REPLICAS) {
            throw new IllegalArgumentException("master: replicas (--replicas) must be 1.." + MAX_REPLICAS + ", got " + defaultReplicas);
        }
        if (maxValueSize == null || maxValueSize.bytes() < 1) {
            throw new IllegalArgumentException("master: max value size (--max-value-size) must be positive");
        }
        if (secrets == null) {
            throw new IllegalArgumentException("master: secrets must not be null (Secrets.NONE for an open master)");
        }
        if (secrets.present() && !secrets.hasAdmin()) {
            throw new IllegalArgumentException("master: the cluster secret needs the admin secret too"
                    + " (--admin-secret-file or KVPOOL_ADMIN_SECRET_FILE)");
        }
        tenants = Tenant.checked(tenants == null ? List.of() : tenants);
        if (kvEvents == null) {
            throw new IllegalArgumentException("master: KV events config must not be null (KvEventsConfig.OFF for none)");
        }
        if (maxValueSize.bytes() > limits.maxPayloadBytes()) {
            throw new IllegalArgumentException("master: max value size (--max-value-size) " + maxValueSize
                    + " exceeds the frame payload limit " + Size.ofBytes(limits.maxPayloadBytes()));
        }
    }

    public static MasterConfig defaults() {
        return new MasterConfig("0.0.0.0", DEFAULT_PORT, DEFAULT_HTTP_PORT, DEFAULT_NODE_TTL, DEFAULT_CLIENT_TTL, DEFAULT_READ_LEASE,
                DEFAULT_PUT_TIMEOUT, DEFAULT_HIGH_WATERMARK, DEFAULT_EVICTION_RATIO, DEFAULT_MAX_VALUE_SIZE, 1,
                DEFAULT_TICK, DEFAULT_SUMMARY_INTERVAL, Duration.ofSeconds(30), Limits.DEFAULT, 0, DEFAULT_MAX_PINNED, Secrets.NONE,
                KvEventsConfig.OFF, List.of());
    }

    /**
     * The TLS identity of this master's port and of its connections to nodes ({@link Tls#NONE}: plain
     * TCP); it travels with the secrets ({@link Secrets#tls()}).
     */
    public Tls tls() {
        return secrets.tls();
    }

    /** This config with {@code t} as its TLS identity ({@link Tls#NONE}: plain TCP). */
    public MasterConfig withTls(Tls t) {
        return withSecrets(secrets.withTls(t));
    }

    /** The secrets this master checks connections against, and proves to nodes ({@link Secrets#NONE}: open). */
    public MasterConfig withSecrets(Secrets s) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term,
                maxPinnedFraction, s, kvEvents, tenants);
    }

    public MasterConfig withListen(String host, int rpcPort, int http) {
        return new MasterConfig(host, rpcPort, http, nodeTtl, clientTtl, readLease, putTimeout, highWatermark, evictionRatio,
                maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    /** The same configuration for the leadership of {@code t}. */
    public MasterConfig withTerm(long t) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, t, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withNodeTtl(Duration d) {
        return new MasterConfig(listenHost, port, httpPort, d, clientTtl, readLease, putTimeout, highWatermark, evictionRatio,
                maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withPutTimeout(Duration d) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, d, highWatermark, evictionRatio,
                maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withEviction(double watermark, double ratio) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, watermark, ratio,
                maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withReplicas(int n) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, n, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withSummaryInterval(Duration d) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, d, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withTickInterval(Duration d) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, d, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withMaxValueSize(Size s) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, s, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withReadLease(Duration d) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, d, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term, maxPinnedFraction, secrets, kvEvents, tenants);
    }

    public MasterConfig withMaxPinned(double fraction) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term,
                fraction, secrets, kvEvents, tenants);
    }

    /** The same configuration with {@code t} as its tenants. */
    public MasterConfig withTenants(List<Tenant> t) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term,
                maxPinnedFraction, secrets, kvEvents, t);
    }

    /** The same configuration publishing KV events as {@code k} says ({@link KvEventsConfig#OFF}: none). */
    public MasterConfig withKvEvents(KvEventsConfig k) {
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, clientTtl, readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, defaultReplicas, tickInterval, summaryInterval, frameTimeout, limits, term,
                maxPinnedFraction, secrets, k, tenants);
    }
}

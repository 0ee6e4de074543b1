package io.kvpool.client;

import io.kvpool.config.Durations;
import io.kvpool.config.HostPort;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.protocol.BusyPoll;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Tls;

import java.time.Duration;

/**
 * How a client reaches and uses the pool. Build one with {@link #forMaster(String)} and the
 * {@code with...} methods; every field has a default.
 *
 * @param master             the master's address, or the etcd endpoints that elect the masters
 * @param preferredSegment   segment to place puts in first ({@code host:port}); null defers to the
 *                           environment variable {@value #PREFERRED_SEGMENT_ENV}, then to a segment on
 *                           this host if there is one
 * @param autoDetectLocal    prefer a segment on this host when nothing more explicit is set
 * @param replicas           copies per object; 0 takes the master's default
 * @param connectTimeout     bound on opening a connection
 * @param requestTimeout     bound on one request and its reply, payload included
 * @param maxConnections     connections kept per peer (master or node); bounds concurrency per peer
 * @param pingInterval       keep-alive period, so the master counts this client as active
 * @param limits             frame size limits (large batches are split to fit)
 * @param sharedMemory       move bytes to and from nodes on this host through their shared-memory
 *                           segment instead of TCP, where it can be mapped
 * @param locationCache      how many objects' locations to remember, so repeated reads skip the master
 *                           round trip (see {@code LocationCache}); 0 asks the master on every read
 * @param diskLoadBudget     most bytes of disk-tier objects this client has in flight at once, over all
 *                           threads and nodes: a batch over it is split into pieces, and a piece waits
 *                           for room (back-pressure); a single larger object takes the whole budget
 * @param tierLog            log one line per batch load: keys and bytes by tier, misses, failures
 *                           (also turned on by the environment variable {@value #TIER_LOG_ENV}=1)
 * @param writeLeases        put single-copy objects under write leases (a node write and a batched
 *                           COMMIT; see docs/architecture.md) instead of the two-phase put; on by default
 * @param busyPoll           how long a connection polls its socket for a reply before it blocks ({@link BusyPoll}):
 *                           on a machine whose idle CPUs sleep, it saves the wake-up of the waiting thread's CPU,
 *                           tens of microseconds a round trip on a VM; a connection whose replies take longer
 *                           polls ever less often, down to one wait in 64. By default the system property
 *                           {@value BusyPoll#PROPERTY} if set, else {@link BusyPoll#DEFAULT};
 *                           {@link Duration#ZERO} turns it off, at most {@link BusyPoll#MAX}
 * @param secrets            what this client proves to secured masters and nodes (docs/security.md): by
 *                           default the environment's ({@code KVPOOL_SECRET_FILE}, {@code KVPOOL_ADMIN_SECRET_FILE});
 *                           {@link Secrets#NONE} talks to open pools only. They carry the client's TLS
 *                           identity too ({@link #tls()})
 */
public record ClientConfig(MasterAddress master, String preferredSegment, boolean autoDetectLocal, int replicas,
                           Duration connectTimeout, Duration requestTimeout, int maxConnections,
                           Duration pingInterval, Limits limits, boolean sharedMemory, int locationCache,
                           long diskLoadBudget, boolean tierLog, boolean writeLeases, Duration busyPoll,
                           Secrets secrets) {

    /** Environment variable naming the preferred segment, set by launchers for node-local placement. */
    public static final String PREFERRED_SEGMENT_ENV = "KVPOOL_PREFERRED_SEGMENT";
    public static final Duration DEFAULT_CONNECT_TIMEOUT = Duration.ofSeconds(3);
    public static final Duration DEFAULT_REQUEST_TIMEOUT = Duration.ofSeconds(30);
    /** Connections per peer: enough for an engine's loader and saver threads to proceed in parallel. */
    public static final int DEFAULT_MAX_CONNECTIONS = 16;
    public static final Duration DEFAULT_PING_INTERVAL = Duration.ofSeconds(2);
    /** Environment variable that turns the per-batch tier log on. */
    public static final String TIER_LOG_ENV = "KVPOOL_TIER_LOG";
    /** Default bound on disk-tier bytes requested from one node at once. */
    public static final long DEFAULT_DISK_LOAD_BUDGET = 256L << 20;
    public static final long MIN_DISK_LOAD_BUDGET = 64L << 10;
    /** Locations remembered by default: a few MiB of heap, enough for the hot blocks of many prompts. */
    public static final int DEFAULT_LOCATION_CACHE = 65_536;

    public ClientConfig {
        if (secrets == null) {
            throw new IllegalArgumentException("client: secrets must not be null (Secrets.NONE for an open pool)");
        }
        if (master == null) {
            throw new IllegalArgumentException("client: master address is required");
        }
        if (replicas < 0 || replicas > 8) {
            throw new IllegalArgumentException("client: replicas must be 0 (master default) to 8, got " + replicas);
        }
        if (maxConnections < 1) {
            throw new IllegalArgumentException("client: maxConnections must be at least 1, got " + maxConnections);
        }
        Durations.requirePositive("client: connect timeout", connectTimeout);
        Durations.requirePositive("client: request timeout", requestTimeout);
        Durations.requirePositive("client: ping interval", pingInterval);
        if (preferredSegment != null && !preferredSegment.isEmpty()) {
            HostPort.parse(preferredSegment); // names the segment in the error if malformed
        }
        if (diskLoadBudget < MIN_DISK_LOAD_BUDGET) {
            throw new IllegalArgumentException("client: diskLoadBudget must be at least " + MIN_DISK_LOAD_BUDGET
                    + " bytes, got " + diskLoadBudget);
        }
        BusyPoll.check("client: busyPoll", busyPoll);
        if (locationCache < 0) {
            throw new IllegalArgumentException("client: locationCache must be 0 (off) or more, got " + locationCache);
        }
    }

    /**
     * A config with defaults for the master at {@code host:port}, or for the masters elected through
     * etcd at {@code etcd://host:port[,host:port...][/cluster]} (the client follows the leader).
     */
    public static ClientConfig forMaster(String address) {
        return forMaster(MasterAddress.parse(address));
    }

    public static ClientConfig forMaster(HostPort master) {
        return forMaster(MasterAddress.of(master));
    }

    public static ClientConfig forMaster(MasterAddress master) {
        return new ClientConfig(master, null, true, 0, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
                DEFAULT_MAX_CONNECTIONS, DEFAULT_PING_INTERVAL, Limits.DEFAULT, true, DEFAULT_LOCATION_CACHE,
                DEFAULT_DISK_LOAD_BUDGET, "1".equals(System.getenv(TIER_LOG_ENV)), true,
                BusyPoll.configured(), Secrets.fromEnvironment());
    }

    /**
     * The TLS identity this client's connections to masters and nodes use ({@link Tls#NONE}: plain
     * TCP). By default the environment's ({@code KVPOOL_TLS_CERT}, {@code KVPOOL_TLS_KEY},
     * {@code KVPOOL_TLS_CA}); it travels with the secrets ({@link Secrets#tls()}). The same-machine
     * shared-memory path moves bytes without it (they never leave the host).
     */
    public Tls tls() {
        return secrets.tls();
    }

    /** This config with {@code t} as its TLS identity ({@link Tls#NONE}: plain TCP). */
    public ClientConfig withTls(Tls t) {
        return withSecrets(secrets.withTls(t));
    }

    /**
     * The secrets this client proves ({@link Secrets#NONE}: none, for open pools), with the TLS
     * identity they carry ({@link #withTls} after this to keep another).
     */
    public ClientConfig withSecrets(Secrets s) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, s);
    }

    public ClientConfig withPreferredSegment(String segment) {
        return new ClientConfig(master, segment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withAutoDetectLocal(boolean on) {
        return new ClientConfig(master, preferredSegment, on, replicas, connectTimeout, requestTimeout, maxConnections,
                pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withReplicas(int n) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, n, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withRequestTimeout(Duration d) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, d, maxConnections,
                pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withConnectTimeout(Duration d) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, d, requestTimeout, maxConnections,
                pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withMaxConnections(int n) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout, n,
                pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    /** Turns the same-machine shared-memory path on or off (on by default; off forces TCP everywhere). */
    public ClientConfig withSharedMemory(boolean on) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, on, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    /** Locations to remember for repeated reads; 0 asks the master on every read. */
    public ClientConfig withLocationCache(int entries) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, entries, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withDiskLoadBudget(long bytes) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, bytes, tierLog, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withTierLog(boolean on) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, on, writeLeases, busyPoll, secrets);
    }

    public ClientConfig withLimits(Limits l) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, l, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }

    /** Puts under write leases (the default) or through the two-phase put (PUT_START, write, PUT_END). */
    public ClientConfig withWriteLeases(boolean on) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, on, busyPoll, secrets);
    }

    /** This config with replies polled for up to {@code d} before the waiting thread blocks (zero: never). */
    public ClientConfig withBusyPoll(Duration d) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, pingInterval, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases,
                d, secrets);
    }

    /** How often the client pings the master (and releases idle write leases); default 2 s. */
    public ClientConfig withPingInterval(Duration d) {
        return new ClientConfig(master, preferredSegment, autoDetectLocal, replicas, connectTimeout, requestTimeout,
                maxConnections, d, limits, sharedMemory, locationCache, diskLoadBudget, tierLog, writeLeases, busyPoll, secrets);
    }
}

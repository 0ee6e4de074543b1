package io.kvpool.bench.baseline;

import io.kvpool.bench.Load;
import io.kvpool.bench.Measurement;
import io.kvpool.bench.StoreTarget;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.SplittableRandom;

import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.RedisProtocol;

/**
 * Redis as a {@link StoreTarget}: one Jedis connection per client thread, binary {@code SET} and
 * {@code GET} of values of the requested size. Puts write distinct keys; gets read random keys of a
 * working set each client stores before the run, and check every value that comes back.
 */
public final class RedisTarget implements StoreTarget {

    /** Bytes each client stores for its get phase (at most {@link #MAX_KEYS_PER_CLIENT} keys, at least one). */
    static final long WORKING_SET_BYTES_PER_CLIENT = 256L << 20;
    static final int MAX_KEYS_PER_CLIENT = 64;

    private static final int TIMEOUT_MILLIS = 60_000;

    private final HostAndPort address;
    private final JedisClientConfig config;
    private int run;

    public RedisTarget(String host, int port) {
        this.address = new HostAndPort(host, port);
        this.config = clientConfig();
    }

    /** RESP2 (what redis-benchmark speaks; no protocol negotiation), generous timeouts for big values. */
    static JedisClientConfig clientConfig() {
        return DefaultJedisClientConfig.builder()
                .protocol(RedisProtocol.RESP2)
                .connectionTimeoutMillis(TIMEOUT_MILLIS)
                .socketTimeoutMillis(TIMEOUT_MILLIS)
                .build();
    }

    public RedisTarget(RedisServer server) {
        this(server.host(), server.port());
    }

    @Override
    public String name() {
        return "redis";
    }

    Jedis connect() {
        return new Jedis(address, config);
    }

    /** Keys of one client's working set for gets of {@code valueSize}-byte values. */
    static int workingSetKeys(int valueSize) {
        return (int) Math.max(1, Math.min(MAX_KEYS_PER_CLIENT, WORKING_SET_BYTES_PER_CLIENT / valueSize));
    }

    static byte[] key(String kind, int run, int valueSize, int client, long i) {
        return ("bench:" + kind + run + ":" + valueSize + ":" + client + ":" + i).getBytes(StandardCharsets.US_ASCII);
    }

    static byte[] randomValue(int size, long seed) {
        byte[] v = new byte[size];
        new SplittableRandom(seed).nextBytes(v);
        return v;
    }

    @Override
    public Measurement put(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        checkSize(valueSize);
        int r = ++run;
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final Jedis jedis = connect();
            final byte[] value = randomValue(valueSize, 31L * r + id);

            @Override
            public Load.Op op() {
                return i -> {
                    String reply = jedis.set(key("p", r, valueSize, id, i), value);
                    if (!"OK".equals(reply)) {
                        throw new IllegalStateException("Redis SET replied " + reply);
                    }
                    return valueSize;
                };
            }

            @Override
            public void close() {
                jedis.close();
            }
        });
    }

    @Override
    public Measurement get(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        checkSize(valueSize);
        int r = ++run;
        int n = workingSetKeys(valueSize);
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final Jedis jedis = connect();
            final byte[] value = randomValue(valueSize, 31L * r + id);
            final byte[][] keys = new byte[n][];
            final SplittableRandom rnd = new SplittableRandom(7919L * r + id);

            {
                // the working set is stored here, before the warm-up and outside the measured window
                try {
                    for (int k = 0; k < n; k++) {
                        keys[k] = key("g", r, valueSize, id, k);
                        String reply = jedis.set(keys[k], value);
                        if (!"OK".equals(reply)) {
                            throw new IllegalStateException("Redis SET of the working set replied " + reply);
                        }
                    }
                } catch (RuntimeException e) {
                    jedis.close();
                    throw e;
                }
            }

            @Override
            public Load.Op op() {
                return i -> {
                    byte[] key = keys[rnd.nextInt(n)];
                    byte[] got = jedis.get(key);
                    check(key, got, value);
                    return valueSize;
                };
            }

            @Override
            public void close() {
                jedis.close();
            }
        });
    }

    /** Length must match; the first and last bytes are compared too, which costs nothing at these sizes. */
    static void check(byte[] key, byte[] got, byte[] expected) {
        if (got == null) {
            throw new IllegalStateException("Redis GET " + new String(key, StandardCharsets.US_ASCII)
                    + " found nothing (evicted? raise maxmemory)");
        }
        if (got.length != expected.length) {
            throw new IllegalStateException("Redis GET " + new String(key, StandardCharsets.US_ASCII)
                    + " returned " + got.length + " bytes, expected " + expected.length);
        }
        int last = expected.length - 1;
        if (got[0] != expected[0] || got[last] != expected[last] || got[last / 2] != expected[last / 2]) {
            throw new IllegalStateException("Redis GET " + new String(key, StandardCharsets.US_ASCII)
                    + " returned different bytes than were stored");
        }
    }

    private static void checkSize(int valueSize) {
        if (valueSize <= 0) {
            throw new IllegalArgumentException("value size must be positive: " + valueSize);
        }
    }

    /** {@code FLUSHALL}: drops every key of this (private) Redis. */
    @Override
    public void clear() {
        try (Jedis j = connect()) {
            j.flushAll();
        }
    }

    /** Nothing to release: connections belong to the runs, the server to its {@link RedisServer}. */
    @Override
    public void close() {
    }
}

package io.kvpool.bench.baseline;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.kvpool.bench.Measurement;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.IntStream;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

/**
 * Runs against a real Redis started by scripts/redis.sh; skipped (not failed) only when Redis is
 * missing and the script cannot install it.
 */
class RedisBaselineTest {

    private static final Duration WARMUP = Duration.ofMillis(20);
    private static final Duration RUN = Duration.ofMillis(150);

    private static RedisServer redis;

    @BeforeAll
    static void startRedis() throws Exception {
        try {
            redis = RedisServer.start(null, "1gb");
        } catch (RedisServer.UnavailableException e) {
            Assumptions.abort("Redis cannot be installed here: " + e.getMessage());
        }
    }

    @AfterAll
    static void stopRedis() throws Exception {
        if (redis != null) {
            long pid = redis.pid();
            redis.close();
            assertThat(ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)).isFalse();
            assertThat(redis.directory()).doesNotExist();
            redis.close(); // idempotent
        }
    }

    @Test
    void theServerIsOursAndReportsItsVersion() throws Exception {
        assertThat(redis.version()).matches("\\d+\\.\\d+\\.\\d+");
        assertThat(RedisServer.installedVersion()).contains(redis.version());
        try (Jedis j = new Jedis(new HostAndPort(redis.host(), redis.port()), RedisTarget.clientConfig())) {
            assertThat(j.ping()).isEqualTo("PONG");
            assertThat(j.info("server")).contains("process_id:" + redis.pid());
            assertThat(j.configGet("save").get("save")).isEmpty();
            assertThat(j.configGet("appendonly").get("appendonly")).isEqualTo("no");
        }
    }

    @Test
    void putsAndGetsMoveTheValueSizePerOperationAndClearEmptiesRedis() throws Exception {
        RedisTarget t = new RedisTarget(redis);
        assertThat(t.name()).isEqualTo("redis");
        for (int clients : new int[] {1, 2}) {
            for (int size : new int[] {100, 1 << 20}) {
                Measurement p = t.put(size, clients, WARMUP, RUN);
                assertThat(p.ops()).isPositive();
                assertThat(p.bytes()).isEqualTo(p.ops() * size);
                assertThat(p.latenciesNanos()).hasSize((int) p.ops());
                Measurement g = t.get(size, clients, WARMUP, RUN);
                assertThat(g.ops()).isPositive();
                assertThat(g.bytes()).isEqualTo(g.ops() * size);
            }
        }
        try (Jedis j = new Jedis(new HostAndPort(redis.host(), redis.port()), RedisTarget.clientConfig())) {
            assertThat(j.dbSize()).isPositive();
            t.clear();
            assertThat(j.dbSize()).isZero();
        }
    }

    @Test
    void workingSetsAreCappedAt64KeysOr256MiB() {
        assertThat(RedisTarget.workingSetKeys(4096)).isEqualTo(64);
        assertThat(RedisTarget.workingSetKeys(8 << 20)).isEqualTo(32);
        assertThat(RedisTarget.workingSetKeys(512 << 20)).isEqualTo(1);
    }

    @Test
    void aGetOfAValueOfTheWrongLengthFails() {
        byte[] key = {'k'};
        assertThatThrownBy(() -> RedisTarget.check(key, new byte[3], new byte[4]))
                .hasMessageContaining("returned 3 bytes, expected 4");
        assertThatThrownBy(() -> RedisTarget.check(key, null, new byte[4])).hasMessageContaining("found nothing");
        assertThatThrownBy(() -> RedisTarget.check(key, new byte[] {1, 2}, new byte[] {1, 3}))
                .hasMessageContaining("different bytes");
    }

    @Test
    void pipelinedExistsMeasuresOneBatchPerOperation() {
        List<String> keys = IntStream.range(0, 1000).mapToObj(i -> "lookup:" + i).toList();
        try (RedisLookup lookup = new RedisLookup(redis)) {
            lookup.store(keys);
            Measurement m = lookup.pipelinedExists(keys, 20, Duration.ofMillis(20));
            assertThat(m.ops()).isEqualTo(20);
            assertThat(m.bytes()).isZero();
            assertThat(m.latenciesNanos()).hasSize(20);
            assertThat(m.latenciesNanos()[0]).isPositive();
            assertThat(m.wallNanos()).isPositive();

            List<String> withMissing = new ArrayList<>(keys);
            withMissing.add("lookup:never-stored");
            assertThatThrownBy(() -> lookup.pipelinedExists(withMissing, 1, Duration.ZERO))
                    .hasMessageContaining("lookup:never-stored");
        }
    }
}

package io.kvpool.it;

import io.kvpool.etcd.Election;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import io.kvpool.master.ElectedMaster;
import io.kvpool.master.MasterConfig;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The election against a real etcd (started by scripts/etcd.sh): one leader at a time, terms that
 * rise, leadership lost when the lease goes, a leader record that says when the leader serves, and a
 * local deadline that a paused process finds passed (with an injected clock, so nothing waits).
 */
class ElectionIT {

    private static final Duration TTL = Duration.ofSeconds(2);
    private static EtcdProcess etcd;
    private static int clusters;

    @BeforeAll
    static void startEtcd() throws Exception {
        etcd = new EtcdProcess(Path.of("target", "it-logs", "election", "etcd").toAbsolutePath());
        etcd.start(); // skips only where etcd cannot be installed; a failing etcd fails
    }

    @AfterAll
    static void stopEtcd() throws Exception {
        if (etcd != null) {
            etcd.close();
        }
    }

    private static EtcdTarget freshCluster() {
        return EtcdTarget.parse(etcd.url("election-" + (++clusters)));
    }

    @Test
    void oneLeaderAtATimeWithRisingTermsAndAReadyFlag() throws Exception {
        EtcdTarget t = freshCluster();
        try (LeaderWatch watch = new LeaderWatch(t, Duration.ofSeconds(2)).start();
             Election a = new Election(t, "a", "127.0.0.1:1", "", TTL, System::nanoTime);
             Election b = new Election(t, "b", "127.0.0.1:2", "", TTL, System::nanoTime)) {
            Election.Leadership la = a.campaign();
            assertThat(la.term()).isPositive();
            LeaderRecord warming = watch.await(r -> r.id().equals("a"), Duration.ofSeconds(30));
            assertThat(warming.ready()).as("a new leader is not ready until it says so").isFalse();
            assertThat(warming.term()).isEqualTo(la.term());

            CompletableFuture<Election.Leadership> bWins = CompletableFuture.supplyAsync(() -> {
                try {
                    return b.campaign();
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            });
            la.markReady();
            assertThat(watch.await(LeaderRecord::ready, Duration.ofSeconds(30)).id()).isEqualTo("a");
            assertThat(bWins).as("b waits while a leads").isNotDone();
            assertThat(a.current()).isSameAs(la);

            la.resign();
            Election.Leadership lb = bWins.get(30, TimeUnit.SECONDS);
            assertThat(lb.term()).isGreaterThan(la.term());
            assertThat(la.valid()).isFalse();
            assertThat(watch.await(r -> r.id().equals("b"), Duration.ofSeconds(30)).term()).isEqualTo(lb.term());
        }
    }

    @Test
    void aLeaderWhoseLeaseIsGoneStepsDownAndSaysSo() throws Exception {
        EtcdTarget t = freshCluster();
        try (Election a = new Election(t, "a", "127.0.0.1:1", "", TTL, System::nanoTime);
             EtcdGateway admin = new EtcdGateway(t.endpoints(), Duration.ofSeconds(5))) {
            Election.Leadership la = a.campaign();
            CountDownLatch lost = new CountDownLatch(1);
            la.onLost(lost::countDown);
            long lease = admin.range(t.leaderKey()).first().lease();
            admin.revoke(lease); // what etcd does when the lease runs out
            assertThat(lost.await(30, TimeUnit.SECONDS)).as("the leadership-lost listener ran").isTrue();
            assertThat(la.valid()).isFalse();
            assertThat(admin.range(t.leaderKey()).first()).as("the leader key went with the lease").isNull();
        }
    }

    @Test
    void someoneElseDeletingTheLeaderKeyEndsTheLeadership() throws Exception {
        EtcdTarget t = freshCluster();
        try (Election a = new Election(t, "a", "127.0.0.1:1", "", TTL, System::nanoTime);
             EtcdGateway admin = new EtcdGateway(t.endpoints(), Duration.ofSeconds(5))) {
            Election.Leadership la = a.campaign();
            CountDownLatch lost = new CountDownLatch(1);
            la.onLost(lost::countDown);
            admin.delete(t.leaderKey());
            assertThat(lost.await(30, TimeUnit.SECONDS)).isTrue();
            assertThat(la.valid()).isFalse();
        }
    }

    @Test
    void aProcessThatWasPausedPastItsDeadlineIsNotLeaderUntilARenewalSucceeds() throws Exception {
        EtcdTarget t = freshCluster();
        AtomicLong clock = new AtomicLong(1_000_000_000L);
        try (Election a = new Election(t, "a", "127.0.0.1:1", "", TTL, clock::get)) {
            Election.Leadership la = a.campaign();
            assertThat(la.valid()).isTrue();
            clock.addAndGet(Duration.ofSeconds(60).toNanos()); // the process was stopped for a minute
            assertThat(la.valid()).as("valid right after resuming, before any renewal").isFalse();
        }
    }

    private static String http(int port, String path) throws Exception {
        return HttpClient.newHttpClient().send(HttpRequest.newBuilder(
                URI.create("http://127.0.0.1:" + port + path)).build(),
                HttpResponse.BodyHandlers.ofString()).body();
    }

    /** What an elected master's HTTP port shows: the leader's pages while it leads, a standby's between. */
    @Test
    void aStandbyShowsAStandbyPageAndTheLeadersPagesWhenItTakesOver() throws Exception {
        EtcdTarget t = freshCluster();
        int[] ports = {ProcessCluster.freePort(), ProcessCluster.freePort(), ProcessCluster.freePort(),
                ProcessCluster.freePort()};
        MasterConfig base = MasterConfig.defaults()
                .withSummaryInterval(Duration.ZERO);
        ElectedMaster a = new ElectedMaster(base.withListen("127.0.0.1", ports[0],
                ports[1]), new ElectedMaster.Options(t, "a", "127.0.0.1", TTL, Duration.ZERO));
        ElectedMaster b = null;
        try {
            assertThat(a.awaitServing(Duration.ofSeconds(30))).isTrue();
            b = new ElectedMaster(base.withListen("127.0.0.1", ports[2], ports[3]),
                    new ElectedMaster.Options(t, "b", "127.0.0.1", TTL, Duration.ZERO));
            // b stands by: alive on its port, saying so, and naming the leader
            String[] seen = new String[1];
            Await.until("the standby answers /health", () -> (seen[0] = tryHealth(ports[3])) != null);
            String health = seen[0];
            assertThat(health).contains("\"status\":\"standby\"").contains("\"leader\":\"a\"");
            assertThat(http(ports[3], "/metrics")).contains("master_leader 0.0").contains("jvm_threads_current");
            assertThat(http(ports[3], "/api/status")).contains("(standby)").contains("a at 127.0.0.1:" + ports[0]);
            assertThat(http(ports[1], "/metrics")).contains("master_leader 1.0")
                    .containsPattern("master_term [1-9]");
            // a steps down: b takes over on the same port, with the leader's pages
            a.close();
            assertThat(b.awaitServing(Duration.ofSeconds(30))).isTrue();
            assertThat(http(ports[3], "/health")).contains("\"status\":\"ok\"");
            assertThat(http(ports[3], "/metrics")).contains("master_leader 1.0").contains("master_objects");
            assertThat(http(ports[3], "/api/status")).contains("leader, term " + b.term());
        } finally {
            a.close();
            if (b != null) {
                b.close();
            }
        }
    }

    private static String tryHealth(int port) {
        try {
            return tryHttp(port, "/health");
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    private static String tryHttp(int port, String path) throws Exception {
        try {
            return http(port, path);
        } catch (IOException e) {
            Thread.sleep(50);
            return null;
        }
    }
}

package io.kvpool.it;

import io.kvpool.etcd.Election;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

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
        String why = etcd.start();
        Assumptions.assumeTrue(why == null, () -> "etcd is not available here: " + why);
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
}

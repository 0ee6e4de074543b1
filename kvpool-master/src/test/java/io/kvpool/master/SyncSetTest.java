package io.kvpool.master;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * {@link SyncSet}: who a write waits for, when a standby is made known as in sync, and that a late one is made
 * unknown before any write is acknowledged without it. Waits that must end by an acknowledgement use a timeout of
 * a minute, so they cannot end by the timeout in a test run; drops use a timeout of a nanosecond.
 */
class SyncSetTest {

    private static final long MINUTE = Duration.ofMinutes(1).toNanos();

    private final AtomicLong end = new AtomicLong();
    private final List<Set<String>> publications = new ArrayList<>();

    private SyncSet sync(long timeoutNanos) {
        return new SyncSet(end::get, s -> {
            synchronized (publications) {
                publications.add(Set.copyOf(s));
            }
        }, timeoutNanos);
    }

    @Test
    void aStandbyAtTheEndJoinsIsPublishedAndWritesWaitForIt() throws Exception {
        SyncSet s = sync(MINUTE);
        end.set(5000);
        s.acked("b", 4);
        assertThat(s.published()).as("far behind the end: not joined").isEmpty();
        s.await(5000); // nobody to wait for
        s.acked("b", 5000);
        assertThat(s.published()).containsExactly("b");
        assertThat(publications).containsExactly(Set.of("b"));
        end.set(5002);
        CompletableFuture<Void> write = CompletableFuture.runAsync(() -> {
            try {
                s.await(5002);
            } catch (IOException e) {
                throw new RuntimeException(e);
            }
        });
        s.acked("b", 5001);
        assertThat(write).as("b has not read record 5001 yet").isNotDone();
        s.acked("b", 5002);
        write.get(1, TimeUnit.MINUTES);
        assertThat(s.dropped()).isZero();
        assertThat(s.published()).containsExactly("b");
    }

    @Test
    void aLateStandbyIsUnpublishedBeforeTheWriteIsAcknowledgedAndJoinsAgainLater() throws Exception {
        SyncSet s = sync(1);
        end.set(5);
        s.acked("a", 5);
        s.acked("b", 5);
        assertThat(s.published()).containsExactlyInAnyOrder("a", "b");
        end.set(6);
        s.acked("a", 6);
        s.await(6); // b never reads record 5
        assertThat(s.published()).containsExactly("a");
        assertThat(publications.getLast()).as("published without b before the write returned").isEqualTo(Set.of("a"));
        assertThat(s.dropped()).isEqualTo(1);
        s.acked("b", 6);
        assertThat(s.published()).containsExactlyInAnyOrder("a", "b");
    }

    @Test
    void aStandbyAFewRecordsBehindJoinsButIsNamedOnlyPastTheEndAsItWasWhenItJoined() throws Exception {
        SyncSet s = sync(MINUTE);
        end.set(100);
        s.acked("c", 90); // keeping up under steady writes: a batch behind
        assertThat(s.published()).as("joined, not yet past its mark").isEmpty();
        CompletableFuture<Void> write = CompletableFuture.runAsync(() -> {
            try {
                s.await(100);
            } catch (IOException e) {
                throw new RuntimeException(e);
            }
        });
        s.acked("c", 99);
        assertThat(write).as("writes wait for a joined standby").isNotDone();
        assertThat(s.published()).isEmpty();
        s.acked("c", 100);
        write.get(1, TimeUnit.MINUTES);
        assertThat(s.published()).containsExactly("c");
    }

    @Test
    void aPublicationThatFailsFailsTheWrite() throws Exception {
        boolean[] fail = {false};
        SyncSet s = new SyncSet(end::get, set -> {
            if (fail[0]) {
                throw new IOException("etcd unreachable");
            }
        }, 1);
        s.acked("a", 0);
        assertThat(s.published()).containsExactly("a");
        end.set(1);
        fail[0] = true;
        assertThatThrownBy(() -> s.await(1)).isInstanceOf(IOException.class).hasMessageContaining("etcd unreachable");
        assertThat(s.published()).as("still known as in sync: nothing was acknowledged without it").containsExactly("a");
    }

    @Test
    void readersWithoutAnIdAreNeverWaitedFor() throws Exception {
        SyncSet s = sync(MINUTE);
        s.acked("", 0);
        end.set(3);
        s.await(3);
        assertThat(publications).isEmpty();
    }
}

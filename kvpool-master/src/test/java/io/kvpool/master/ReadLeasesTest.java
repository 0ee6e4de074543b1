package io.kvpool.master;

import io.kvpool.protocol.msg.LeaseMessages.Invalidation;
import io.kvpool.protocol.msg.LeaseMessages.Kind;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The master's read leases, on a clock driven by hand: an invalidation is applied once every session
 * acknowledged it or its lease (with the drift allowance) ran out, never earlier; renewals deliver
 * exactly the records a client has not applied, in order, or tell it to resync.
 */
class ReadLeasesTest {

    private static final long INC = 42;
    private static final Duration LEASE = Duration.ofSeconds(2);
    private final AtomicLong now = new AtomicLong(1_000_000_000L);
    private final ReadLeases leases = new ReadLeases(INC, LEASE, now::get, false);

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private LeaseReply renew(UUID s, long incarnation, long applied) {
        return leases.renew(new LeaseRequest(s, incarnation, applied, 0, false));
    }

    /** A session that took its first lease and is up to date. */
    private UUID session() {
        UUID s = UUID.randomUUID();
        LeaseReply r = renew(s, 0, 0);
        assertThat(r.resync()).as("a new client starts from a clean slate").isTrue();
        assertThat(r.leaseMillis()).isEqualTo(2000);
        assertThat(r.incarnation()).isEqualTo(INC);
        return s;
    }

    @Test
    void withNoSessionsAnInvalidationIsAppliedAtOnce() {
        long seq = leases.publishAll();
        assertThat(leases.applied(seq)).isTrue();
        assertThat(leases.await(seq)).isZero();
    }

    @Test
    void anInvalidationWaitsForTheAcknowledgementOfEverySession() {
        UUID a = session();
        UUID b = session();
        long seq = leases.publishKeys(List.of(k("x"), k("y")));
        assertThat(leases.applied(seq)).isFalse();

        LeaseReply ra = renew(a, INC, 0);
        assertThat(ra.resync()).isFalse();
        assertThat(ra.seq()).isEqualTo(seq);
        assertThat(ra.records()).singleElement().satisfies(inv -> {
            assertThat(inv.kind()).isEqualTo(Kind.KEYS);
            assertThat(inv.keys()).extracting(x -> new String(x, StandardCharsets.UTF_8)).containsExactly("x", "y");
        });
        // receiving the record is not applying it: only the next renewal acknowledges
        assertThat(leases.applied(seq)).isFalse();
        renew(a, INC, seq);
        assertThat(leases.applied(seq)).as("b has not acknowledged").isFalse();
        renew(b, INC, seq);
        assertThat(leases.applied(seq)).isTrue();
        assertThat(leases.await(seq)).isZero();
    }

    @Test
    void aSilentSessionIsWaitedOutOnlyAfterItsLeaseWithTheDriftAllowance() {
        session();
        long seq = leases.publishAll();
        long expiry = leases.maxWaitNanos();
        assertThat(expiry).isEqualTo((long) (LEASE.toNanos() * 1.01) + ReadLeases.MARGIN.toNanos());
        now.addAndGet(expiry - 1);
        assertThat(leases.applied(seq)).isFalse();
        now.addAndGet(1);
        assertThat(leases.applied(seq)).isTrue();
        assertThat(leases.await(seq)).as("waited out, not acknowledged").isEqualTo(1);
        assertThat(leases.leasesWaitedOut.get()).isEqualTo(1);
    }

    @Test
    void theLeaseIsCountedFromTheLastAnswerTheMasterBuilt() {
        UUID a = session();
        now.addAndGet(TimeUnit.SECONDS.toNanos(1));
        renew(a, INC, 0); // renewed one second later: its lease runs one second longer
        long seq = leases.publishAll();
        now.addAndGet(leases.maxWaitNanos() - 1);
        assertThat(leases.applied(seq)).isFalse();
        now.addAndGet(1);
        assertThat(leases.applied(seq)).isTrue();
    }

    @Test
    void anEndedSessionHoldsUpNothing() {
        UUID a = session();
        long seq = leases.publishPrefix(k("p/"));
        assertThat(leases.applied(seq)).isFalse();
        LeaseReply r = leases.renew(new LeaseRequest(a, INC, 0, 0, true));
        assertThat(r.leaseMillis()).as("an ending session is granted nothing").isZero();
        assertThat(leases.applied(seq)).isTrue();
        assertThat(leases.sessionCount()).isZero();
    }

    @Test
    void recordsComeInOrderFromWhereTheClientIs() {
        UUID a = session();
        long s1 = leases.publishKeys(List.of(k("a")));
        long s2 = leases.publishPrefix(k("b/"));
        long s3 = leases.publishAll();
        LeaseReply r = renew(a, INC, s1);
        assertThat(r.records()).extracting(Invalidation::seq).containsExactly(s2, s3);
        assertThat(r.records()).extracting(Invalidation::kind).containsExactly(Kind.PREFIX, Kind.ALL);
        assertThat(r.seq()).isEqualTo(s3);
        assertThat(renew(a, INC, s3).records()).isEmpty();
    }

    @Test
    void aClientOfAnotherMasterOrTooFarBehindIsToldToResync() {
        UUID a = session();
        leases.publishAll();
        assertThat(renew(a, INC + 1, 1).resync()).as("another incarnation's sequence").isTrue();
        assertThat(renew(a, INC, 99).resync()).as("a sequence this master never reached").isTrue();
        for (int i = 0; i < ReadLeases.MAX_RECORDS + 5; i++) {
            leases.publishKeys(List.of(k("k" + i)));
        }
        LeaseReply r = renew(a, INC, 1);
        assertThat(r.resync()).as("its records were dropped").isTrue();
        assertThat(r.seq()).isEqualTo(leases.sequence());
    }

    @Test
    void aLongBacklogComesInPiecesOfBoundedSize() {
        UUID a = session();
        List<byte[]> big = new ArrayList<>();
        for (int i = 0; i < 16_000; i++) {
            big.add(k("kvp1/model/v1/tp0of1-pp0of1/bf16/" + String.format("%064d", i)));
        }
        for (int i = 0; i < 10; i++) {
            leases.publishKeys(big);
        }
        long applied = 0;
        int replies = 0;
        while (applied < leases.sequence()) {
            LeaseReply r = renew(a, INC, applied);
            assertThat(r.resync()).isFalse();
            assertThat(r.records()).isNotEmpty();
            assertThat(r.records().getFirst().seq()).isEqualTo(applied + 1);
            assertThat(r.records().stream().mapToInt(Invalidation::wireBytes).sum()).isLessThanOrEqualTo(ReadLeases.MAX_REPLY_BYTES);
            applied = r.seq();
            replies++;
        }
        assertThat(replies).as("about 1.6 MB per record, 8 MiB per reply").isGreaterThan(1);
    }

    @Test
    void aParkedRenewalAnswersAsSoonAsSomethingIsPublished() throws Exception {
        UUID a = session();
        CompletableFuture<LeaseReply> parked = CompletableFuture.supplyAsync(
                () -> leases.renew(new LeaseRequest(a, INC, 0, 500, false)));
        long seq = leases.publishAll();
        LeaseReply r = parked.get(30, TimeUnit.SECONDS);
        assertThat(r.seq()).isEqualTo(seq);
        assertThat(r.records()).extracting(Invalidation::kind).containsExactly(Kind.ALL);
    }

    @Test
    void aNewMasterCompletesNoInvalidationWithinOneLeaseOfItsStart() {
        ReadLeases fresh = new ReadLeases(INC, LEASE, now::get, true);
        long seq = fresh.publishAll();
        assertThat(fresh.applied(seq)).as("a client of the previous master may still hold a lease").isFalse();
        now.addAndGet(fresh.maxWaitNanos());
        assertThat(fresh.applied(seq)).isTrue();
    }

    @Test
    void sessionsGoneForTwoLeasesAreForgotten() {
        session();
        now.addAndGet(2 * leases.maxWaitNanos());
        leases.expire();
        assertThat(leases.sessionCount()).isOne();
        now.addAndGet(1);
        leases.expire();
        assertThat(leases.sessionCount()).isZero();
    }
}

package io.kvpool.client;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.LeaseMessages.Invalidation;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The client's half of the read-lease rule: a copy from a remembered location is confirmed only
 * under a running lease and only if no invalidation applied since the read began covers its key;
 * answers that raced an invalidation are not remembered.
 */
class LocationCacheTest {

    private static final long INC = 7;
    private static final long T0 = 1_000_000_000L;
    private static final ReplicaList WHERE = new ReplicaList(ResultCode.OK, 10, 99, List.of(new Replica(1, 0)));

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** A cache holding a 2 s lease from T0, at master sequence 0. */
    private static LocationCache leased() {
        LocationCache c = new LocationCache(100);
        c.apply(new LeaseReply(INC, 0, 2000, true, List.of()), T0);
        return c;
    }

    @Test
    void aCopyIsConfirmedOnlyWhileTheLeaseRuns() {
        LocationCache c = new LocationCache(100);
        assertThat(c.leaseValid(T0)).as("no lease before the first renewal").isFalse();
        assertThat(c.confirm("a", c.snapshot(), T0)).isFalse();
        c.apply(new LeaseReply(INC, 0, 2000, true, List.of()), T0);
        long snap = c.snapshot();
        assertThat(c.confirm("a", snap, T0 + TimeUnit.MILLISECONDS.toNanos(1999))).isTrue();
        assertThat(c.confirm("a", snap, T0 + TimeUnit.MILLISECONDS.toNanos(2000)))
                .as("counted from when the renewal was sent").isFalse();
    }

    @Test
    void anInvalidationAppliedDuringACopyFailsItsConfirmation() {
        LocationCache c = leased();
        c.remember("a", WHERE, c.snapshot());
        c.remember("b", WHERE, c.snapshot());
        long snap = c.snapshot();
        assertThat(c.get("a")).isNotNull();
        c.apply(new LeaseReply(INC, 1, 2000, false, List.of(Invalidation.keys(1, List.of(k("a"))))), T0);
        assertThat(c.get("a")).as("the entry leaves at once").isNull();
        assertThat(c.get("b")).isNotNull();
        assertThat(c.confirm("a", snap, T0)).isFalse();
        assertThat(c.confirm("b", snap, T0)).isTrue();
        assertThat(c.confirm("a", c.snapshot(), T0)).as("a read begun after it is unaffected").isTrue();
    }

    @Test
    void prefixAndAllCoverWhatTheyName() {
        LocationCache c = leased();
        for (String key : List.of("m/v1/x", "m/v1/y", "m/v2/x")) {
            c.remember(key, WHERE, c.snapshot());
        }
        long snap = c.snapshot();
        c.apply(new LeaseReply(INC, 1, 2000, false, List.of(Invalidation.prefix(1, k("m/v1/")))), T0);
        assertThat(c.size()).isOne();
        assertThat(c.confirm("m/v1/y", snap, T0)).isFalse();
        assertThat(c.confirm("m/v2/x", snap, T0)).isTrue();
        long snap2 = c.snapshot();
        c.apply(new LeaseReply(INC, 2, 2000, false, List.of(Invalidation.all(2))), T0);
        assertThat(c.size()).isZero();
        assertThat(c.confirm("m/v2/x", snap2, T0)).isFalse();
        assertThat(c.position()).containsExactly(INC, 2);
    }

    @Test
    void anAnswerThatRacedAnInvalidationIsNotRemembered() {
        LocationCache c = leased();
        long snap = c.snapshot(); // the read begins, asks the master ...
        c.apply(new LeaseReply(INC, 1, 2000, false, List.of(Invalidation.keys(1, List.of(k("a"))))), T0);
        c.remember("a", WHERE, snap); // ... whose answer may predate the removal
        c.remember("b", WHERE, snap);
        assertThat(c.get("a")).isNull();
        assertThat(c.get("b")).isNotNull();
    }

    @Test
    void aGapAResyncOrAMasterRestartDropsEverything() {
        LocationCache c = leased();
        c.remember("a", WHERE, c.snapshot());
        long snap = c.snapshot();
        c.apply(new LeaseReply(INC, 5, 2000, false, List.of(Invalidation.keys(5, List.of(k("zzz"))))), T0);
        assertThat(c.size()).as("records 1 to 4 were missed").isZero();
        assertThat(c.confirm("a", snap, T0)).isFalse();

        c.remember("a", WHERE, c.snapshot());
        c.apply(new LeaseReply(INC, 9, 2000, true, List.of()), T0);
        assertThat(c.size()).isZero();
        assertThat(c.position()).containsExactly(INC, 9);

        c.remember("a", WHERE, c.snapshot());
        c.masterRestarted();
        assertThat(c.size()).isZero();
        assertThat(c.leaseValid(T0)).isFalse();
        c.apply(new LeaseReply(INC + 1, 0, 2000, true, List.of()), T0);
        assertThat(c.position()).containsExactly(INC + 1, 0);
        assertThat(c.leaseValid(T0)).isTrue();
    }

    @Test
    void aRepeatedAnswerAppliesNothingTwice() {
        LocationCache c = leased();
        LeaseReply r = new LeaseReply(INC, 1, 2000, false, List.of(Invalidation.keys(1, List.of(k("a")))));
        c.apply(r, T0);
        long snap = c.snapshot();
        c.remember("a", WHERE, snap);
        c.apply(r, T0); // the long poll and a synchronous renewal answered the same position
        assertThat(c.get("a")).isNotNull();
        assertThat(c.confirm("a", snap, T0)).isTrue();
    }

    @Test
    void aSnapshotOlderThanTheKeptHistoryFailsConfirmation() {
        LocationCache c = leased();
        long snap = c.snapshot();
        List<Invalidation> recs = new ArrayList<>();
        for (int i = 1; i <= LocationCache.MAX_RECENT + 1; i++) {
            recs.add(Invalidation.keys(i, List.of(k("other" + i))));
        }
        c.apply(new LeaseReply(INC, recs.size(), 2000, false, recs), T0);
        assertThat(c.confirm("a", snap, T0)).as("cannot tell what the oldest records covered").isFalse();
        assertThat(c.confirm("a", c.snapshot(), T0)).isTrue();
    }

    /**
     * Against a model: random invalidations and reads; a read's confirmation must fail exactly when
     * an invalidation applied since its snapshot covers its key (the history is large enough here).
     */
    @Test
    void confirmationsMatchAModel() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        LocationCache c = leased();
        List<String> keys = List.of("p/a", "p/b", "q/a", "q/b", "r");
        long masterSeq = 0;
        List<long[]> reads = new ArrayList<>(); // snapshot, key index
        List<Set<String>> coveredAfter = new ArrayList<>();
        for (int step = 0; step < 2000; step++) {
            if (rnd.nextInt(3) == 0) {
                reads.add(new long[]{c.snapshot(), rnd.nextInt(keys.size())});
                coveredAfter.add(new HashSet<>());
            } else {
                masterSeq++;
                Invalidation inv;
                Set<String> covered = new HashSet<>();
                switch (rnd.nextInt(3)) {
                    case 0 -> {
                        String key = keys.get(rnd.nextInt(keys.size()));
                        inv = Invalidation.keys(masterSeq, List.of(k(key)));
                        covered.add(key);
                    }
                    case 1 -> {
                        String p = rnd.nextBoolean() ? "p/" : "q/";
                        inv = Invalidation.prefix(masterSeq, k(p));
                        keys.stream().filter(x -> x.startsWith(p)).forEach(covered::add);
                    }
                    default -> {
                        inv = rnd.nextInt(10) == 0 ? Invalidation.all(masterSeq) : Invalidation.keys(masterSeq, List.of(k("none")));
                        if (inv.kind() == io.kvpool.protocol.msg.LeaseMessages.Kind.ALL) {
                            covered.addAll(keys);
                        }
                    }
                }
                c.apply(new LeaseReply(INC, masterSeq, 2000, false, List.of(inv)), T0);
                for (Set<String> s : coveredAfter) {
                    s.addAll(covered);
                }
            }
            if (reads.size() > 200) {
                reads.removeFirst();
                coveredAfter.removeFirst();
            }
            for (int i = 0; i < reads.size(); i++) {
                String key = keys.get((int) reads.get(i)[1]);
                assertThat(c.confirm(key, reads.get(i)[0], T0)).as("seed %d step %d read %d", seed, step, i)
                        .isEqualTo(!coveredAfter.get(i).contains(key));
            }
        }
    }
}

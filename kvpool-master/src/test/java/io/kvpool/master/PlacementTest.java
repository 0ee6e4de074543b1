package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.msg.ControlToken;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.SplittableRandom;
import java.util.Set;

import static org.assertj.core.api.Assertions.assertThat;

/** Copies go on distinct segments, and on distinct hosts while other hosts have room. */
class PlacementTest {

    private static final long REGION = 1 << 20;

    private static Segment segment(int id, String host, long capacity) {
        Segment s = new Segment(id, host + ":" + (50000 + id), new HostPort(host, 50000 + id), capacity, id, "",
                ControlToken.random(), 0);
        s.active = true;
        return s;
    }

    private static Set<String> hosts(List<Placement.Placed> placed) {
        Set<String> out = new HashSet<>();
        placed.forEach(p -> out.add(p.segment().address.host()));
        return out;
    }

    @Test
    void copiesGoOnDistinctHostsWhenThereAreEnough() {
        SplittableRandom rnd = new SplittableRandom(1);
        for (int round = 0; round < 200; round++) {
            List<Segment> segs = new ArrayList<>();
            int id = 0;
            for (String host : List.of("10.0.0.1", "10.0.0.2", "10.0.0.3")) {
                segs.add(segment(id++, host, 64 * REGION));
                segs.add(segment(id++, host, 64 * REGION));
            }
            List<Placement.Placed> placed = Placement.choose(segs, REGION, 3, "", rnd);
            assertThat(placed).hasSize(3);
            assertThat(hosts(placed)).as("round %d", round).hasSize(3);
        }
    }

    @Test
    void onOneHostCopiesStillGoOnDistinctSegments() {
        List<Segment> segs = List.of(segment(0, "h", 8 * REGION), segment(1, "h", 8 * REGION), segment(2, "h", 8 * REGION));
        List<Placement.Placed> placed = Placement.choose(segs, REGION, 2, "", new SplittableRandom(2));
        assertThat(placed).hasSize(2);
        assertThat(placed.get(0).segment()).isNotSameAs(placed.get(1).segment());
        assertThat(Placement.choose(segs, REGION, 8, "", new SplittableRandom(3))).as("at most one copy per segment")
                .hasSize(3);
    }

    @Test
    void whenTheOtherHostIsFullTheSecondCopyTakesAnotherSegmentOfTheSameHost() {
        Segment a1 = segment(0, "a", 8 * REGION);
        Segment a2 = segment(1, "a", 8 * REGION);
        Segment b = segment(2, "b", REGION / 2); // too small for the region
        List<Placement.Placed> placed = Placement.choose(List.of(a1, a2, b), REGION, 2, "a:50000", new SplittableRandom(4));
        assertThat(placed).extracting(Placement.Placed::segment).containsExactly(a1, a2);
    }

    @Test
    void thePreferredSegmentComesFirstAndTheNextCopyGoesToAnotherHost() {
        Segment a1 = segment(0, "a", 8 * REGION);
        Segment a2 = segment(1, "a", 64 * REGION); // the emptiest: chosen if hosts did not matter
        Segment b = segment(2, "b", 8 * REGION);
        List<Placement.Placed> placed = Placement.choose(List.of(a1, a2, b), REGION, 2, "a:50000", new SplittableRandom(5));
        assertThat(placed).extracting(Placement.Placed::segment).containsExactly(a1, b);
    }
}

package io.kvpool.master;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.random.RandomGenerator;

/**
 * Where a new object's replicas go: on distinct active segments, the preferred segment first (if
 * named, active and with room), the rest by the power of two choices (of two random segments, the
 * one with more free space; Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing",
 * 2001), which spreads load without sending every write to a newly joined, empty node. When neither
 * of the two has room, the segment with the most free space that fits is taken. Reservations are
 * made in the segments' allocators as they are chosen.
 */
final class Placement {

    private Placement() {
    }

    /** One reserved region. */
    record Placed(Segment segment, long offset) {
    }

    /** Reserves up to {@code replicas} regions of {@code regionLength} bytes; fewer (or none) when nothing fits. */
    static List<Placed> choose(Collection<Segment> segments, long regionLength, int replicas, String preferred,
                               RandomGenerator random) {
        List<Segment> candidates = new ArrayList<>();
        for (Segment s : segments) {
            if (s.active) {
                candidates.add(s);
            }
        }
        List<Placed> out = new ArrayList<>(replicas);
        if (preferred != null && !preferred.isEmpty()) {
            for (Iterator<Segment> it = candidates.iterator(); it.hasNext(); ) {
                Segment s = it.next();
                if (s.name.equals(preferred)) {
                    it.remove();
                    long off = s.allocator.allocate(regionLength);
                    if (off >= 0) {
                        out.add(new Placed(s, off));
                    }
                    break;
                }
            }
        }
        while (out.size() < replicas && !candidates.isEmpty()) {
            Segment pick = null;
            long off = -1;
            if (candidates.size() >= 2) {
                int a = random.nextInt(candidates.size());
                int b = random.nextInt(candidates.size() - 1);
                if (b >= a) {
                    b++;
                }
                Segment sa = candidates.get(a);
                Segment sb = candidates.get(b);
                Segment first = sa.allocator.free() >= sb.allocator.free() ? sa : sb;
                Segment second = first == sa ? sb : sa;
                if ((off = first.allocator.allocate(regionLength)) >= 0) {
                    pick = first;
                } else if ((off = second.allocator.allocate(regionLength)) >= 0) {
                    pick = second;
                }
            }
            if (pick == null) {
                candidates.sort(Comparator.comparingLong((Segment s) -> s.allocator.free()).reversed());
                for (Segment s : candidates) {
                    if ((off = s.allocator.allocate(regionLength)) >= 0) {
                        pick = s;
                        break;
                    }
                }
            }
            if (pick == null) {
                break;
            }
            out.add(new Placed(pick, off));
            candidates.remove(pick);
        }
        return out;
    }
}

package io.kvpool.master;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.random.RandomGenerator;

/**
 * Where a new object's replicas go: on distinct active segments, the preferred segment first (if
 * named, active and with room), then on segments of hosts that hold no copy yet (segments of one
 * host fail together), and only when no other host has room, on further segments of a host already
 * used (still distinct segments: such copies share a failure). Among the eligible segments, by the
 * power of two choices (of two random segments, the
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
            if (s.placeable()) {
                candidates.add(s);
            }
        }
        List<Placed> out = new ArrayList<>(replicas);
        Set<String> usedHosts = new HashSet<>();
        if (preferred != null && !preferred.isEmpty()) {
            for (Iterator<Segment> it = candidates.iterator(); it.hasNext(); ) {
                Segment s = it.next();
                if (s.name.equals(preferred)) {
                    it.remove();
                    long off = s.allocator.allocate(regionLength);
                    if (off >= 0) {
                        out.add(new Placed(s, off));
                        usedHosts.add(s.address.host());
                    }
                    break;
                }
            }
        }
        while (out.size() < replicas && !candidates.isEmpty()) {
            List<Segment> otherHosts = new ArrayList<>(candidates.size());
            for (Segment s : candidates) {
                if (!usedHosts.contains(s.address.host())) {
                    otherHosts.add(s);
                }
            }
            Placed p = otherHosts.isEmpty() ? null : pick(otherHosts, regionLength, random);
            if (p == null) {
                p = pick(candidates, regionLength, random); // no other host has room: a distinct segment still
            }
            if (p == null) {
                break;
            }
            out.add(p);
            candidates.remove(p.segment());
            usedHosts.add(p.segment().address.host());
        }
        return out;
    }

    /**
     * Reserves a region for one more copy of an object whose copies are on the segments {@code holding}
     * (ids; some may be gone): on a placeable segment (active, not draining) that holds none, of a host that holds none when one
     * of those has room. Null when nothing fits (a repair does not evict).
     */
    static Placed oneMore(Segments segments, long regionLength, Set<Integer> holding, RandomGenerator random) {
        Set<String> usedHosts = new HashSet<>();
        for (int id : holding) {
            Segment s = segments.get(id);
            if (s != null) {
                usedHosts.add(s.address.host());
            }
        }
        List<Segment> otherHosts = new ArrayList<>();
        List<Segment> sameHosts = new ArrayList<>();
        for (Segment s : segments.all()) {
            if (s.placeable() && !holding.contains(s.id)) {
                (usedHosts.contains(s.address.host()) ? sameHosts : otherHosts).add(s);
            }
        }
        Placed p = otherHosts.isEmpty() ? null : pick(otherHosts, regionLength, random);
        return p != null || sameHosts.isEmpty() ? p : pick(sameHosts, regionLength, random);
    }

    /** Reserves a region on one of {@code pool}: the better of two random ones, else the emptiest that fits. */
    private static Placed pick(List<Segment> pool, long regionLength, RandomGenerator random) {
        long off;
        if (pool.size() >= 2) {
            int a = random.nextInt(pool.size());
            int b = random.nextInt(pool.size() - 1);
            if (b >= a) {
                b++;
            }
            Segment sa = pool.get(a);
            Segment sb = pool.get(b);
            Segment first = sa.allocator.free() >= sb.allocator.free() ? sa : sb;
            Segment second = first == sa ? sb : sa;
            if ((off = first.allocator.allocate(regionLength)) >= 0) {
                return new Placed(first, off);
            }
            if ((off = second.allocator.allocate(regionLength)) >= 0) {
                return new Placed(second, off);
            }
        }
        List<Segment> byFree = new ArrayList<>(pool);
        byFree.sort(Comparator.comparingLong((Segment s) -> s.allocator.free()).reversed());
        for (Segment s : byFree) {
            if ((off = s.allocator.allocate(regionLength)) >= 0) {
                return new Placed(s, off);
            }
        }
        return null;
    }
}

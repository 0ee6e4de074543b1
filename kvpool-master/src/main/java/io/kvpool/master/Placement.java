package io.kvpool.master;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
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

    /** Tries of random segments before a placement scans them all: enough to find two eligible ones almost always. */
    static final int SAMPLES = 16;

    /**
     * The registered segments as placement reads them: an array to sample at random, and the newest registration of
     * each name (for the preferred segment). Rebuilt by {@link Segments} whenever a segment comes or goes, so that
     * placing an object costs the same with 3 segments as with 1,000.
     */
    record Pool(Segment[] all, Map<String, Segment> byName) {
        static final Pool EMPTY = new Pool(new Segment[0], Map.of());

        static Pool of(Collection<Segment> segments) {
            Segment[] all = segments.toArray(new Segment[0]);
            Map<String, Segment> byName = new HashMap<>();
            for (Segment s : all) {
                byName.merge(s.name, s, (x, y) -> x.id > y.id ? x : y);
            }
            return new Pool(all, byName);
        }
    }

    /** Reserves up to {@code replicas} regions of {@code regionLength} bytes; fewer (or none) when nothing fits. */
    static List<Placed> choose(Collection<Segment> segments, long regionLength, int replicas, String preferred,
                               RandomGenerator random) {
        return choose(Pool.of(segments), regionLength, replicas, preferred, random);
    }

    /**
     * As {@link #choose(Collection, long, int, String, RandomGenerator)} on a pool. Each copy is first placed by
     * sampling: up to {@link #SAMPLES} random segments, of which the first two eligible ones (placeable, holding no
     * copy of this object, of a host that holds none) are the two choices. Rejection sampling picks uniformly among
     * the eligible segments, as a scan of them would. Only when sampling finds fewer than two with room (most
     * segments full, joining, or on used hosts) does the placement scan every segment, as it always did.
     */
    static List<Placed> choose(Pool pool, long regionLength, int replicas, String preferred, RandomGenerator random) {
        List<Placed> out = new ArrayList<>(replicas);
        Set<String> usedHosts = new HashSet<>();
        Segment tried = null;
        if (preferred != null && !preferred.isEmpty()) {
            Segment s = pool.byName().get(preferred);
            if (s != null && s.placeable()) {
                tried = s;
                long off = s.allocator.allocate(regionLength);
                if (off >= 0) {
                    out.add(new Placed(s, off));
                    usedHosts.add(s.address.host());
                }
            }
        }
        while (out.size() < replicas) {
            Placed p = sampled(pool.all(), regionLength, out, tried, usedHosts, random);
            if (p == null) {
                p = scanned(pool.all(), regionLength, out, tried, usedHosts, random);
            }
            if (p == null) {
                break;
            }
            out.add(p);
            usedHosts.add(p.segment().address.host());
        }
        return out;
    }

    /** The power of two choices among segments sampled at random; null when it found fewer than two, or no room. */
    private static Placed sampled(Segment[] all, long regionLength, List<Placed> out, Segment tried,
                                  Set<String> usedHosts, RandomGenerator random) {
        if (all.length < 2) {
            return null;
        }
        Segment a = null;
        Segment b = null;
        for (int i = 0; i < SAMPLES && b == null; i++) {
            Segment s = all[random.nextInt(all.length)];
            if (s != a && eligible(s, out, tried) && !usedHosts.contains(s.address.host())) {
                if (a == null) {
                    a = s;
                } else {
                    b = s;
                }
            }
        }
        if (b == null) {
            return null;
        }
        Segment first = a.allocator.free() >= b.allocator.free() ? a : b;
        Segment second = first == a ? b : a;
        long off;
        if ((off = first.allocator.allocate(regionLength)) >= 0) {
            return new Placed(first, off);
        }
        if ((off = second.allocator.allocate(regionLength)) >= 0) {
            return new Placed(second, off);
        }
        return null;
    }

    private static boolean eligible(Segment s, List<Placed> out, Segment tried) {
        if (!s.placeable() || s == tried) {
            return false;
        }
        for (Placed p : out) {
            if (p.segment() == s) {
                return false;
            }
        }
        return true;
    }

    /**
     * Every eligible segment considered: of hosts holding no copy first, else (no other host has room) any
     * segment holding none, a distinct segment still.
     */
    private static Placed scanned(Segment[] all, long regionLength, List<Placed> out, Segment tried,
                                  Set<String> usedHosts, RandomGenerator random) {
        List<Segment> candidates = new ArrayList<>();
        List<Segment> otherHosts = new ArrayList<>();
        for (Segment s : all) {
            if (eligible(s, out, tried)) {
                candidates.add(s);
                if (!usedHosts.contains(s.address.host())) {
                    otherHosts.add(s);
                }
            }
        }
        Placed p = otherHosts.isEmpty() ? null : pick(otherHosts, regionLength, random);
        return p != null || candidates.isEmpty() ? p : pick(candidates, regionLength, random);
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
        // sorted by free space as read once: other puts allocate meanwhile, and a sort whose keys change under
        // it may throw ("Comparison method violates its general contract")
        long[] byFree = new long[pool.size()];
        for (int i = 0; i < byFree.length; i++) {
            byFree[i] = pool.get(i).allocator.free();
        }
        Integer[] order = new Integer[byFree.length];
        for (int i = 0; i < order.length; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (x, y) -> Long.compare(byFree[y], byFree[x]));
        for (int i : order) {
            Segment s = pool.get(i);
            if ((off = s.allocator.allocate(regionLength)) >= 0) {
                return new Placed(s, off);
            }
        }
        return null;
    }
}

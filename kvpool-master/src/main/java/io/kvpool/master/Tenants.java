package io.kvpool.master;

import io.kvpool.protocol.ResultCode;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Tenants of a shared pool: namespaces by key prefix, what each holds in memory and on the SSD tier, and
 * their quotas (docs/operations.md, "Tenants"; {@link Tenant}).
 *
 * <h2>Accounting</h2>
 * What a namespace holds is counted where the index changes: the same hooks that tell the KV events what a key
 * entered and left ({@link ObjectEvents.Shard}) add each object's regions, by medium, to its namespace's count in
 * that shard, under the shard's lock. A namespace's use is the sum over the shards (read without their locks: a
 * figure a few puts old). Reconfiguring re-counts every shard once, under its lock ({@link #recount}).
 *
 * <h2>Quotas</h2>
 * A put's regions (every copy) are admitted against its namespace's memory quota before they are placed
 * ({@link #admit}): a namespace set to refuse is answered QUOTA_EXCEEDED, one set to evict loses its own least
 * recently read objects until the put fits ({@link Eviction#evictNamespace}), never another's. Memory eviction
 * for room takes from namespaces over their quota first ({@link Eviction#evict}), and a spill that would take a
 * namespace past its SSD quota drops the object instead. Puts in flight are not counted: a tenant's
 * concurrent puts can pass its quota by what they hold between their start and their commit.
 *
 * <p>Namespace 0 is every key no prefix matches (no quota); tenant {@code i} of the list is namespace {@code i+1}.
 */
final class Tenants {

    /** One configuration: the tenants, and their prefixes longest first. */
    private record Layout(List<Tenant> tenants, byte[][] prefixes, int[] namespaceOf) {
        static Layout of(List<Tenant> tenants) {
            record P(byte[] bytes, int ns) {
            }
            List<P> all = new ArrayList<>();
            for (int i = 0; i < tenants.size(); i++) {
                for (String p : tenants.get(i).prefixes()) {
                    all.add(new P(p.getBytes(StandardCharsets.UTF_8), i + 1));
                }
            }
            all.sort(Comparator.comparingInt((P p) -> -p.bytes().length));
            byte[][] prefixes = new byte[all.size()][];
            int[] ns = new int[all.size()];
            for (int i = 0; i < all.size(); i++) {
                prefixes[i] = all.get(i).bytes();
                ns[i] = all.get(i).ns();
            }
            return new Layout(List.copyOf(tenants), prefixes, ns);
        }
    }

    private volatile Layout layout = Layout.of(List.of());
    /** Each index shard's hooks, whose counts add up to the namespaces' use. */
    private final List<ObjectEvents.Shard> shards = new CopyOnWriteArrayList<>();
    /** Per namespace: puts refused over quota, objects evicted for their own namespace's quota. */
    private volatile AtomicLongArray refused = new AtomicLongArray(1);
    private volatile AtomicLongArray ownEvictions = new AtomicLongArray(1);

    void register(ObjectEvents.Shard s) {
        shards.add(s);
    }

    /** Whether any tenant is configured (without, the hooks count nothing). */
    boolean active() {
        return !layout.tenants().isEmpty();
    }

    List<Tenant> tenants() {
        return layout.tenants();
    }

    /** Namespaces, the keys no prefix matches included. */
    int namespaces() {
        return layout.tenants().size() + 1;
    }

    /** The tenant of namespace {@code ns}, or null for namespace 0. */
    Tenant tenant(int ns) {
        return ns == 0 ? null : layout.tenants().get(ns - 1);
    }

    /** The namespace of {@code key}. */
    int namespace(byte[] key) {
        Layout l = layout;
        for (int i = 0; i < l.prefixes().length; i++) {
            byte[] p = l.prefixes()[i];
            if (key.length >= p.length && java.util.Arrays.equals(key, 0, p.length, p, 0, p.length)) {
                return l.namespaceOf()[i];
            }
        }
        return 0;
    }

    /** The namespace of the object in {@code slot} (under its shard's lock; copies nothing). */
    int namespace(ObjectTable t, int slot) {
        Layout l = layout;
        for (int i = 0; i < l.prefixes().length; i++) {
            if (t.keyStartsWith(slot, l.prefixes()[i])) {
                return l.namespaceOf()[i];
            }
        }
        return 0;
    }

    /** Bytes namespace {@code ns} holds in memory (every copy's region). */
    long memoryUsed(int ns) {
        long n = 0;
        for (ObjectEvents.Shard s : shards) {
            n += s.memoryOf(ns);
        }
        return n;
    }

    /** Bytes namespace {@code ns} holds on the SSD tier. */
    long diskUsed(int ns) {
        long n = 0;
        for (ObjectEvents.Shard s : shards) {
            n += s.diskOf(ns);
        }
        return n;
    }

    long refusedPuts(int ns) {
        AtomicLongArray r = refused;
        return ns < r.length() ? r.get(ns) : 0;
    }

    long ownEvictions(int ns) {
        AtomicLongArray r = ownEvictions;
        return ns < r.length() ? r.get(ns) : 0;
    }

    /**
     * Whether a put of {@code bytes} (its regions, every copy) under {@code key} may be placed: OK, or
     * QUOTA_EXCEEDED when its namespace refuses or cannot make room from its own objects. Caller holds the epoch
     * read lock and no shard lock (evicting takes them).
     */
    ResultCode admit(byte[] key, long bytes, Eviction eviction) {
        if (!active()) {
            return ResultCode.OK;
        }
        int ns = namespace(key);
        Tenant t = tenant(ns);
        if (t == null || t.memoryBytes() < 0) {
            return ResultCode.OK;
        }
        long over = memoryUsed(ns) + bytes - t.memoryBytes();
        if (over <= 0) {
            return ResultCode.OK;
        }
        if (t.overQuota() == Tenant.OverQuota.EVICT_OWN && bytes <= t.memoryBytes()) {
            long[] freedAndKeys = eviction.evictNamespace(ns, over);
            ownEvictions.addAndGet(ns, freedAndKeys[1]);
            if (memoryUsed(ns) + bytes <= t.memoryBytes()) {
                return ResultCode.OK;
            }
        }
        refused.incrementAndGet(ns);
        return ResultCode.QUOTA_EXCEEDED;
    }

    /** Memory namespaces hold beyond their quotas, in all: what eviction takes first. */
    long memoryOverQuota() {
        long n = 0;
        List<Tenant> ts = layout.tenants();
        for (int i = 0; i < ts.size(); i++) {
            long q = ts.get(i).memoryBytes();
            if (q >= 0) {
                n += Math.max(0, memoryUsed(i + 1) - q);
            }
        }
        return n;
    }

    /** Per namespace, whether it holds more memory than its quota now (a round's view: read once). */
    boolean[] overMemoryQuota() {
        boolean[] out = new boolean[namespaces()];
        for (int ns = 1; ns < out.length; ns++) {
            Tenant t = tenant(ns);
            out[ns] = t.memoryBytes() >= 0 && memoryUsed(ns) > t.memoryBytes();
        }
        return out;
    }

    /** Whether {@code bytes} more on the SSD tier keep namespace {@code ns} within its SSD quota. */
    boolean maySpill(int ns, long bytes) {
        Tenant t = tenant(ns);
        return t == null || t.diskBytes() < 0 || diskUsed(ns) + bytes <= t.diskBytes();
    }

    /**
     * Takes {@code tenants} (checked: {@link Tenant#checked}) as the configuration and re-counts every shard under
     * its lock: a key's namespace may have changed.
     */
    void configure(List<Tenant> tenants, ObjectIndex index) {
        Layout l = Layout.of(Tenant.checked(tenants));
        AtomicLongArray r = new AtomicLongArray(l.tenants().size() + 1);
        AtomicLongArray e = new AtomicLongArray(l.tenants().size() + 1);
        // counters follow their tenant by name across a reconfiguration
        List<Tenant> before = layout.tenants();
        for (int i = 0; i < l.tenants().size(); i++) {
            for (int j = 0; j < before.size(); j++) {
                if (before.get(j).name().equals(l.tenants().get(i).name())) {
                    r.set(i + 1, refusedPuts(j + 1));
                    e.set(i + 1, ownEvictions(j + 1));
                }
            }
        }
        layout = l;
        refused = r;
        ownEvictions = e;
        recount(index);
    }

    @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
    private void recount(ObjectIndex index) {
        index.forEachShard(shard -> shard.objects.events.recount(shard.objects, this));
    }
}

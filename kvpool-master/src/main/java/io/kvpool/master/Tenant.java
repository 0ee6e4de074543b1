package io.kvpool.master;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.config.Size;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * One namespace of a shared pool and its quotas (docs/operations.md, "Tenants"). A key belongs to the tenant
 * with the longest prefix it starts with (connector keys spell the model and the weights version first:
 * {@code kvp1/MODEL/WEIGHTS/...}); a key no prefix matches is in no tenant and under no quota.
 *
 * @param name         a name for metrics and the status page ({@code [A-Za-z0-9_.-]}, 1..64)
 * @param prefixes     key prefixes (UTF-8, 1..512 bytes each), at least one; no two tenants share one
 * @param memoryBytes  most bytes its objects may hold in memory (every copy's region), or -1 for no limit
 * @param diskBytes    most bytes on the SSD tier, or -1 for no limit: an eviction of its objects beyond it drops
 *                     them instead of spilling them
 * @param overQuota    what a put that would take it past its memory quota does
 */
public record Tenant(String name, List<String> prefixes, long memoryBytes, long diskBytes, OverQuota overQuota) {

    /** What a put over its tenant's memory quota does. */
    public enum OverQuota {
        /** Refused with QUOTA_EXCEEDED: the tenant's objects stay, and nobody else's are touched. */
        REFUSE,
        /** Evicts the tenant's own least recently read objects until it fits: never another tenant's. */
        EVICT_OWN;

        /** The config spelling: {@code refuse} or {@code evict}. */
        public String spelling() {
            return this == REFUSE ? "refuse" : "evict";
        }

        static OverQuota parse(String s, String where) {
            return switch (s.toLowerCase(Locale.ROOT)) {
                case "refuse" -> REFUSE;
                case "evict", "evict_own", "evict-own" -> EVICT_OWN;
                default -> throw new IllegalArgumentException(where + ": over-quota action must be refuse or evict, got '"
                        + s + "'");
            };
        }
    }

    public Tenant {
        if (name == null || !name.matches("[A-Za-z0-9_.-]{1,64}")) {
            throw new IllegalArgumentException("tenant name must be 1..64 of [A-Za-z0-9_.-], got '" + name + "'");
        }
        if (prefixes == null || prefixes.isEmpty()) {
            throw new IllegalArgumentException("tenant " + name + ": at least one key prefix is needed");
        }
        for (String p : prefixes) {
            int n = p == null ? 0 : p.getBytes(StandardCharsets.UTF_8).length;
            if (n < 1 || n > 512) {
                throw new IllegalArgumentException("tenant " + name + ": a key prefix must be 1..512 UTF-8 bytes, got '"
                        + p + "'");
            }
        }
        if (memoryBytes < -1 || diskBytes < -1) {
            throw new IllegalArgumentException("tenant " + name + ": a quota is a size, or -1 for none");
        }
        if (overQuota == null) {
            throw new IllegalArgumentException("tenant " + name + ": over-quota action must be refuse or evict");
        }
        prefixes = List.copyOf(prefixes);
    }

    /**
     * A tenant from its flag form, {@code NAME=PREFIX[,PREFIX...]:MEMORY[:DISK[:refuse|evict]]}, sizes with units
     * or {@code none} (e.g. {@code team-a=kvp1/llama-70b/:8GiB:64GiB:evict}); the action defaults to refuse.
     */
    public static Tenant parse(String spec) {
        String where = "--tenant '" + spec + "'";
        int eq = spec.indexOf('=');
        if (eq <= 0) {
            throw new IllegalArgumentException(where + ": expected NAME=PREFIX[,PREFIX...]:MEMORY[:DISK[:refuse|evict]]");
        }
        String name = spec.substring(0, eq);
        // in this form a prefix holds no ':' or ','; the offload config and the HTTP API take any
        String[] parts = spec.substring(eq + 1).split(":", -1);
        if (parts.length < 2 || parts.length > 4) {
            throw new IllegalArgumentException(where + ": expected NAME=PREFIX[,PREFIX...]:MEMORY[:DISK[:refuse|evict]]");
        }
        List<String> prefixes = Arrays.asList(parts[0].split(",", -1));
        try {
            return new Tenant(name, prefixes, size(parts[1], where), parts.length > 2 ? size(parts[2], where) : -1,
                    parts.length > 3 ? OverQuota.parse(parts[3], where) : OverQuota.REFUSE);
        } catch (IllegalArgumentException e) {
            throw e.getMessage().startsWith("--tenant") ? e : new IllegalArgumentException(where + ": " + e.getMessage(), e);
        }
    }

    private static long size(String s, String where) {
        if (s.equalsIgnoreCase("none") || s.equals("-1")) {
            return -1;
        }
        try {
            return Size.parse(s).bytes();
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(where + ": bad size '" + s + "' (" + e.getMessage() + ")", e);
        }
    }

    /** The flag form ({@link #parse} reads it back). */
    public String spec() {
        return name + "=" + String.join(",", prefixes) + ":" + (memoryBytes < 0 ? "none" : memoryBytes + "B") + ":"
                + (diskBytes < 0 ? "none" : diskBytes + "B") + ":" + overQuota.spelling();
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    /**
     * Tenants from their JSON form, {@code {"tenants": [{"name": ..., "prefixes": [...], "memory": SIZE, "disk": SIZE,
     * "over_quota": "refuse"|"evict"}]}} (a bare list too), as the offload config, the HTTP API and etcd keep them.
     * A SIZE is a number of bytes, a string with units, or null / "none" for no limit; a missing one is no limit.
     * Unknown fields are refused with the known ones.
     */
    public static List<Tenant> fromJson(String text) {
        try {
            JsonNode root = JSON.readTree(text);
            JsonNode list = root != null && root.isObject() ? root.get("tenants") : root;
            if (list == null || !list.isArray()) {
                throw new IllegalArgumentException("tenants: expected {\"tenants\": [...]} or a list");
            }
            List<Tenant> out = new ArrayList<>();
            for (JsonNode t : list) {
                out.add(fromJson(t));
            }
            return checked(out);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("tenants: not JSON: " + e.getOriginalMessage(), e);
        }
    }

    private static Tenant fromJson(JsonNode t) {
        Set<String> known = Set.of("name", "prefixes", "memory", "disk", "over_quota");
        for (var it = t.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!known.contains(f)) {
                throw new IllegalArgumentException("tenant " + t.path("name").asText("?") + ": unknown field '" + f
                        + "' (known: name, prefixes, memory, disk, over_quota)");
            }
        }
        List<String> prefixes = new ArrayList<>();
        t.path("prefixes").forEach(p -> prefixes.add(p.asText()));
        String where = "tenant " + t.path("name").asText("?");
        return new Tenant(t.path("name").asText(null), prefixes, jsonSize(t.get("memory"), where),
                jsonSize(t.get("disk"), where), t.hasNonNull("over_quota")
                ? OverQuota.parse(t.get("over_quota").asText(), where) : OverQuota.REFUSE);
    }

    private static long jsonSize(JsonNode v, String where) {
        if (v == null || v.isNull()) {
            return -1;
        }
        if (v.isIntegralNumber()) {
            return v.asLong() < 0 ? -1 : v.asLong();
        }
        return size(v.asText(), where);
    }

    /** The JSON form of {@code tenants} ({@link #fromJson} reads it back), sizes in bytes. */
    public static String toJson(List<Tenant> tenants) {
        var root = JSON.createObjectNode();
        var list = root.putArray("tenants");
        for (Tenant t : tenants) {
            var o = list.addObject();
            o.put("name", t.name());
            t.prefixes().forEach(o.putArray("prefixes")::add);
            if (t.memoryBytes() >= 0) {
                o.put("memory", t.memoryBytes());
            } else {
                o.putNull("memory");
            }
            if (t.diskBytes() >= 0) {
                o.put("disk", t.diskBytes());
            } else {
                o.putNull("disk");
            }
            o.put("over_quota", t.overQuota().spelling());
        }
        return root.toString();
    }

    /** Checks a whole list: names and prefixes unique. */
    public static List<Tenant> checked(List<Tenant> tenants) {
        Set<String> names = new HashSet<>();
        Set<String> prefixes = new HashSet<>();
        for (Tenant t : tenants) {
            if (!names.add(t.name())) {
                throw new IllegalArgumentException("two tenants are named " + t.name());
            }
            for (String p : t.prefixes()) {
                if (!prefixes.add(p)) {
                    throw new IllegalArgumentException("key prefix '" + p + "' is given to two tenants");
                }
            }
        }
        return List.copyOf(new ArrayList<>(tenants));
    }
}

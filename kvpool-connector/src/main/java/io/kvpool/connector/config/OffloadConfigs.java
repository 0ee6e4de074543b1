package io.kvpool.connector.config;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * Reads and checks {@link OffloadConfig}s. Every rule names the field it is about:
 * <ul>
 *   <li>{@code type} is required: {@code native} or {@code pool};</li>
 *   <li>{@code cpu} is required; a disk-only config is rejected (the disk tier holds what the CPU
 *       tier evicts, so it cannot stand alone);</li>
 *   <li>fields of the other type are rejected ({@code master} on native), or warned about where
 *       harmless ({@code promote_after} and {@code reset} on native);</li>
 *   <li>unknown fields are rejected, listing the known ones; retired names (other systems' or
 *       earlier ones) are rejected with the field to use instead.</li>
 * </ul>
 * The config may stand alone or sit under an {@code offload:} key (as in the launcher's client
 * config file).
 */
public final class OffloadConfigs {

    /** A config and the warnings its reading produced. */
    public record Loaded(OffloadConfig config, List<String> warnings) {
    }

    private static final Set<String> COMMON = Set.of("type", "cpu", "disk", "versioned_keys", "transfer");
    private static final Set<String> POOL_ONLY = Set.of("promote_after", "reset", "master", "shm_group", "tenants",
            "events");
    /** The config's {@code events} fields and the master flag each becomes. */
    private static final Map<String, String> EVENT_FLAGS = new LinkedHashMap<>(Map.of(
            "endpoint", "--kv-events-endpoint", "replay_endpoint", "--kv-events-replay-endpoint",
            "topic", "--kv-events-topic", "buffer_steps", "--kv-events-buffer-steps",
            "queue_size", "--kv-events-queue-size", "hwm", "--kv-events-hwm", "info_bytes", "--kv-events-info-bytes"));
    private static final Map<String, String> RETIRED = Map.ofEntries(
            Map.entry("cpu_size", "cpu"),
            Map.entry("local_cpu", "cpu"),
            Map.entry("max_local_cpu_size", "cpu (a size with units, e.g. 8GiB)"),
            Map.entry("segment_size", "cpu"),
            Map.entry("global_segment_size", "cpu"),
            Map.entry("local_disk", "disk.path"),
            Map.entry("disk_dir", "disk.path"),
            Map.entry("disk_size", "disk.size"),
            Map.entry("max_local_disk_size", "disk.size"),
            Map.entry("master_server_address", "master (or let the launcher fill it in)"),
            Map.entry("chunk_size", "the engine's block size (--block-size); the offload config does not set it"));

    private OffloadConfigs() {
    }

    /** Reads a file: YAML for .yaml / .yml, else JSON. */
    public static Loaded load(Path file) throws IOException {
        String name = file.getFileName().toString().toLowerCase(Locale.ROOT);
        String text = Files.readString(file);
        try {
            return parse(text, name.endsWith(".yaml") || name.endsWith(".yml"));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(file + ": " + e.getMessage(), e);
        }
    }

    public static Loaded parse(String text, boolean yaml) {
        ObjectMapper m = yaml ? new ObjectMapper(new YAMLFactory()) : new ObjectMapper();
        JsonNode root;
        try {
            root = m.readTree(text);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("not valid " + (yaml ? "YAML" : "JSON") + ": " + e.getOriginalMessage());
        }
        if (root == null || !root.isObject()) {
            throw new IllegalArgumentException("the offload config must be a mapping");
        }
        if (root.has("offload")) {
            root = root.get("offload");
            if (!root.isObject()) {
                throw new IllegalArgumentException("offload: must be a mapping");
            }
        }
        return fromTree(root);
    }

    static Loaded fromTree(JsonNode n) {
        List<String> warnings = new ArrayList<>();
        String type = n.path("type").asText("");
        if (!type.equals("native") && !type.equals("pool")) {
            throw new IllegalArgumentException("offload.type: required, native or pool" + (type.isEmpty() ? ""
                    : " (got '" + type + "')"));
        }
        for (Iterator<String> it = n.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (RETIRED.containsKey(f)) {
                throw new IllegalArgumentException("offload." + f + ": no longer supported; use " + RETIRED.get(f));
            }
            if (!COMMON.contains(f) && !POOL_ONLY.contains(f)) {
                Set<String> known = new TreeSet<>(COMMON);
                known.addAll(POOL_ONLY);
                throw new IllegalArgumentException("offload." + f + ": unknown field; known fields: " + known);
            }
            if (type.equals("native") && POOL_ONLY.contains(f)) {
                if (f.equals("master")) {
                    throw new IllegalArgumentException("offload.master: applies to type pool only (native offload"
                            + " runs inside the engine, with no servers)");
                }
                warnings.add("offload." + f + ": applies to type pool only; ignored for type native");
            }
        }
        OffloadConfig.Disk disk = disk(n.get("disk"), type);
        if (!n.hasNonNull("cpu")) {
            throw new IllegalArgumentException("offload.cpu: required (e.g. cpu: 8GiB)" + (disk != null
                    ? "; a disk-only config is rejected: the disk tier holds what the CPU tier evicts" : ""));
        }
        Size cpu = size(n.get("cpu"), "offload.cpu");
        if (cpu.bytes() <= 0) {
            throw new IllegalArgumentException("offload.cpu: must be positive, got " + cpu);
        }
        boolean versioned = bool(n.get("versioned_keys"), "offload.versioned_keys");
        OffloadConfig.Transfer transfer = transfer(n.get("transfer"));
        if (type.equals("native")) {
            return new Loaded(new OffloadConfig.Native(cpu, disk, versioned, transfer), warnings);
        }
        int promote = 2;
        if (n.has("promote_after")) {
            JsonNode p = n.get("promote_after");
            if (!p.canConvertToInt() || p.intValue() < 0) {
                throw new IllegalArgumentException("offload.promote_after: a count >= 0 (0 = never), got " + p);
            }
            promote = p.intValue();
        }
        String reset = n.path("reset").asText("all");
        if (!reset.equals("all") && !reset.equals("model")) {
            throw new IllegalArgumentException("offload.reset: all or model, got '" + reset + "'");
        }
        String master = n.hasNonNull("master") ? n.get("master").asText() : null;
        if (master != null) {
            try {
                MasterAddress.parse(master);
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("offload.master: host:port or etcd://host:port[,...][/cluster], got '"
                        + master + "': " + e.getMessage(), e);
            }
        }
        String shmGroup = null;
        if (n.hasNonNull("shm_group")) {
            JsonNode g = n.get("shm_group");
            if (!g.isTextual() || g.textValue().isBlank() || !g.textValue().equals(g.textValue().strip())) {
                throw new IllegalArgumentException("offload.shm_group: the name of a group on the nodes' machines, got " + g);
            }
            shmGroup = g.textValue();
        }
        String tenants = null;
        if (n.hasNonNull("tenants")) {
            if (!n.get("tenants").isArray()) {
                throw new IllegalArgumentException("offload.tenants: a list of {name, prefixes, memory, disk, over_quota},"
                        + " got " + n.get("tenants"));
            }
            tenants = "{\"tenants\":" + n.get("tenants") + "}";
        }
        return new Loaded(new OffloadConfig.Pool(cpu, disk, promote, reset, master, versioned, transfer, shmGroup,
                tenants, eventFlags(n.get("events"))), warnings);
    }

    /** The master's KV event flags from {@code events} (the master checks the values and names its flag). */
    private static List<String> eventFlags(JsonNode e) {
        if (e == null || e.isNull()) {
            return List.of();
        }
        if (!e.isObject() || !e.hasNonNull("endpoint")) {
            throw new IllegalArgumentException("offload.events: {endpoint: tcp://HOST:PORT, replay_endpoint, topic,"
                    + " buffer_steps, queue_size, hwm, info_bytes}, endpoint required; got " + e);
        }
        List<String> flags = new ArrayList<>();
        for (var it = e.fields(); it.hasNext(); ) {
            var f = it.next();
            String flag = EVENT_FLAGS.get(f.getKey());
            if (flag == null) {
                throw new IllegalArgumentException("offload.events." + f.getKey() + ": unknown field; known fields: "
                        + EVENT_FLAGS.keySet());
            }
            if (!f.getValue().isValueNode() || f.getValue().isNull()) {
                throw new IllegalArgumentException("offload.events." + f.getKey() + ": a value, got " + f.getValue());
            }
            flags.add(flag);
            flags.add(f.getValue().asText());
        }
        return flags;
    }

    private static OffloadConfig.Disk disk(JsonNode d, String type) {
        if (d == null || d.isNull()) {
            return null;
        }
        if (!d.isObject()) {
            throw new IllegalArgumentException("offload.disk: a mapping with path (and size), got " + d);
        }
        for (Iterator<String> it = d.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!f.equals("path") && !f.equals("size")) {
                throw new IllegalArgumentException("offload.disk." + f + ": unknown field; known fields: [path, size]");
            }
        }
        if (!d.hasNonNull("path") || d.get("path").asText().isBlank()) {
            throw new IllegalArgumentException("offload.disk.path: required when disk is given");
        }
        Size size = d.hasNonNull("size") ? size(d.get("size"), "offload.disk.size") : null;
        if (type.equals("pool") && size == null) {
            throw new IllegalArgumentException("offload.disk.size: required for type pool (e.g. 200GiB)");
        }
        return new OffloadConfig.Disk(Path.of(d.get("path").asText()), size);
    }

    private static OffloadConfig.Transfer transfer(JsonNode t) {
        if (t == null || t.isNull()) {
            return null;
        }
        if (!t.isObject() || !t.hasNonNull("connector")) {
            throw new IllegalArgumentException("offload.transfer.connector: required when transfer is given"
                    + " (e.g. NixlConnector)");
        }
        for (Iterator<String> it = t.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!Set.of("connector", "role", "extra").contains(f)) {
                throw new IllegalArgumentException("offload.transfer." + f
                        + ": unknown field; known fields: [connector, extra, role]");
            }
        }
        String role = t.path("role").asText("kv_both");
        if (!Set.of("kv_both", "kv_producer", "kv_consumer").contains(role)) {
            throw new IllegalArgumentException("offload.transfer.role: kv_both, kv_producer or kv_consumer, got '" + role + "'");
        }
        Map<String, Object> extra = new LinkedHashMap<>();
        if (t.has("extra")) {
            extra = new ObjectMapper().convertValue(t.get("extra"), LinkedHashMap.class);
        }
        return new OffloadConfig.Transfer(t.get("connector").asText(), role, extra);
    }

    private static Size size(JsonNode v, String field) {
        try {
            return Size.parse(v.asText());
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(field + ": " + e.getMessage());
        }
    }

    private static boolean bool(JsonNode v, String field) {
        if (v == null || v.isNull()) {
            return false;
        }
        if (!v.isBoolean()) {
            throw new IllegalArgumentException(field + ": true or false, got " + v);
        }
        return v.booleanValue();
    }
}

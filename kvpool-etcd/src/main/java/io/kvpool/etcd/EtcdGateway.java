package io.kvpool.etcd;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.kvpool.config.HostPort;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;

/**
 * The few etcd v3 calls kvpool needs, over etcd's JSON gateway ({@code POST /v3/...} on the client
 * port; keys and values base64, 64-bit integers as strings), with the JDK's HTTP client: no gRPC
 * stack in the client SDK, and the same calls as the Python side ({@code kvpool.etcd}).
 *
 * <p>Every call tries the endpoints in turn, starting with the one that answered last, and fails with
 * an {@link EtcdException} naming all of them when none answers. A call never waits longer than the
 * timeout on one endpoint. Watches ({@link #watch}) are streams: one HTTP response that stays open and
 * carries one JSON message a line; {@link Watch#close()} ends one from any thread.
 *
 * <p>Facts relied on, checked against etcd 3.4: a lease's TTL is at least 2 s whatever is asked; a
 * keep-alive of a lease that expired answers without a TTL (read here as 0); a failed transaction
 * answers without {@code succeeded}; a range that finds nothing answers without {@code kvs}; a watch
 * stream's first message confirms its creation ({@code created}) and carries no events.
 */
public final class EtcdGateway implements AutoCloseable {

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder B64D = Base64.getDecoder();

    private final List<HostPort> endpoints;
    private final Duration timeout;
    private final HttpClient http;
    private volatile int preferred;

    public EtcdGateway(List<HostPort> endpoints, Duration timeout) {
        if (endpoints.isEmpty()) {
            throw new IllegalArgumentException("no etcd endpoints");
        }
        this.endpoints = List.copyOf(endpoints);
        this.timeout = timeout;
        this.http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(timeout).build();
    }

    public List<HostPort> endpoints() {
        return endpoints;
    }

    /** One key and its metadata. */
    public record KeyValue(String key, byte[] value, long createRevision, long modRevision, long lease) {
    }

    /** A range's keys and the store's revision when it was read. */
    public record Range(long revision, List<KeyValue> kvs) {
        public KeyValue first() {
            return kvs.isEmpty() ? null : kvs.getFirst();
        }
    }

    /** A lease: its id and the TTL etcd granted. */
    public record Lease(long id, long ttlSeconds) {
    }

    /** One change seen by a watch. */
    public record Event(boolean deleted, KeyValue kv) {
    }

    /** The value of {@code key}, if any. */
    public Range range(String key) throws EtcdException {
        ObjectNode req = JSON.createObjectNode().put("key", b64(key));
        return readRange(call("/v3/kv/range", req));
    }

    /** Every key starting with {@code prefix}, in key order. */
    public Range rangePrefix(String prefix) throws EtcdException {
        ObjectNode req = JSON.createObjectNode().put("key", b64(prefix)).put("range_end", B64.encodeToString(prefixEnd(prefix)));
        return readRange(call("/v3/kv/range", req));
    }

    /** Puts {@code key} (attached to {@code lease} unless it is 0); returns the new revision. */
    public long put(String key, byte[] value, long lease) throws EtcdException {
        return revision(call("/v3/kv/put", putRequest(key, value, lease)));
    }

    /** Deletes {@code key}; returns how many keys went (0 or 1). */
    public long delete(String key) throws EtcdException {
        return call("/v3/kv/deleterange", JSON.createObjectNode().put("key", b64(key))).path("deleted").asLong(0);
    }

    /** The outcome of a conditional write: whether it applied, and the key as it is when it did not. */
    public record Txn(boolean succeeded, long revision, KeyValue current) {
    }

    /** Creates {@code key} only if it does not exist; on failure returns the key that exists. */
    public Txn createIfAbsent(String key, byte[] value, long lease) throws EtcdException {
        return whenCreateRevision(key, 0, JSON.createObjectNode().set("request_put", putRequest(key, value, lease)));
    }

    /** Rewrites {@code key} only while it is the one created at {@code createRevision} (not deleted and re-created since). */
    public Txn putIfCreated(String key, long createRevision, byte[] value, long lease) throws EtcdException {
        return whenCreateRevision(key, createRevision,
                JSON.createObjectNode().set("request_put", putRequest(key, value, lease)));
    }

    /** Deletes {@code key} only while it is the one created at {@code createRevision}. */
    public Txn deleteIfCreated(String key, long createRevision) throws EtcdException {
        return whenCreateRevision(key, createRevision,
                JSON.createObjectNode().set("request_delete_range", JSON.createObjectNode().put("key", b64(key))));
    }

    private Txn whenCreateRevision(String key, long createRevision, ObjectNode success) throws EtcdException {
        ObjectNode req = JSON.createObjectNode();
        req.putArray("compare").addObject().put("target", "CREATE").put("result", "EQUAL").put("key", b64(key))
                .put("create_revision", Long.toString(createRevision));
        req.putArray("success").add(success);
        req.putArray("failure").addObject().set("request_range", JSON.createObjectNode().put("key", b64(key)));
        JsonNode rep = call("/v3/kv/txn", req);
        boolean ok = rep.path("succeeded").asBoolean(false);
        KeyValue current = null;
        if (!ok) {
            for (JsonNode r : rep.path("responses")) {
                JsonNode kvs = r.path("response_range").path("kvs");
                if (kvs.isArray() && !kvs.isEmpty()) {
                    current = keyValue(kvs.get(0));
                }
            }
        }
        return new Txn(ok, revision(rep), current);
    }

    /** Grants a lease of {@code ttlSeconds} (etcd may grant more). */
    public Lease grantLease(long ttlSeconds) throws EtcdException {
        JsonNode rep = call("/v3/lease/grant", JSON.createObjectNode().put("TTL", ttlSeconds));
        long id = rep.path("ID").asLong(0);
        if (id == 0) {
            throw new EtcdException("etcd granted no lease: " + rep);
        }
        return new Lease(id, rep.path("TTL").asLong(ttlSeconds));
    }

    /** Renews a lease once; returns its TTL in seconds, or 0 when the lease no longer exists. */
    public long keepAlive(long leaseId) throws EtcdException {
        JsonNode rep = call("/v3/lease/keepalive", JSON.createObjectNode().put("ID", Long.toString(leaseId)));
        return Math.max(0, rep.path("result").path("TTL").asLong(0));
    }

    /** Revokes a lease (its keys go with it); a lease already gone is not an error. */
    public void revoke(long leaseId) throws EtcdException {
        try {
            call("/v3/lease/revoke", JSON.createObjectNode().put("ID", Long.toString(leaseId)));
        } catch (EtcdException e) {
            if (!e.getMessage().contains("lease not found")) {
                throw e;
            }
        }
    }

    /** An open watch: {@link #next()} blocks for the next changes; {@link #close()} ends it from any thread. */
    public static final class Watch implements AutoCloseable {
        private final InputStream in;
        private final BufferedReader lines;
        private long revision;

        private Watch(InputStream in, long startRevision) {
            this.in = in;
            this.lines = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
            this.revision = startRevision - 1;
        }

        /**
         * The next batch of changes, or null when the stream ended (etcd restarted, the connection
         * broke, or {@link #close()}); the caller watches again from {@link #revision()} + 1.
         *
         * @throws EtcdException when etcd cancels the watch (for example, the start revision was compacted)
         */
        public List<Event> next() throws EtcdException {
            while (true) {
                String line;
                try {
                    line = lines.readLine();
                } catch (IOException e) {
                    return null;
                }
                if (line == null) {
                    return null;
                }
                if (line.isBlank()) {
                    continue;
                }
                JsonNode msg;
                try {
                    msg = JSON.readTree(line);
                } catch (IOException e) {
                    throw new EtcdException("etcd sent a watch message that is not JSON: " + abbreviate(line), e);
                }
                if (msg.has("error")) {
                    throw new EtcdException("etcd watch failed: " + msg.path("error").path("message").asText(line));
                }
                JsonNode result = msg.path("result");
                if (result.path("canceled").asBoolean(false)) {
                    throw new EtcdException("etcd canceled the watch: " + result.path("cancel_reason").asText("")
                            + (result.has("compact_revision") ? " (compacted at revision "
                            + result.path("compact_revision").asLong() + ")" : ""));
                }
                long rev = result.path("header").path("revision").asLong(revision);
                List<Event> events = new ArrayList<>();
                for (JsonNode e : result.path("events")) {
                    KeyValue kv = keyValue(e.path("kv"));
                    events.add(new Event("DELETE".equals(e.path("type").asText("PUT")), kv));
                    revision = Math.max(revision, kv.modRevision());
                }
                if (events.isEmpty()) {
                    if (!result.path("created").asBoolean(false)) {
                        revision = Math.max(revision, rev); // a progress notification
                    }
                    continue;
                }
                return events;
            }
        }

        /** The newest revision this watch has delivered. */
        public long revision() {
            return revision;
        }

        @Override
        public void close() {
            try {
                in.close();
            } catch (IOException ignored) {
                // closing to end the stream
            }
        }
    }

    /** Watches {@code key} (or every key under it, with {@code prefix}) from {@code startRevision}. */
    public Watch watch(String key, boolean prefix, long startRevision) throws EtcdException {
        ObjectNode create = JSON.createObjectNode().put("key", b64(key)).put("start_revision", Long.toString(startRevision));
        if (prefix) {
            create.put("range_end", B64.encodeToString(prefixEnd(key)));
        }
        ObjectNode req = JSON.createObjectNode();
        req.set("create_request", create);
        EtcdException last = null;
        for (int i = 0; i < endpoints.size(); i++) {
            int at = (preferred + i) % endpoints.size();
            HttpRequest r = HttpRequest.newBuilder(uri(at, "/v3/watch"))
                    .POST(HttpRequest.BodyPublishers.ofString(req.toString())).build();
            try {
                HttpResponse<InputStream> rep = http.send(r, HttpResponse.BodyHandlers.ofInputStream());
                if (rep.statusCode() != 200) {
                    String body = new String(rep.body().readAllBytes(), StandardCharsets.UTF_8);
                    throw new EtcdException("etcd " + endpoints.get(at) + " refused a watch: HTTP " + rep.statusCode()
                            + " " + abbreviate(body));
                }
                preferred = at;
                return new Watch(rep.body(), startRevision);
            } catch (IOException e) {
                last = new EtcdException(e.toString(), e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new EtcdException("interrupted while opening an etcd watch", e);
            }
        }
        throw unreachable(last);
    }

    private JsonNode call(String path, ObjectNode body) throws EtcdException {
        String json = body.toString();
        EtcdException last = null;
        for (int i = 0; i < endpoints.size(); i++) {
            int at = (preferred + i) % endpoints.size();
            HttpRequest r = HttpRequest.newBuilder(uri(at, path)).timeout(timeout)
                    .POST(HttpRequest.BodyPublishers.ofString(json)).build();
            HttpResponse<String> rep;
            try {
                rep = http.send(r, HttpResponse.BodyHandlers.ofString());
            } catch (IOException e) {
                last = new EtcdException(endpoints.get(at) + ": " + e, e);
                continue;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new EtcdException("interrupted while calling etcd " + path, e);
            }
            JsonNode n;
            try {
                n = JSON.readTree(rep.body());
            } catch (IOException e) {
                throw new EtcdException("etcd " + endpoints.get(at) + path + " answered HTTP " + rep.statusCode()
                        + " with a body that is not JSON: " + abbreviate(rep.body()), e);
            }
            if (rep.statusCode() != 200 || n.has("error")) {
                String msg = n.path("message").asText(n.path("error").asText(rep.body()));
                if (rep.statusCode() >= 500 && msg.contains("leader")) {
                    last = new EtcdException(endpoints.get(at) + path + ": " + msg); // that member has no raft leader
                    continue;
                }
                throw new EtcdException("etcd " + endpoints.get(at) + path + " refused: " + msg);
            }
            preferred = at;
            return n;
        }
        throw unreachable(last);
    }

    private EtcdException unreachable(EtcdException last) {
        return new EtcdException("no etcd endpoint answered (tried " + endpoints + "): "
                + (last == null ? "" : last.getMessage()), last);
    }

    private URI uri(int at, String path) {
        HostPort hp = endpoints.get(at);
        String host = hp.host().contains(":") ? "[" + hp.host() + "]" : hp.host();
        return URI.create("http://" + host + ":" + hp.port() + path);
    }

    private static ObjectNode putRequest(String key, byte[] value, long lease) {
        ObjectNode put = JSON.createObjectNode().put("key", b64(key)).put("value", B64.encodeToString(value));
        if (lease != 0) {
            put.put("lease", Long.toString(lease));
        }
        return put;
    }

    private static Range readRange(JsonNode rep) {
        List<KeyValue> kvs = new ArrayList<>();
        JsonNode arr = rep.path("kvs");
        if (arr instanceof ArrayNode a) {
            for (JsonNode kv : a) {
                kvs.add(keyValue(kv));
            }
        }
        return new Range(revision(rep), kvs);
    }

    private static KeyValue keyValue(JsonNode kv) {
        return new KeyValue(new String(B64D.decode(kv.path("key").asText("")), StandardCharsets.UTF_8),
                B64D.decode(kv.path("value").asText("")), kv.path("create_revision").asLong(0),
                kv.path("mod_revision").asLong(0), kv.path("lease").asLong(0));
    }

    private static long revision(JsonNode rep) {
        return rep.path("header").path("revision").asLong(0);
    }

    private static String b64(String s) {
        return B64.encodeToString(s.getBytes(StandardCharsets.UTF_8));
    }

    /** The range end that selects every key starting with {@code prefix} (its last byte plus one). */
    static byte[] prefixEnd(String prefix) {
        byte[] b = prefix.getBytes(StandardCharsets.UTF_8);
        for (int i = b.length - 1; i >= 0; i--) {
            if (b[i] != (byte) 0xFF) {
                b[i]++;
                return Arrays.copyOf(b, i + 1);
            }
        }
        return new byte[]{0}; // every key
    }

    private static String abbreviate(String s) {
        return s.length() <= 200 ? s : s.substring(0, 200) + "...";
    }

    @Override
    public void close() {
        http.shutdownNow();
    }
}

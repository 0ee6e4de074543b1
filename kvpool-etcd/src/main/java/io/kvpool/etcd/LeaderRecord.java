package io.kvpool.etcd;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.IOException;
import java.nio.charset.StandardCharsets;

/**
 * The value of the leader key ({@link EtcdTarget#leaderKey()}): which master leads, at which term,
 * and whether it serves yet. UTF-8 JSON, the same for the Java and the Python side:
 * <pre>
 *   {"id": "m1", "address": "10.0.0.1:50051", "http": "10.0.0.1:9400", "term": 1234, "ready": true}
 * </pre>
 * {@code address} is the master's port for clients and nodes, {@code http} its metrics and status
 * port ("" when it has none). {@code term} is the leader key's create revision in etcd: unique to one
 * leadership and rising from one leader to the next. {@code ready} is false while a new leader
 * rebuilds its metadata from the nodes (nodes connect to it then; clients wait until it is true).
 */
public record LeaderRecord(String id, String address, String http, long term, boolean ready) {

    private static final ObjectMapper JSON = new ObjectMapper();

    public LeaderRecord {
        if (id == null || id.isEmpty() || address == null || address.isEmpty()) {
            throw new IllegalArgumentException("a leader record needs an id and an address");
        }
        if (term < 0) {
            throw new IllegalArgumentException("a leader's term is never negative, got " + term);
        }
        http = http == null ? "" : http;
    }

    public LeaderRecord withReady(boolean r) {
        return new LeaderRecord(id, address, http, term, r);
    }

    public byte[] toJson() {
        ObjectNode n = JSON.createObjectNode();
        n.put("id", id).put("address", address).put("http", http).put("term", term).put("ready", ready);
        return n.toString().getBytes(StandardCharsets.UTF_8);
    }

    /**
     * Parses a leader key's value.
     *
     * @throws IllegalArgumentException naming what is missing or malformed
     */
    public static LeaderRecord parse(byte[] value) {
        JsonNode n;
        try {
            n = JSON.readTree(value);
        } catch (IOException e) {
            throw new IllegalArgumentException("the leader record is not JSON: " + e.getMessage(), e);
        }
        if (n == null || !n.isObject()) {
            throw new IllegalArgumentException("the leader record is not a JSON object");
        }
        JsonNode term = n.get("term");
        if (term == null || !term.canConvertToLong() || !term.isIntegralNumber()) {
            throw new IllegalArgumentException("the leader record's term is missing or not an integer: " + term);
        }
        JsonNode ready = n.get("ready");
        if (ready == null || !ready.isBoolean()) {
            throw new IllegalArgumentException("the leader record's ready flag is missing or not a boolean: " + ready);
        }
        return new LeaderRecord(text(n, "id"), text(n, "address"), n.path("http").asText(""), term.asLong(),
                ready.asBoolean());
    }

    private static String text(JsonNode n, String field) {
        JsonNode v = n.get(field);
        if (v == null || !v.isTextual() || v.asText().isEmpty()) {
            throw new IllegalArgumentException("the leader record's " + field + " is missing or not a string");
        }
        return v.asText();
    }
}

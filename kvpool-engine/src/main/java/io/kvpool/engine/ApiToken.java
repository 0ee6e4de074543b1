package io.kvpool.engine;

import io.kvpool.protocol.Secrets;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.Map;

/**
 * The bearer token an engine's HTTP API asks for ({@code Authorization: Bearer TOKEN}) on every POST
 * (completions and the control endpoints: pause, update weights, reset); {@code /health} and
 * {@code /metrics} stay open. From a file ({@code --api-token-file}, {@code KVPOOL_ENGINE_TOKEN_FILE})
 * or the environment ({@code KVPOOL_ENGINE_TOKEN}), at least {@link Secrets#MIN_LENGTH} characters,
 * never shown.
 */
public final class ApiToken {

    private final byte[] token;

    private ApiToken(String token) {
        String t = token.strip();
        if (t.length() < Secrets.MIN_LENGTH) {
            throw new IllegalArgumentException("the engine API token has " + t.length() + " characters; it needs at least "
                    + Secrets.MIN_LENGTH);
        }
        this.token = t.getBytes(StandardCharsets.UTF_8);
    }

    public static ApiToken of(String token) {
        return new ApiToken(token);
    }

    /** From {@code file} if given, else the environment; null when neither names one. */
    public static ApiToken load(Path file) {
        return load(file, System.getenv());
    }

    static ApiToken load(Path file, Map<String, String> env) {
        if (file != null) {
            return new ApiToken(Secrets.readFile(file, "engine API token"));
        }
        String f = env.get("KVPOOL_ENGINE_TOKEN_FILE");
        if (f != null && !f.isBlank()) {
            return new ApiToken(Secrets.readFile(Path.of(f), "engine API token"));
        }
        String v = env.get("KVPOOL_ENGINE_TOKEN");
        return v == null ? null : new ApiToken(v);
    }

    /** The value of an Authorization header carrying this token. */
    public String header() {
        return "Bearer " + new String(token, StandardCharsets.UTF_8);
    }

    /** Whether an Authorization header's value carries this token (compared in constant time). */
    boolean admits(String authorization) {
        if (authorization == null || !authorization.regionMatches(true, 0, "Bearer ", 0, 7)) {
            return false;
        }
        return MessageDigest.isEqual(token, authorization.substring(7).strip().getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public String toString() {
        return "ApiToken[hidden]";
    }
}

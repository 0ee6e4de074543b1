package io.kvpool.master;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpHandler;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.TierCounts;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * {@code POST /api/tiers?block_size=N} on the master's HTTP port: TIER_LOOKUP for routers that have no kvpool
 * client and no event stream. The body is a prompt's block keys in order, one a line (UTF-8); the answer is
 * {@link TierCounts#toJson}: how many leading keys the pool holds, how many of those in memory ({@code CPU}) and on
 * the SSD tier only ({@code STORAGE}), in blocks and in tokens of {@code block_size} (default 16). Never counts as a
 * read for eviction. On a secured master it needs {@code Authorization: Bearer <cluster secret>} (401 otherwise):
 * whether a prompt is cached says something about other users' prompts.
 *
 * <p>Bad input is a 4xx with a message naming it: another method (405), a body over {@link #MAX_BODY_BYTES} or
 * more than {@link #MAX_KEYS} keys (413), a bad block size or key (400).
 */
final class TierLookupPage implements HttpHandler {

    static final int MAX_KEYS = 65_536;
    static final int MAX_BODY_BYTES = 8 << 20;

    private final Probes probes;
    private final Secrets secrets;

    TierLookupPage(Probes probes, Secrets secrets) {
        this.probes = probes;
        this.secrets = secrets;
    }

    @Override
    public void handle(HttpExchange ex) throws IOException {
        try (ex) {
            if (!"POST".equals(ex.getRequestMethod())) {
                send(ex, 405, "{\"error\":\"POST the keys, one a line\"}");
                return;
            }
            if (secrets.present() && !bearer(ex)) {
                send(ex, 401, "{\"error\":\"this master is secured: send Authorization: Bearer <cluster secret>\"}");
                return;
            }
            int blockSize;
            List<byte[]> keys;
            try {
                blockSize = blockSize(ex.getRequestURI().getRawQuery());
                keys = keys(ex.getRequestBody());
            } catch (TooLarge e) {
                send(ex, 413, error(e.getMessage()));
                return;
            } catch (IllegalArgumentException e) {
                send(ex, 400, error(e.getMessage()));
                return;
            }
            send(ex, 200, TierCounts.of(probes.tiers(keys)).toJson(blockSize));
        }
    }

    private boolean bearer(HttpExchange ex) {
        String h = ex.getRequestHeaders().getFirst("Authorization");
        return h != null && h.regionMatches(true, 0, "Bearer ", 0, 7) && secrets.isClusterSecret(h.substring(7));
    }

    private static int blockSize(String query) {
        if (query == null) {
            return 16;
        }
        for (String kv : query.split("&")) {
            if (kv.startsWith("block_size=")) {
                String v = kv.substring("block_size=".length());
                try {
                    int n = Integer.parseInt(v);
                    if (n >= 1 && n <= 1 << 20) {
                        return n;
                    }
                } catch (NumberFormatException ignored) {
                    // the message below
                }
                throw new IllegalArgumentException("block_size must be a whole number from 1 to 1048576, got '" + v + "'");
            }
        }
        return 16;
    }

    private static List<byte[]> keys(InputStream in) throws IOException {
        byte[] body = in.readNBytes(MAX_BODY_BYTES + 1);
        if (body.length > MAX_BODY_BYTES) {
            throw new TooLarge("the body is over " + MAX_BODY_BYTES + " bytes");
        }
        List<byte[]> keys = new ArrayList<>();
        for (String line : new String(body, StandardCharsets.UTF_8).split("\n")) {
            String k = line.endsWith("\r") ? line.substring(0, line.length() - 1) : line;
            if (k.isEmpty()) {
                continue;
            }
            if (keys.size() == MAX_KEYS) {
                throw new TooLarge("more than " + MAX_KEYS + " keys");
            }
            keys.add(Keys.encode(k)); // IllegalArgumentException naming the key when it is too long
        }
        return keys;
    }

    private static String error(String message) {
        return "{\"error\":\"" + message.replace("\\", "\\\\").replace("\"", "\\\"") + "\"}";
    }

    /** Answers {@code json} with status {@code code} (the master's JSON pages share it). */
    static void send(HttpExchange ex, int code, String json) throws IOException {
        byte[] b = (json + "\n").getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(code, b.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(b);
        }
    }

    private static final class TooLarge extends IllegalArgumentException {
        TooLarge(String message) {
            super(message);
        }
    }
}

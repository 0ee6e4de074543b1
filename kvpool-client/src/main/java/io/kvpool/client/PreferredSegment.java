package io.kvpool.client;

import java.util.List;
import java.util.UUID;
import java.util.function.Supplier;

/**
 * Which segment a put should try first. The order, most explicit first: the call's own choice, the
 * client's configuration, the environment variable a launcher sets ({@value ClientConfig#PREFERRED_SEGMENT_ENV}),
 * then a segment on this host. With several segments on this host, each client sticks to one of
 * them (chosen by its id), so clients spread across them. Null means "let the master decide".
 */
final class PreferredSegment {

    private PreferredSegment() {
    }

    static String choose(String perCall, String configured, String fromEnv, boolean autoDetect,
                         Supplier<List<String>> localSegments, UUID clientId) {
        if (perCall != null && !perCall.isEmpty()) {
            return perCall;
        }
        if (configured != null && !configured.isEmpty()) {
            return configured;
        }
        if (fromEnv != null && !fromEnv.isEmpty()) {
            return fromEnv;
        }
        if (!autoDetect) {
            return null;
        }
        List<String> local = localSegments.get();
        if (local.isEmpty()) {
            return null;
        }
        return local.get(Math.floorMod(clientId.hashCode(), local.size()));
    }
}

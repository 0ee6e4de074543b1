package io.kvpool.cli;

import java.util.Set;

/**
 * Sets up slf4j-simple before the first logger is created: timestamps, level in brackets, to
 * stderr. Servers log at info; one-shot client commands and the demo at warn, so their own output
 * stays readable. {@code KVPOOL_LOG_LEVEL} overrides (trace, debug, info, warn, error).
 */
final class Logging {

    private static final Set<String> SERVERS = Set.of("serve", "master", "node");

    private Logging() {
    }

    static void configure(String[] args) {
        String command = null;
        for (String a : args) {
            if (!a.startsWith("-")) {
                command = a;
                break;
            }
        }
        String level = System.getenv("KVPOOL_LOG_LEVEL");
        if (level == null || level.isBlank()) {
            level = command != null && SERVERS.contains(command) ? "info" : "warn";
        }
        setIfAbsent("org.slf4j.simpleLogger.defaultLogLevel", level);
        setIfAbsent("org.slf4j.simpleLogger.showDateTime", "true");
        setIfAbsent("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX");
        setIfAbsent("org.slf4j.simpleLogger.showThreadName", "false");
        setIfAbsent("org.slf4j.simpleLogger.showShortLogName", "true");
        setIfAbsent("org.slf4j.simpleLogger.levelInBrackets", "true");
    }

    private static void setIfAbsent(String key, String value) {
        if (System.getProperty(key) == null) {
            System.setProperty(key, value);
        }
    }
}

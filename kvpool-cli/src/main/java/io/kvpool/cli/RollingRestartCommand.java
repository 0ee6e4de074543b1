package io.kvpool.cli;

import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.Callable;

/**
 * {@code kvpool rolling-restart}: asks the {@code kvpool launch} whose log directory is given to
 * restart every master and node of its pool one at a time, keeping the cache ({@link RollingRestart}),
 * waits for it and prints what each step took. Exit 0 when every step succeeded, 1 when one failed
 * (the reason is printed; the pool keeps running), 2 when no launcher runs there.
 */
@Command(name = "rolling-restart", mixinStandardHelpOptions = true,
        description = "Restart every master and node of a running 'kvpool launch' pool one at a time, keeping the cache.")
final class RollingRestartCommand implements Callable<Integer> {

    @Option(names = "--log-dir", paramLabel = "DIR", description = "The launcher's --log-dir (default: ${DEFAULT-VALUE}).")
    Path logDir = Path.of("kvpool-logs");

    @Option(names = "--timeout", paramLabel = "DURATION", description = "How long to wait for the whole restart (default: 30m).")
    Duration timeout = Duration.ofMinutes(30);

    @Override
    public Integer call() throws Exception {
        if (timeout.isNegative() || timeout.isZero()) {
            System.err.println("kvpool rolling-restart: --timeout must be positive, got " + timeout);
            return 2;
        }
        Path pidFile = logDir.resolve(LaunchCommand.PID_FILE);
        long pid;
        try {
            pid = Long.parseLong(Files.readString(pidFile, StandardCharsets.UTF_8).strip());
        } catch (java.io.IOException | NumberFormatException e) {
            System.err.println("kvpool rolling-restart: no running 'kvpool launch' with --log-dir " + logDir
                    + " (" + pidFile + " is missing or unreadable: " + e.getMessage() + ")");
            return 2;
        }
        if (ProcessHandle.of(pid).map(h -> !h.isAlive()).orElse(true)) {
            System.err.println("kvpool rolling-restart: the launcher of " + logDir + " (pid " + pid + ") is not running");
            return 2;
        }
        Path result = logDir.resolve(RollingRestart.RESULT);
        Files.deleteIfExists(result);
        String id = UUID.randomUUID().toString();
        Path tmp = logDir.resolve(RollingRestart.REQUEST + ".tmp");
        Files.writeString(tmp, id + "\n");
        Files.move(tmp, logDir.resolve(RollingRestart.REQUEST), java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        System.out.println("asked the launcher (pid " + pid + ") for a rolling restart; its log says how it goes");
        long deadline = System.nanoTime() + timeout.toNanos();
        while (System.nanoTime() < deadline) {
            if (Files.exists(result)) {
                List<String> lines = Files.readAllLines(result, StandardCharsets.UTF_8);
                if (lines.size() >= 2 && lines.get(1).equals("request " + id)) {
                    for (String l : lines.subList(2, lines.size())) {
                        System.out.println(l);
                    }
                    System.out.println(lines.getFirst());
                    return lines.getFirst().equals("ok") ? 0 : 1;
                }
            }
            if (ProcessHandle.of(pid).map(h -> !h.isAlive()).orElse(true)) {
                System.err.println("kvpool rolling-restart: the launcher (pid " + pid + ") exited before finishing");
                return 1;
            }
            Thread.sleep(200);
        }
        System.err.println("kvpool rolling-restart: no result within " + timeout + "; the launcher may still be at it");
        return 1;
    }
}

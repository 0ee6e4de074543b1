package io.kvpool.cli;

import io.kvpool.cli.LaunchCommand.Host;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The machines of a {@code kvpool launch}: {@code --local N} (N nodes on this machine) or a hosts file, one
 * {@code ADDRESS [local|netns:NAME|ssh[:USER@HOST]]} a line ({@code #} starts a comment). The first host is the
 * head (the master, or the first of several); on one address, masters take consecutive ports.
 */
final class LaunchHosts {

    private LaunchHosts() {
    }

    /** {@code n} nodes on this machine's loopback. */
    static List<Host> local(int n) {
        if (n < 1 || n > 64) {
            throw new IllegalArgumentException("--local: 1 to 64 nodes, got " + n);
        }
        List<Host> hosts = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            hosts.add(new Host("127.0.0.1", "local"));
        }
        return hosts;
    }

    /** The hosts of {@code file}; an error naming the file and line of anything it cannot read. */
    static List<Host> read(Path file) throws IOException {
        List<Host> hosts = new ArrayList<>();
        int n = 0;
        for (String raw : Files.readAllLines(file)) {
            n++;
            String l = raw.replaceFirst("#.*", "").trim();
            if (l.isEmpty()) {
                continue;
            }
            String[] f = l.split("\\s+");
            String via = f.length > 1 ? f[1] : "local";
            if (f.length > 2 || !(via.equals("local") || via.startsWith("netns:") || via.equals("ssh") || via.startsWith("ssh:"))) {
                throw new IllegalArgumentException(file + ":" + n + ": expected ADDRESS [local|netns:NAME|ssh[:USER@HOST]],"
                        + " got '" + raw + "'");
            }
            hosts.add(new Host(f[0], via));
        }
        if (hosts.isEmpty()) {
            throw new IllegalArgumentException(file + ": no hosts");
        }
        return hosts;
    }

    /** Whether an earlier one of the first {@code i} hosts has the same address (masters share it: distinct ports). */
    static boolean sameHostBefore(List<Host> hosts, int i) {
        for (int j = 0; j < i; j++) {
            if (hosts.get(j).address().equals(hosts.get(i).address())) {
                return true;
            }
        }
        return false;
    }

    /** Whether a later host has the same address as host {@code i}. */
    static boolean hostRepeats(List<Host> hosts, int i) {
        for (int j = i + 1; j < hosts.size(); j++) {
            if (hosts.get(j).address().equals(hosts.get(i).address())) {
                return true;
            }
        }
        return false;
    }
}

package io.kvpool.config;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Ports for servers started later, or started again on the same port after a restart (a local
 * cluster, a soak, a test harness).
 *
 * <p>Why not {@code new ServerSocket(0)}: that port comes from the kernel's ephemeral range, which
 * every outgoing connection on the machine also draws its local port from, so between choosing the
 * port and the server binding it (seconds later for a standby master, minutes for a restart) a
 * client's connection can take it, and the server fails with "Address already in use". A port is
 * picked here at random below the ephemeral range ({@code /proc/sys/net/ipv4/ip_local_port_range},
 * 32768 when unreadable), where the kernel never hands out ports on its own, and checked bindable on
 * every address.
 *
 * <p>Why not a fresh random pick each time: a test asks for several ports before it starts anything, and
 * a random pick is bindable again until its server binds it, so two picks of one process could be the
 * same port (1 in 12,768 per pair): a master whose HTTP page took its own master port could never serve.
 * So a process walks the range from a random start and never hands out a port twice (the range holds
 * 12,768 ports by default; a process that went round it starts over). Separate processes start at
 * different places, so they meet only after thousands of ports.
 */
public final class Ports {

    /** Lowest port handed out: clear of the well-known and most registered services' ports. */
    static final int LOWEST = 20_000;
    private static final int ATTEMPTS = 200;
    /** How many ports this process has looked at; the next one looked at is {@code first + looked}. */
    private static final AtomicLong LOOKED = new AtomicLong();
    private static final int FIRST = ThreadLocalRandom.current().nextInt(1 << 30);

    private Ports() {
    }

    /** A port bindable now, below the ephemeral range, that this process has not handed out before. */
    public static int reservable() throws IOException {
        int below = ephemeralStart();
        int lowest = Math.min(LOWEST, below - 1_000);
        for (int i = 0; i < ATTEMPTS; i++) {
            int port = lowest + (int) ((FIRST + LOOKED.getAndIncrement()) % (below - lowest));
            if (bindable(port)) {
                return port;
            }
        }
        throw new IOException("no bindable port in [" + lowest + ", " + below + ") after " + ATTEMPTS + " tries");
    }

    /** The first port of the kernel's ephemeral range. */
    static int ephemeralStart() {
        try {
            String[] range = Files.readString(Path.of("/proc/sys/net/ipv4/ip_local_port_range")).trim().split("\\s+");
            int start = Integer.parseInt(range[0]);
            return start > 2_000 ? start : 32_768;
        } catch (IOException | RuntimeException e) {
            return 32_768;
        }
    }

    static boolean bindable(int port) {
        try (ServerSocket any = new ServerSocket(); ServerSocket loop = new ServerSocket()) {
            any.bind(new InetSocketAddress(port));
            any.close();
            loop.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
            return true;
        } catch (IOException e) {
            return false;
        }
    }
}

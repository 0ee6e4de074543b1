package io.kvpool.config;

import java.net.Inet4Address;
import java.net.InetAddress;
import java.net.NetworkInterface;
import java.net.SocketException;
import java.net.UnknownHostException;
import java.util.Collections;
import java.util.HashSet;
import java.util.Set;

/** This machine's addresses: for nodes choosing what to advertise, and clients finding a same-host segment. */
public final class LocalHost {

    private LocalHost() {
    }

    /** Every address of every interface that is up, loopback included, as literal strings. */
    public static Set<String> addresses() {
        Set<String> out = new HashSet<>();
        try {
            for (NetworkInterface nif : Collections.list(NetworkInterface.getNetworkInterfaces())) {
                if (!nif.isUp()) {
                    continue;
                }
                for (InetAddress a : Collections.list(nif.getInetAddresses())) {
                    String s = a.getHostAddress();
                    int pct = s.indexOf('%');
                    out.add(pct >= 0 ? s.substring(0, pct) : s);
                }
            }
        } catch (SocketException e) {
            // fall through with what we have; loopback is always local
        }
        out.add("127.0.0.1");
        out.add("localhost");
        try {
            out.add(InetAddress.getLocalHost().getHostName());
        } catch (UnknownHostException e) {
            // no resolvable host name; addresses suffice
        }
        return out;
    }

    /** True if {@code host} (a literal address or a name) is this machine. */
    public static boolean isLocal(String host, Set<String> localAddresses) {
        if (localAddresses.contains(host)) {
            return true;
        }
        try {
            for (InetAddress a : InetAddress.getAllByName(host)) {
                if (a.isLoopbackAddress() || localAddresses.contains(a.getHostAddress())) {
                    return true;
                }
            }
        } catch (UnknownHostException e) {
            return false;
        }
        return false;
    }

    /**
     * The address to advertise when none was configured: the first non-loopback IPv4 address of an
     * interface that is up, or 127.0.0.1 when there is none.
     */
    public static String defaultAdvertiseAddress() {
        try {
            for (NetworkInterface nif : Collections.list(NetworkInterface.getNetworkInterfaces())) {
                if (!nif.isUp() || nif.isLoopback() || nif.isVirtual()) {
                    continue;
                }
                for (InetAddress a : Collections.list(nif.getInetAddresses())) {
                    if (a instanceof Inet4Address && !a.isLoopbackAddress() && !a.isLinkLocalAddress()) {
                        return a.getHostAddress();
                    }
                }
            }
        } catch (SocketException e) {
            // fall back to loopback
        }
        return "127.0.0.1";
    }
}

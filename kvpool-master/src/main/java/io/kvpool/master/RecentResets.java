package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.nio.charset.StandardCharsets;
import java.time.InstantSource;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * The last few resets this master carried out (removeAll, removal by prefix), newest first, for the
 * status page: an operator watching an RL run sees each weight update's reset land, with the objects
 * it removed. Bounded; synchronized (resets are rare).
 */
final class RecentResets {

    /** One reset: when it finished, what it was, objects removed, the epoch after it. */
    record Reset(long epochMillis, String what, long removed, long epoch) {
    }

    static final int CAPACITY = 20;

    private final InstantSource clock;
    @GuardedBy("this")
    private final ArrayDeque<Reset> resets = new ArrayDeque<>();

    RecentResets(InstantSource clock) {
        this.clock = clock;
    }

    synchronized void removeAll(boolean force, long removed, long epoch) {
        add(new Reset(clock.millis(), force ? "removeAll(force): new epoch" : "removeAll", removed, epoch));
    }

    synchronized void removeByPrefix(byte[] prefix, long removed, long epoch) {
        add(new Reset(clock.millis(), prefix.length == 0 ? "removeAll" : "remove by prefix " + printable(prefix),
                removed, epoch));
    }

    @GuardedBy("this")
    private void add(Reset r) {
        if (resets.size() == CAPACITY) {
            resets.removeLast();
        }
        resets.addFirst(r);
    }

    synchronized List<Reset> newestFirst() {
        return new ArrayList<>(resets);
    }

    /** A prefix as text when it is printable ASCII (keys usually are), else as hex; at most 64 characters. */
    static String printable(byte[] prefix) {
        boolean text = true;
        for (byte b : prefix) {
            if (b < 0x20 || b > 0x7e) {
                text = false;
                break;
            }
        }
        String s;
        if (text) {
            s = "'" + new String(prefix, StandardCharsets.US_ASCII) + "'";
        } else {
            StringBuilder sb = new StringBuilder("0x");
            for (byte b : prefix) {
                sb.append(String.format("%02x", b & 0xff));
            }
            s = sb.toString();
        }
        return s.length() > 64 ? s.substring(0, 61) + "..." : s;
    }
}

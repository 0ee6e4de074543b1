package io.kvpool.protocol;

import java.util.concurrent.atomic.AtomicLong;

/** What one {@link FrameServer}'s limits and checks refused, counted for its metrics. */
final class ServerCounters {
    /** Connections refused at a connection limit. */
    final AtomicLong refusedConnections = new AtomicLong();
    /** Connections closed because a frame, or a new connection's first frame, did not arrive in time. */
    final AtomicLong timedOutFrames = new AtomicLong();
    /** Connections closed for a failed proof or a request above what they proved. */
    final AtomicLong refusedAuth = new AtomicLong();
    /** Connections refused for TLS, either way round. */
    final AtomicLong tlsFailures = new AtomicLong();
    /** Frames refused for the body budget: it stayed in use, or the body is larger than all of it. */
    final AtomicLong refusedBodies = new AtomicLong();
    /** Waits for a connection's next frame that polled its socket first ({@link BusyPoll}). */
    final BusyPoll.Counters busyPoll = new BusyPoll.Counters();
}

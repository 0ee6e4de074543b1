package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.msg.MasterMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.UUID;

/**
 * The client's background round, every ping interval (2 s by default), on one virtual thread: report
 * the reads served from remembered locations (so the master's LRU sees them), release write leases
 * gone idle, PING the master (so it counts this client as active), and every fifth round refresh the
 * segment table. A master that cannot be reached is logged once when it goes and once when it comes
 * back; the round never throws.
 */
final class KeepAlive implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(KeepAlive.class);

    private final ClientConfig config;
    private final UUID clientId;
    private final MasterChannel master;
    private final SegmentAccess segments;
    private final ObjectReads reads;
    /** Null when the client puts without write leases. */
    private final WriteLeasePool writeLeases;
    private final Thread thread;
    private volatile boolean closed;
    private boolean failing;

    KeepAlive(ClientConfig config, UUID clientId, MasterChannel master, SegmentAccess segments, ObjectReads reads,
              WriteLeasePool writeLeases) {
        this.config = config;
        this.clientId = clientId;
        this.master = master;
        this.segments = segments;
        this.reads = reads;
        this.writeLeases = writeLeases;
        this.thread = Thread.ofVirtual().name("kvpool-client-ping").unstarted(this::loop);
    }

    void start() {
        thread.start();
    }

    private void loop() {
        for (int round = 1; !closed; round++) {
            try {
                Thread.sleep(config.pingInterval());
            } catch (InterruptedException e) {
                return;
            }
            if (closed) {
                return;
            }
            try {
                reads.reportCachedReads();
                if (writeLeases != null) {
                    writeLeases.sweep();
                }
                BodyWriter w = new BodyWriter(16);
                new MasterMessages.Ping(clientId).write(w);
                master.call(Opcode.PING, w, r -> r.i64("epoch"));
                if (round % 5 == 0) {
                    segments.refresh();
                }
                if (failing) {
                    log.info("master {} reachable again", config.master());
                    failing = false;
                }
            } catch (RuntimeException e) {
                if (!failing && !closed) {
                    log.warn("cannot reach master {}: {}", config.master(), e.getMessage());
                    failing = true;
                }
            }
        }
    }

    @Override
    public void close() {
        closed = true;
        thread.interrupt();
    }
}

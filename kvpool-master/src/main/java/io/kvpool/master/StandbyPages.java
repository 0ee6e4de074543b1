package io.kvpool.master;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.StandbysInSync;
import io.kvpool.web.History;
import io.kvpool.web.Series;
import io.kvpool.web.StatusPages;
import io.kvpool.web.StatusView;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.io.IOException;
import java.io.OutputStream;
import java.util.Locale;
import java.util.function.Supplier;

/**
 * What an elected master's HTTP port shows while it stands by: a status page naming the leader (read
 * from etcd when asked), {@code /metrics} with {@code master_leader 0} and the JVM's series, and
 * {@code /health} answering {@code {"status":"standby",...}}. So a standby is visibly alive to an
 * operator and to Prometheus ({@code up} stays 1), and only the leader reports the pool. A hot standby
 * also shows its copy of the leader's metadata: objects, feed position, the age of the last batch, and
 * whether the leader names it in sync (may take over serving from it). Mounted
 * on the elected master's HTTP server between leaderships; {@link #unmount()} before a leadership's
 * {@link MasterServer} mounts its own pages.
 */
final class StandbyPages {

    private static final ObjectMapper JSON = new ObjectMapper();

    private final String id;
    private final EtcdTarget target;
    private final EtcdGateway etcd;
    private final StatusPages pages;
    /** The hot standby's follower now, or null (not a hot standby, or between followers). */
    private final Supplier<Follower> follower;

    private StandbyPages(HttpServer http, String id, EtcdTarget target, EtcdGateway etcd, Supplier<Follower> follower) {
        this.id = id;
        this.target = target;
        this.etcd = etcd;
        this.follower = follower;
        PrometheusRegistry registry = new PrometheusRegistry();
        Series.gauge(registry, "master_leader", "1 while this master serves as the elected leader (or is the only"
                + " master), else 0", () -> 0);
        Series.gauge(registry, "master_standby_copy_objects", "Objects in this hot standby's copy of the leader's"
                + " metadata (0 when not a hot standby)", () -> {
            Follower f = follower.get();
            return f == null ? 0 : f.copy().objects();
        });
        Series.gauge(registry, "master_standby_copy_position", "The leader's change feed position this hot standby's"
                + " copy has applied", () -> {
            Follower f = follower.get();
            return f == null ? 0 : f.position();
        });
        this.pages = StatusPages.mount(http, "/", registry, this::view, History.none());
        pages.context("/health", this::health);
    }

    /** {@code follower}: the hot standby's follower now (null: none); {@code () -> null} for a cold standby. */
    static StandbyPages mount(HttpServer http, String id, EtcdTarget target, EtcdGateway etcd,
                              Supplier<Follower> follower) {
        return new StandbyPages(http, id, target, etcd, follower);
    }

    /** Whether the leader names this master in sync now; null when etcd does not answer. */
    private Boolean inSync() {
        try {
            StandbysInSync named = StandbysInSync.read(etcd, target);
            return named != null && named.ids().contains(id);
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    void unmount() {
        pages.unmount();
    }

    /** The leader as etcd names it now, or null when there is none or etcd does not answer. */
    private LeaderRecord leader() {
        try {
            EtcdGateway.KeyValue kv = etcd.range(target.leaderKey()).first();
            return kv == null ? null : LeaderRecord.parse(kv.value());
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    private StatusView view() {
        LeaderRecord l = leader();
        StatusView v = new StatusView("master", "kvpool master " + id + " (standby)", System.currentTimeMillis())
                .subtitle("standing by for election in " + target);
        v.card("leadership", "Leadership", "standby", "takes over if the leader's etcd lease runs out");
        v.card("leader", "Leader", l == null ? "none (or etcd unreachable)" : l.id() + " at " + l.address(),
                l == null ? null : "term " + l.term() + (l.ready() ? ", serving" : ", rebuilding from the nodes"));
        Follower f = follower.get();
        if (f == null) {
            v.card("copy", "Copy of the metadata", "none", "not a hot standby: as leader it rebuilds from the nodes");
        } else {
            Boolean sync = inSync();
            v.card("copy", "Copy of the metadata", String.format(Locale.ROOT, "%,d objects", f.copy().objects()),
                    String.format(Locale.ROOT, "feed position %,d, last batch %d ms ago", f.position(),
                            (System.nanoTime() - f.lastBatchNanos()) / 1_000_000));
            v.card("sync", "In sync", sync == null ? "unknown (etcd unreachable)" : sync ? "yes" : "no",
                    "in sync: the leader waits for this copy before it acknowledges a write, and this master may"
                            + " take over serving from it");
        }
        if (l != null && !l.http().isEmpty()) {
            v.link("the leader's page", "http://" + l.http() + "/");
        }
        v.link("metrics", "metrics");
        return v;
    }

    private void health(HttpExchange ex) throws IOException {
        try (ex) {
            LeaderRecord l = leader();
            var node = JSON.createObjectNode().put("status", "standby").put("id", id)
                    .put("leader", l == null ? "" : l.id()).put("leader_address", l == null ? "" : l.address());
            Follower f = follower.get();
            node.put("hot", f != null);
            if (f != null) {
                Boolean sync = inSync();
                node.put("copy_objects", f.copy().objects()).put("copy_position", f.position());
                if (sync != null) {
                    node.put("in_sync", sync);
                }
            }
            byte[] b = JSON.writeValueAsBytes(node);
            ex.getResponseHeaders().set("Content-Type", "application/json");
            ex.sendResponseHeaders(200, b.length);
            try (OutputStream os = ex.getResponseBody()) {
                os.write(b);
            }
        }
    }
}

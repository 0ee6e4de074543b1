package io.kvpool.master;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.web.History;
import io.kvpool.web.Series;
import io.kvpool.web.StatusPages;
import io.kvpool.web.StatusView;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.io.IOException;
import java.io.OutputStream;

/**
 * What an elected master's HTTP port shows while it stands by: a status page naming the leader (read
 * from etcd when asked), {@code /metrics} with {@code master_leader 0} and the JVM's series, and
 * {@code /health} answering {@code {"status":"standby",...}}. So a standby is visibly alive to an
 * operator and to Prometheus ({@code up} stays 1), and only the leader reports the pool. Mounted
 * on the elected master's HTTP server between leaderships; {@link #unmount()} before a leadership's
 * {@link MasterServer} mounts its own pages.
 */
final class StandbyPages {

    private static final ObjectMapper JSON = new ObjectMapper();

    private final String id;
    private final EtcdTarget target;
    private final EtcdGateway etcd;
    private final StatusPages pages;

    private StandbyPages(HttpServer http, String id, EtcdTarget target, EtcdGateway etcd) {
        this.id = id;
        this.target = target;
        this.etcd = etcd;
        PrometheusRegistry registry = new PrometheusRegistry();
        Series.gauge(registry, "master_leader", "1 while this master serves as the elected leader (or is the only"
                + " master), else 0", () -> 0);
        this.pages = StatusPages.mount(http, "/", registry, this::view, History.none());
        pages.context("/health", this::health);
    }

    static StandbyPages mount(HttpServer http, String id, EtcdTarget target, EtcdGateway etcd) {
        return new StandbyPages(http, id, target, etcd);
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
        if (l != null && !l.http().isEmpty()) {
            v.link("the leader's page", "http://" + l.http() + "/");
        }
        v.link("metrics", "metrics");
        return v;
    }

    private void health(HttpExchange ex) throws IOException {
        try (ex) {
            LeaderRecord l = leader();
            byte[] b = JSON.writeValueAsBytes(JSON.createObjectNode().put("status", "standby").put("id", id)
                    .put("leader", l == null ? "" : l.id()).put("leader_address", l == null ? "" : l.address()));
            ex.getResponseHeaders().set("Content-Type", "application/json");
            ex.sendResponseHeaders(200, b.length);
            try (OutputStream os = ex.getResponseBody()) {
                os.write(b);
            }
        }
    }
}

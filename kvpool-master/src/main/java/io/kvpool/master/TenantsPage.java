package io.kvpool.master;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpHandler;
import io.kvpool.protocol.Secrets;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * {@code /api/tenants} on the master's HTTP port (docs/operations.md, "Tenants"). {@code GET}: every tenant, its
 * quotas and what it holds now ({@code memory_bytes}, {@code disk_bytes}, {@code refused_puts},
 * {@code own_evictions}); on a secured master with {@code Authorization: Bearer <cluster secret>}. {@code PUT}: a
 * new list ({@link Tenant#fromJson}), which replaces the old at once: what each tenant holds is counted again, and
 * an elected master keeps the list in etcd first, so that the next leader takes it; on a secured master with
 * {@code Authorization: Bearer <admin secret>}. The answer to a PUT is the GET's.
 *
 * <p>Bad input is a 4xx naming it: another method (405), a body over 1 MiB (413), a bad list (400), a missing or
 * wrong secret (401); a list etcd did not take is a 503 and changes nothing.
 */
final class TenantsPage implements HttpHandler {

    /** Keeps a new tenant list where the next leader finds it, before it is applied (etcd, for elected masters). */
    interface Store {
        void save(List<Tenant> tenants) throws IOException;

        Store NONE = t -> { };
    }

    static final int MAX_BODY_BYTES = 1 << 20;
    private static final ObjectMapper JSON = new ObjectMapper();

    private final MasterService service;
    private final Secrets secrets;
    private volatile Store store = Store.NONE;

    TenantsPage(MasterService service, Secrets secrets) {
        this.service = service;
        this.secrets = secrets;
    }

    void keepIn(Store s) {
        store = s;
    }

    @Override
    public void handle(HttpExchange ex) throws IOException {
        try (ex) {
            String method = ex.getRequestMethod();
            if (!"GET".equals(method) && !"PUT".equals(method)) {
                TierLookupPage.send(ex, 405, error("GET the tenants, or PUT a new list"));
                return;
            }
            boolean put = "PUT".equals(method);
            if (secrets.present() && !bearer(ex, put)) {
                TierLookupPage.send(ex, 401, error("this master is secured: send Authorization: Bearer <" + (put ? "admin" : "cluster")
                        + " secret>"));
                return;
            }
            if (put) {
                byte[] body = ex.getRequestBody().readNBytes(MAX_BODY_BYTES + 1);
                if (body.length > MAX_BODY_BYTES) {
                    TierLookupPage.send(ex, 413, error("the body is over " + MAX_BODY_BYTES + " bytes"));
                    return;
                }
                List<Tenant> tenants;
                try {
                    tenants = Tenant.fromJson(new String(body, StandardCharsets.UTF_8));
                } catch (IllegalArgumentException e) {
                    TierLookupPage.send(ex, 400, error(e.getMessage()));
                    return;
                }
                try {
                    store.save(tenants);
                } catch (IOException e) {
                    TierLookupPage.send(ex, 503, error("the tenants were not kept for the next leader, nothing changed: " + e.getMessage()));
                    return;
                }
                service.configureTenants(tenants);
            }
            TierLookupPage.send(ex, 200, view(service.tenants()));
        }
    }

    /** What GET answers: every tenant with its quotas and use. */
    static String view(Tenants t) {
        ObjectNode root = JSON.createObjectNode();
        ArrayNode list = root.putArray("tenants");
        List<Tenant> ts = t.tenants();
        for (int i = 0; i < ts.size(); i++) {
            ObjectNode o = list.addObject();
            Tenant x = ts.get(i);
            o.put("name", x.name());
            x.prefixes().forEach(o.putArray("prefixes")::add);
            o.put("memory_quota_bytes", x.memoryBytes());
            o.put("disk_quota_bytes", x.diskBytes());
            o.put("over_quota", x.overQuota().spelling());
            o.put("memory_bytes", t.memoryUsed(i + 1));
            o.put("disk_bytes", t.diskUsed(i + 1));
            o.put("refused_puts", t.refusedPuts(i + 1));
            o.put("own_evictions", t.ownEvictions(i + 1));
        }
        root.put("other_memory_bytes", t.active() ? t.memoryUsed(0) : -1);
        return root.toString();
    }

    private boolean bearer(HttpExchange ex, boolean admin) {
        String h = ex.getRequestHeaders().getFirst("Authorization");
        if (h == null || !h.regionMatches(true, 0, "Bearer ", 0, 7)) {
            return false;
        }
        String token = h.substring(7);
        return admin ? secrets.isAdminSecret(token) : secrets.isClusterSecret(token) || secrets.isAdminSecret(token);
    }

    private static String error(String message) {
        return JSON.createObjectNode().put("error", message).toString();
    }
}

package io.kvpool.etcd;

import io.kvpool.config.HostPort;

import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

/**
 * Where the masters of one kvpool cluster are elected: etcd endpoints and a cluster name, written
 * {@code etcd://host:port[,host:port...][/cluster]} wherever a master address is accepted (the
 * cluster defaults to {@value #DEFAULT_CLUSTER}).
 */
public record EtcdTarget(List<HostPort> endpoints, String cluster) {

    /** The URL scheme that marks a master given through etcd. */
    public static final String SCHEME = "etcd://";
    /** The cluster name when the URL gives none. */
    public static final String DEFAULT_CLUSTER = "default";
    private static final Pattern CLUSTER = Pattern.compile("[A-Za-z0-9._-]{1,64}");

    public EtcdTarget {
        if (endpoints == null || endpoints.isEmpty()) {
            throw new IllegalArgumentException("an etcd target needs at least one endpoint (host:port)");
        }
        endpoints = List.copyOf(endpoints);
        if (cluster == null || !CLUSTER.matcher(cluster).matches()) {
            throw new IllegalArgumentException("cluster name '" + cluster
                    + "' must be 1 to 64 letters, digits, '.', '_' or '-'");
        }
    }

    /** True when {@code address} names masters through etcd rather than one master's host:port. */
    public static boolean isEtcd(String address) {
        return address != null && address.trim().regionMatches(true, 0, SCHEME, 0, SCHEME.length());
    }

    /**
     * Parses {@code etcd://h1:2379,h2:2379/cluster}.
     *
     * @throws IllegalArgumentException naming what is wrong
     */
    public static EtcdTarget parse(String url) {
        if (!isEtcd(url)) {
            throw new IllegalArgumentException("'" + url + "' is not an etcd target; expected "
                    + SCHEME + "host:port[,host:port...][/cluster]");
        }
        String rest = url.trim().substring(SCHEME.length());
        String cluster = DEFAULT_CLUSTER;
        int slash = rest.indexOf('/');
        if (slash >= 0) {
            cluster = rest.substring(slash + 1);
            rest = rest.substring(0, slash);
            if (cluster.isEmpty()) {
                cluster = DEFAULT_CLUSTER;
            }
        }
        List<HostPort> endpoints = new ArrayList<>();
        for (String part : rest.split(",")) {
            if (part.isBlank()) {
                throw new IllegalArgumentException("'" + url + "' has an empty etcd endpoint");
            }
            try {
                endpoints.add(HostPort.parse(part));
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("etcd endpoint in '" + url + "': " + e.getMessage(), e);
            }
        }
        return new EtcdTarget(endpoints, cluster);
    }

    /** The key of the leader record ({@link LeaderRecord}). */
    public String leaderKey() {
        return "/kvpool/" + cluster + "/leader";
    }

    /** The prefix under which every running master lists itself, leader or standby. */
    public String mastersPrefix() {
        return "/kvpool/" + cluster + "/masters/";
    }

    /** The prefix under which the leader lists the nodes registered with it. */
    public String nodesPrefix() {
        return "/kvpool/" + cluster + "/nodes/";
    }

    /** The prefix under which the leader lists the segments it owes frees to (they come back empty under the next). */
    public String owedPrefix() {
        return "/kvpool/" + cluster + "/owed/";
    }

    /**
     * The key of the standbys in sync with the leader (their ids, one per line, under the leader's term): a
     * standby elected leader takes over its copy of the metadata only if it is named here for the term it followed.
     */
    public String standbysKey() {
        return "/kvpool/" + cluster + "/standbys";
    }

    /** The key of the tenant list set at run time (JSON): a new leader takes it instead of its flags'. */
    public String tenantsKey() {
        return "/kvpool/" + cluster + "/tenants";
    }

    @Override
    public String toString() {
        StringBuilder b = new StringBuilder(SCHEME);
        for (int i = 0; i < endpoints.size(); i++) {
            b.append(i == 0 ? "" : ",").append(endpoints.get(i));
        }
        return b.append('/').append(cluster).toString();
    }
}

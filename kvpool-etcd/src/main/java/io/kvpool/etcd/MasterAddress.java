package io.kvpool.etcd;

import io.kvpool.config.HostPort;

/**
 * How a node or a client finds the master: one fixed {@code host:port}, or the leader elected through
 * etcd ({@code etcd://h1:2379,h2:2379[/cluster]}). Written the same way wherever a master address is
 * accepted (flags, config files, {@code KvPoolClient.connect}).
 */
public sealed interface MasterAddress {

    /** One master at a fixed address (no election). */
    record Fixed(HostPort address) implements MasterAddress {
        @Override
        public String toString() {
            return address.toString();
        }
    }

    /** Whichever master leads the cluster in etcd. */
    record Elected(EtcdTarget target) implements MasterAddress {
        @Override
        public String toString() {
            return target.toString();
        }
    }

    /**
     * Parses {@code host:port} or {@code etcd://...}.
     *
     * @throws IllegalArgumentException naming what is wrong
     */
    static MasterAddress parse(String text) {
        if (EtcdTarget.isEtcd(text)) {
            return new Elected(EtcdTarget.parse(text));
        }
        return new Fixed(HostPort.parse(text));
    }

    static MasterAddress of(HostPort address) {
        return new Fixed(address);
    }
}

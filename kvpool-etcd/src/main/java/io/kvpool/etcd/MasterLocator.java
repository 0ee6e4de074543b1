package io.kvpool.etcd;

import io.kvpool.config.HostPort;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.TimeoutException;

/**
 * Where the master is now, for a node or a client: a fixed address as given, or the leader that etcd
 * names, followed by a {@link LeaderWatch}. Clients ask for a leader that is ready (it serves);
 * nodes take a leader that is still rebuilding, since it rebuilds from their registrations.
 */
public abstract sealed class MasterLocator implements AutoCloseable {

    /** A locator for {@code address}; for etcd it starts following the leader at once. */
    public static MasterLocator of(MasterAddress address, Duration etcdTimeout) {
        return switch (address) {
            case MasterAddress.Fixed f -> new Static(f.address());
            case MasterAddress.Elected e -> new Elected(new LeaderWatch(e.target(), etcdTimeout).start());
        };
    }

    /**
     * The master to talk to, waiting up to {@code timeout} for etcd to name one.
     *
     * @param ready true to wait for a leader that serves (clients), false to take one that rebuilds (nodes)
     * @throws IOException naming the etcd key and endpoints when no leader came in time
     */
    public abstract Leader locate(Duration timeout, boolean ready) throws IOException;

    /** The leader as last seen, without waiting; null when unknown (or no election). */
    public abstract LeaderRecord latest();

    /** A master to talk to, and its term when it was elected (0 otherwise). */
    public record Leader(HostPort address, long term) {
    }

    /** Whether this locator follows an election. */
    public abstract boolean elected();

    /** Runs {@code r} whenever the leader record changes (never, without an election). */
    public abstract void onChange(Runnable r);

    @Override
    public void close() {
    }

    private static final class Static extends MasterLocator {
        private final Leader leader;

        Static(HostPort address) {
            this.leader = new Leader(address, 0);
        }

        @Override
        public Leader locate(Duration timeout, boolean ready) {
            return leader;
        }

        @Override
        public LeaderRecord latest() {
            return null;
        }

        @Override
        public boolean elected() {
            return false;
        }

        @Override
        public void onChange(Runnable r) {
        }

        @Override
        public String toString() {
            return leader.address().toString();
        }
    }

    private static final class Elected extends MasterLocator {
        private final LeaderWatch watch;

        Elected(LeaderWatch watch) {
            this.watch = watch;
        }

        @Override
        public Leader locate(Duration timeout, boolean ready) throws IOException {
            LeaderRecord r;
            try {
                r = watch.await(l -> !ready || l.ready(), timeout);
            } catch (TimeoutException e) {
                throw new EtcdException(e.getMessage(), e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new EtcdException("interrupted while looking for the master in etcd", e);
            }
            try {
                return new Leader(HostPort.parse(r.address()), r.term());
            } catch (IllegalArgumentException e) {
                throw new EtcdException("the leader record at " + watch.target().leaderKey() + " names '"
                        + r.address() + "': " + e.getMessage(), e);
            }
        }

        @Override
        public LeaderRecord latest() {
            return watch.latest();
        }

        @Override
        public boolean elected() {
            return true;
        }

        @Override
        public void onChange(Runnable r) {
            watch.onChange(rec -> r.run());
        }

        @Override
        public void close() {
            watch.close();
        }

        @Override
        public String toString() {
            return watch.target().toString();
        }
    }
}

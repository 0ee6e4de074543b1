package io.kvpool.etcd;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;

/**
 * The value of {@link EtcdTarget#standbysKey()}: the term of the leader that wrote it, then the ids of the standbys
 * that every write it acknowledges waits for, one per line. A standby elected leader serves from its copy of the
 * leader before it only if that leader named it here for the term it followed.
 */
public record StandbysInSync(long term, Set<String> ids) {

    public StandbysInSync {
        ids = Set.copyOf(new TreeSet<>(ids));
    }

    /** Whether the leader of {@code t} named standby {@code id}. */
    public boolean names(long t, String id) {
        return term == t && ids.contains(id);
    }

    public byte[] toBytes() {
        StringBuilder v = new StringBuilder(Long.toString(term));
        new TreeSet<>(ids).forEach(id -> v.append('\n').append(id));
        return v.toString().getBytes(StandardCharsets.UTF_8);
    }

    /**
     * What the key holds now, or null when it is absent.
     *
     * @throws IllegalArgumentException when the value does not start with a term
     */
    public static StandbysInSync read(EtcdGateway etcd, EtcdTarget target) throws EtcdException {
        EtcdGateway.Range r = etcd.range(target.standbysKey());
        if (r.kvs().isEmpty()) {
            return null;
        }
        List<String> lines = Arrays.asList(new String(r.first().value(), StandardCharsets.UTF_8).split("\n"));
        try {
            return new StandbysInSync(Long.parseLong(lines.getFirst()), Set.copyOf(lines.subList(1, lines.size())));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(target.standbysKey() + " does not start with a term: " + lines.getFirst());
        }
    }
}

package io.kvpool.client;

/**
 * The outcome of a put in full: its status, and for a stored object how many copies were written
 * against how many were asked for, and whether its pin was granted.
 *
 * @param status       as {@link KvPoolClient#put} reports it
 * @param copies       copies written and visible (0 unless OK). Fewer than {@code copiesWanted} when the
 *                     pool had fewer segments with room, or a node failed during the put; the master
 *                     makes the missing copies later when there is room (its
 *                     {@code master_objects_under_replicated} gauge counts such objects meanwhile)
 * @param copiesWanted copies asked for (the option, or the client's or master's default)
 * @param pinned       the master granted the pin asked for (false when none was asked for, or the pool's
 *                     pins were at their cap: then the object is stored unpinned)
 */
public record PutResult(PutStatus status, int copies, int copiesWanted, boolean pinned) {

    /** True for a stored object with fewer copies than asked for. */
    public boolean underReplicated() {
        return status == PutStatus.OK && copies < copiesWanted;
    }

    static PutResult of(PutStatus status, int copiesWanted) {
        return new PutResult(status, 0, copiesWanted, false);
    }
}

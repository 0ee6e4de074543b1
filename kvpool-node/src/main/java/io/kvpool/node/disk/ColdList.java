package io.kvpool.node.disk;

/**
 * An intrusive doubly linked list of {@link Slot}s, coldest at the head: the links live in the slots,
 * so adding, removing and moving an object to the tail are O(1) and allocate nothing. A slot is in at
 * most one list ({@link Slot#list}). Not thread-safe: guarded by the store's lock.
 */
final class ColdList {
    private Slot head;
    private Slot tail;

    void addLast(Slot s) {
        s.list = this;
        s.prev = tail;
        s.next = null;
        if (tail == null) {
            head = s;
        } else {
            tail.next = s;
        }
        tail = s;
    }

    void remove(Slot s) {
        if (s.prev == null) {
            head = s.next;
        } else {
            s.prev.next = s.next;
        }
        if (s.next == null) {
            tail = s.prev;
        } else {
            s.next.prev = s.prev;
        }
        s.prev = null;
        s.next = null;
        s.list = null;
    }

    Slot head() {
        return head;
    }
}

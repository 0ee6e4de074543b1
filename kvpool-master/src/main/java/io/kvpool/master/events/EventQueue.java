package io.kvpool.master.events;

import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;

/**
 * The master's side of the publisher: a bounded queue that many master threads offer events to and
 * one publisher thread takes them from. A full queue drops the event and counts it: the master never
 * waits for a slow publisher (nor, through it, for a slow subscriber). Offers are linearizable (one
 * lock), as {@link KvEventSink} asks.
 */
final class EventQueue implements KvEventSink {

    private final ArrayBlockingQueue<KvEvent> queue;
    private final LongAdder dropped = new LongAdder();

    /** @param capacity events held at most before new ones are dropped */
    EventQueue(int capacity) {
        this.queue = new ArrayBlockingQueue<>(capacity);
    }

    @Override
    public void stored(List<byte[]> keys, Medium medium) {
        offer(new KvEvent.Stored(keys, medium));
    }

    @Override
    public void removed(List<byte[]> keys, Medium medium) {
        offer(new KvEvent.Removed(keys, medium));
    }

    @Override
    public void allCleared() {
        offer(new KvEvent.AllCleared());
    }

    private void offer(KvEvent e) {
        if (!queue.offer(e)) {
            dropped.increment();
        }
    }

    /** Events dropped because the queue was full. */
    long dropped() {
        return dropped.sum();
    }

    /** Events waiting now. */
    int size() {
        return queue.size();
    }

    /** The next event, waiting up to {@code millis} for one; null if none came. */
    KvEvent poll(long millis) throws InterruptedException {
        return queue.poll(millis, TimeUnit.MILLISECONDS);
    }

    /** Moves up to {@code max} waiting events to {@code into} without waiting; returns how many. */
    int drainTo(List<KvEvent> into, int max) {
        return queue.drainTo(into, max);
    }
}

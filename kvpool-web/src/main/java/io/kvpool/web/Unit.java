package io.kvpool.web;

/** How the status page formats a number: the JSON carries raw values and this name. */
public enum Unit {
    /** A plain count (objects, segments). */
    COUNT("count"),
    /** Bytes, shown as KiB, MiB, GiB. */
    BYTES("bytes"),
    /** A fraction 0..1 shown as a percentage. */
    RATIO("ratio"),
    /** Events per second. */
    PER_SECOND("per_s"),
    /** Bytes per second. */
    BYTES_PER_SECOND("bytes_per_s"),
    /** A duration in seconds, shown in ms or s. */
    SECONDS("seconds"),
    /** Milliseconds since the epoch, shown as a local time. */
    TIME("time"),
    /** Text shown as it is. */
    TEXT("text");

    /** The name the page's script switches on. */
    public final String label;

    Unit(String label) {
        this.label = label;
    }
}

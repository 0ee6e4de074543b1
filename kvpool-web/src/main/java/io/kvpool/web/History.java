package io.kvpool.web;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.util.ArrayList;
import java.util.List;
import java.util.function.DoubleSupplier;

/**
 * The last minutes of a process's numbers, for the status page's charts: a fixed ring of samples
 * taken by {@link #sample} (every second by {@link StatusPages}' sampler), so a page opened now
 * shows the minutes before it was opened.
 *
 * <p>A series is a {@link Kind#GAUGE} (the value as read) or a {@link Kind#RATE} (a counter turned
 * into a per-second rate between two samples; the first sample, and any where the counter went
 * backwards, have no rate and are sent as {@code null}, which the page draws as a gap). Rates are
 * computed here rather than in the page, so every viewer sees the same numbers.
 *
 * <p>Thread-safety: {@link #sample} and {@link #toJson} synchronize on this object; sources are read
 * under that lock, so they must be cheap and must not call back into the history.
 */
public final class History {

    /** How a series' source is read. */
    public enum Kind {
        /** Plotted as read. */
        GAUGE,
        /** A monotonic counter, plotted as its per-second rate. */
        RATE
    }

    /** One line of a chart. */
    public record Series(String id, String label, Kind kind, DoubleSupplier source) {
    }

    /** One chart: its lines share a unit. */
    public record Chart(String id, String title, Unit unit, List<Series> series) {
        public Chart {
            series = List.copyOf(series);
        }
    }

    /** Ten minutes at one sample a second. */
    public static final int DEFAULT_CAPACITY = 600;

    private final List<Chart> charts;
    private final int capacity;
    @GuardedBy("this")
    private final long[] times;
    /** values[series index][slot]; NaN where a rate is unknown. */
    @GuardedBy("this")
    private final double[][] values;
    /** The last raw reading of each series, for rates. */
    @GuardedBy("this")
    private final double[] last;
    @GuardedBy("this")
    private long lastTime = Long.MIN_VALUE;
    @GuardedBy("this")
    private int head;
    @GuardedBy("this")
    private int size;
    private final int seriesCount;

    public History(int capacity, List<Chart> charts) {
        if (capacity < 2) {
            throw new IllegalArgumentException("history: capacity must be at least 2 samples, got " + capacity);
        }
        this.charts = List.copyOf(charts);
        this.capacity = capacity;
        this.seriesCount = this.charts.stream().mapToInt(c -> c.series().size()).sum();
        this.times = new long[capacity];
        this.values = new double[seriesCount][capacity];
        this.last = new double[seriesCount];
    }

    /** A history with nothing to chart (a page without charts). */
    public static History none() {
        return new History(2, List.of());
    }

    public List<Chart> charts() {
        return charts;
    }

    /** Reads every source once, at {@code epochMillis} (which must not go backwards). */
    public synchronized void sample(long epochMillis) {
        if (epochMillis <= lastTime) {
            return; // a clock step back or a repeated tick: keep the series monotonic in time
        }
        double dt = lastTime == Long.MIN_VALUE ? Double.NaN : (epochMillis - lastTime) / 1000.0;
        int slot = (head + size) % capacity;
        if (size == capacity) {
            head = (head + 1) % capacity;
        } else {
            size++;
        }
        times[slot] = epochMillis;
        int i = 0;
        for (Chart c : charts) {
            for (Series s : c.series()) {
                double v = read(s.source());
                if (s.kind() == Kind.GAUGE) {
                    values[i][slot] = v;
                } else {
                    double delta = v - last[i];
                    values[i][slot] = Double.isNaN(dt) || Double.isNaN(delta) || delta < 0 ? Double.NaN : delta / dt;
                    last[i] = v;
                }
                i++;
            }
        }
        lastTime = epochMillis;
    }

    private static double read(DoubleSupplier source) {
        try {
            return source.getAsDouble();
        } catch (RuntimeException e) {
            return Double.NaN; // a source that cannot answer now leaves a gap, not a dead sampler
        }
    }

    /** Samples held (at most the capacity). */
    public synchronized int size() {
        return size;
    }

    /** The latest value of a series, NaN when there is none; for tests and summaries. */
    public synchronized double latest(String seriesId) {
        int i = 0;
        for (Chart c : charts) {
            for (Series s : c.series()) {
                if (s.id().equals(seriesId)) {
                    return size == 0 ? Double.NaN : values[i][(head + size - 1) % capacity];
                }
                i++;
            }
        }
        throw new IllegalArgumentException("history: no series '" + seriesId + "'");
    }

    /**
     * The charts with their samples, oldest first:
     * {@code {"t": [epoch ms...], "charts": [{"id", "title", "unit", "series": [{"id", "label", "values": [...]}]}]}}
     * (a value is {@code null} where it is unknown).
     */
    public synchronized ObjectNode toJson() {
        JsonNodeFactory f = JsonNodeFactory.instance;
        ObjectNode root = f.objectNode();
        ArrayNode t = root.putArray("t");
        for (int k = 0; k < size; k++) {
            t.add(times[(head + k) % capacity]);
        }
        ArrayNode cs = root.putArray("charts");
        int i = 0;
        for (Chart c : charts) {
            ObjectNode cn = cs.addObject().put("id", c.id()).put("title", c.title()).put("unit", c.unit().label);
            ArrayNode ss = cn.putArray("series");
            for (Series s : c.series()) {
                ObjectNode sn = ss.addObject().put("id", s.id()).put("label", s.label());
                ArrayNode vs = sn.putArray("values");
                for (int k = 0; k < size; k++) {
                    double v = values[i][(head + k) % capacity];
                    if (Double.isFinite(v)) {
                        vs.add(v);
                    } else {
                        vs.addNull();
                    }
                }
                i++;
            }
        }
        return root;
    }

    /** Builds a history's charts in the order they are declared. */
    public static final class Builder {
        private record Draft(String id, String title, Unit unit, List<Series> series) {
        }

        private final List<Draft> drafts = new ArrayList<>();

        /** Starts a chart; the series added next belong to it. */
        public Builder chart(String id, String title, Unit unit) {
            drafts.add(new Draft(id, title, unit, new ArrayList<>()));
            return this;
        }

        public Builder gauge(String id, String label, DoubleSupplier source) {
            return add(new Series(id, label, Kind.GAUGE, source));
        }

        public Builder rate(String id, String label, DoubleSupplier source) {
            return add(new Series(id, label, Kind.RATE, source));
        }

        private Builder add(Series s) {
            if (drafts.isEmpty()) {
                throw new IllegalStateException("history: add a chart before its series");
            }
            drafts.getLast().series().add(s);
            return this;
        }

        public History build(int capacity) {
            return new History(capacity, drafts.stream().map(d -> new Chart(d.id(), d.title(), d.unit(), d.series()))
                    .toList());
        }

        public History build() {
            return build(DEFAULT_CAPACITY);
        }
    }

    public static Builder builder() {
        return new Builder();
    }
}

package io.kvpool.bench;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import org.knowm.xchart.BitmapEncoder;
import org.knowm.xchart.CategoryChart;
import org.knowm.xchart.CategoryChartBuilder;
import org.knowm.xchart.style.Styler;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.TreeSet;

/** Everything one `kvpool bench` run measured, and its renderings: table, JSON, CSV, charts. */
final class Results {

    /** One measurement. Unused figures are NaN. */
    record Row(String section, String target, String op, long valueSize, int clients, double gbPerSec,
               double opsPerSec, double p50Micros, double p99Micros, String note) {

        static Row of(String section, String target, String op, long valueSize, int clients, Measurement m, String note) {
            return new Row(section, target, op, valueSize, clients, m.gbPerSecond(), m.opsPerSecond(),
                    m.percentileMicros(0.50), m.percentileMicros(0.99), note);
        }
    }

    /** A target from the issue, checked against this run's figures. */
    record Check(String name, double measured, String unit, String goal, boolean met, String basis) {
    }

    final List<Row> rows = new ArrayList<>();
    final List<Check> checks = new ArrayList<>();
    final Map<String, Object> environment = new LinkedHashMap<>();

    void add(Row r) {
        rows.add(r);
    }

    Optional<Row> find(String section, String target, String op, long size, int clients) {
        return rows.stream().filter(r -> r.section.equals(section) && r.target.equals(target) && r.op.equals(op)
                && r.valueSize == size && r.clients == clients).findFirst();
    }

    /** Adds a ratio check if both rows exist: {@code numerator.gbPerSec / denominator.gbPerSec >= goal}. */
    void ratio(String name, Optional<Row> num, Optional<Row> den, double goal) {
        if (num.isPresent() && den.isPresent()) {
            double r = num.get().gbPerSec / den.get().gbPerSec;
            checks.add(new Check(name, r, "x", ">= " + goal + "x", r >= goal,
                    String.format(Locale.ROOT, "%s %.2f GB/s vs %s %.2f GB/s", num.get().target, num.get().gbPerSec,
                            den.get().target, den.get().gbPerSec)));
        }
    }

    /** Like {@link #ratio} on the rows' ops per second (for rows that count tokens, say). */
    void ratioOps(String name, Optional<Row> num, Optional<Row> den, double goal, String unit) {
        if (num.isPresent() && den.isPresent()) {
            double r = num.get().opsPerSec / den.get().opsPerSec;
            checks.add(new Check(name, r, "x", ">= " + goal + "x", r >= goal,
                    String.format(Locale.ROOT, "%s %.0f %s vs %s %.0f %s", num.get().target, num.get().opsPerSec, unit,
                            den.get().target, den.get().opsPerSec, unit)));
        }
    }

    void print(PrintStream out) {
        out.println();
        out.printf("%-9s %-11s %-15s %8s %7s %9s %12s %10s %10s  %s%n", "section", "target", "op", "size", "clients",
                "GB/s", "ops/s", "p50 us", "p99 us", "note");
        for (Row r : rows) {
            out.printf(Locale.ROOT, "%-9s %-11s %-15s %8s %7s %9s %12s %10s %10s  %s%n", r.section, r.target, r.op,
                    r.valueSize == 0 ? "-" : io.kvpool.config.Size.ofBytes(r.valueSize).toString(),
                    r.clients == 0 ? "-" : Integer.toString(r.clients), num(r.gbPerSec, "%.2f"), num(r.opsPerSec, "%.0f"),
                    num(r.p50Micros, "%.1f"), num(r.p99Micros, "%.1f"), r.note == null ? "" : r.note);
        }
        if (!checks.isEmpty()) {
            out.println();
            out.printf("%-58s %12s  %-12s %-6s  %s%n", "target", "measured", "goal", "met", "basis");
            for (Check c : checks) {
                out.printf(Locale.ROOT, "%-58s %12s  %-12s %-6s  %s%n", c.name,
                        String.format(Locale.ROOT, "%.2f %s", c.measured, c.unit), c.goal, c.met ? "yes" : "NO", c.basis);
            }
        }
    }

    private static String num(double v, String fmt) {
        return Double.isNaN(v) ? "-" : String.format(Locale.ROOT, fmt, v);
    }

    void writeJson(Path file) throws IOException {
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("environment", environment);
        doc.put("rows", rows);
        doc.put("targets", checks);
        new ObjectMapper().enable(SerializationFeature.INDENT_OUTPUT).writeValue(file.toFile(), doc);
    }

    void writeCsv(Path file) throws IOException {
        StringBuilder sb = new StringBuilder("section,target,op,value_bytes,clients,gb_per_s,ops_per_s,p50_us,p99_us,note\n");
        for (Row r : rows) {
            sb.append(String.format(Locale.ROOT, "%s,%s,%s,%d,%d,%s,%s,%s,%s,%s%n", r.section, r.target, r.op, r.valueSize,
                    r.clients, csv(r.gbPerSec), csv(r.opsPerSec), csv(r.p50Micros), csv(r.p99Micros),
                    r.note == null ? "" : '"' + r.note.replace("\"", "'") + '"'));
        }
        Files.writeString(file, sb);
    }

    private static String csv(double v) {
        return Double.isNaN(v) ? "" : String.format(Locale.ROOT, "%.4f", v);
    }

    /** A grouped bar chart of GB/s by client count, one bar per target, for one op and value size. */
    Optional<Path> chart(Path dir, String op, long size) throws IOException {
        List<Row> sel = rows.stream().filter(r -> r.section.equals("store") && r.op.equals(op) && r.valueSize == size).toList();
        if (sel.isEmpty()) {
            return Optional.empty();
        }
        TreeSet<Integer> clients = new TreeSet<>();
        List<String> targets = new ArrayList<>();
        for (Row r : sel) {
            clients.add(r.clients);
            if (!targets.contains(r.target)) {
                targets.add(r.target);
            }
        }
        String sz = io.kvpool.config.Size.ofBytes(size).toString();
        CategoryChart chart = new CategoryChartBuilder().width(900).height(480)
                .title(op + " of " + sz + " values: throughput by concurrency (this machine, one run)")
                .xAxisTitle("concurrent clients").yAxisTitle("GB/s").build();
        chart.getStyler().setLegendPosition(Styler.LegendPosition.InsideNW);
        chart.getStyler().setAvailableSpaceFill(0.85);
        chart.getStyler().setOverlapped(false);
        List<String> xs = clients.stream().map(String::valueOf).toList();
        for (String t : targets) {
            List<Double> ys = new ArrayList<>();
            for (int c : clients) {
                ys.add(sel.stream().filter(r -> r.target.equals(t) && r.clients == c).map(Row::gbPerSec).findFirst().orElse(0.0));
            }
            chart.addSeries(t, xs, ys);
        }
        Path file = dir.resolve("throughput-" + op + "-" + sz + ".png");
        BitmapEncoder.saveBitmap(chart, file.toString(), BitmapEncoder.BitmapFormat.PNG);
        return Optional.of(file);
    }
}

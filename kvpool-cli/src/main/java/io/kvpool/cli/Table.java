package io.kvpool.cli;

import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;

/** A plain-text table with aligned columns, for status and summaries. */
final class Table {

    private final String[] header;
    private final boolean[] rightAlign;
    private final List<String[]> rows = new ArrayList<>();

    Table(String... header) {
        this.header = header;
        this.rightAlign = new boolean[header.length];
    }

    /** Right-aligns the given columns (numbers). */
    Table right(int... cols) {
        for (int c : cols) {
            rightAlign[c] = true;
        }
        return this;
    }

    Table row(Object... cells) {
        String[] r = new String[header.length];
        for (int i = 0; i < r.length; i++) {
            r[i] = i < cells.length && cells[i] != null ? cells[i].toString() : "";
        }
        rows.add(r);
        return this;
    }

    void print(PrintStream out) {
        out.print(render());
    }

    /** The table as lines of text, each ending in a newline. */
    String render() {
        StringBuilder out = new StringBuilder();
        int[] w = new int[header.length];
        for (int i = 0; i < w.length; i++) {
            w[i] = header[i].length();
            for (String[] r : rows) {
                w[i] = Math.max(w[i], r[i].length());
            }
        }
        line(out, header, w);
        StringBuilder sep = new StringBuilder();
        for (int i = 0; i < w.length; i++) {
            sep.append(i == 0 ? "" : "  ").append("-".repeat(w[i]));
        }
        out.append(sep).append('\n');
        for (String[] r : rows) {
            line(out, r, w);
        }
        return out.toString();
    }

    private void line(StringBuilder out, String[] cells, int[] w) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < cells.length; i++) {
            if (i > 0) {
                sb.append("  ");
            }
            String pad = " ".repeat(w[i] - cells[i].length());
            sb.append(rightAlign[i] ? pad + cells[i] : cells[i] + (i == cells.length - 1 ? "" : pad));
        }
        out.append(sb).append('\n');
    }
}

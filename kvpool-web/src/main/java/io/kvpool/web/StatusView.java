package io.kvpool.web;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.util.ArrayList;
import java.util.List;

/**
 * What a status page shows right now, as the page's script reads it from {@code api/status}: a title,
 * cards (one number each), tables and links. The page knows nothing about masters or nodes: each
 * process describes itself with this, so the master, a node and an engine share one page.
 *
 * <pre>
 * {"role": "master", "title": "...", "subtitle": "...", "time": epoch-ms,
 *  "cards":  [{"id": "objects", "label": "Objects", "value": 12, "unit": "count", "detail": "..."}],
 *  "tables": [{"id": "segments", "title": "Segments",
 *              "columns": [{"id": "name", "label": "Segment", "unit": "text"}, ...],
 *              "rows": [["10.0.0.2:50052", ...], ...], "empty": "text shown when there are no rows"}],
 *  "links":  [{"label": "node", "href": "node/"}]}
 * </pre>
 * A card's {@code value} is a raw number (or a string for {@link Unit#TEXT}); the page formats it by
 * its unit and keeps the raw number in the element's {@code data-value}, which tests read.
 */
public final class StatusView {

    private final String role;
    private final String title;
    private final long time;
    private String subtitle = "";
    private final ObjectNode cards = JsonNodeFactory.instance.objectNode();
    private final ArrayNode cardList = JsonNodeFactory.instance.arrayNode();
    private final List<Table> tables = new ArrayList<>();
    private final ArrayNode links = JsonNodeFactory.instance.arrayNode();

    public StatusView(String role, String title, long epochMillis) {
        this.role = role;
        this.title = title;
        this.time = epochMillis;
    }

    /** "up since 2026-11-25 15:16 UTC": how a page's subtitle says when its process started. */
    public static String upSince(long epochMillis) {
        return "up since " + java.time.format.DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm 'UTC'")
                .withZone(java.time.ZoneOffset.UTC).format(java.time.Instant.ofEpochMilli(epochMillis));
    }

    public StatusView subtitle(String s) {
        this.subtitle = s;
        return this;
    }

    /** A card with a number. */
    public StatusView card(String id, String label, double value, Unit unit) {
        return card(id, label, value, unit, null);
    }

    /** A card with a number and a line under it. */
    public StatusView card(String id, String label, double value, Unit unit, String detail) {
        ObjectNode c = newCard(id, label, unit, detail);
        if (Double.isFinite(value)) {
            c.put("value", value);
        } else {
            c.putNull("value");
        }
        return this;
    }

    /** A card with text. */
    public StatusView card(String id, String label, String text, String detail) {
        newCard(id, label, Unit.TEXT, detail).put("value", text);
        return this;
    }

    private ObjectNode newCard(String id, String label, Unit unit, String detail) {
        if (cards.has(id)) {
            throw new IllegalArgumentException("status: two cards named '" + id + "'");
        }
        cards.put(id, true);
        ObjectNode c = cardList.addObject().put("id", id).put("label", label).put("unit", unit.label);
        if (detail != null) {
            c.put("detail", detail);
        }
        return c;
    }

    /** Adds a table; fill it with {@link Table#column} then {@link Table#row}. */
    public Table table(String id, String title) {
        Table t = new Table(id, title);
        tables.add(t);
        return t;
    }

    /** A link shown in the page's header (to a node's page, a dashboard). */
    public StatusView link(String label, String href) {
        links.addObject().put("label", label).put("href", href);
        return this;
    }

    public ObjectNode toJson() {
        ObjectNode root = JsonNodeFactory.instance.objectNode();
        root.put("role", role).put("title", title).put("subtitle", subtitle).put("time", time);
        root.set("cards", cardList.deepCopy());
        ArrayNode ts = root.putArray("tables");
        for (Table t : tables) {
            ts.add(t.toJson());
        }
        root.set("links", links.deepCopy());
        return root;
    }

    /** One table of a status page: typed columns, rows of cells in column order. */
    public static final class Table {
        private final String id;
        private final String title;
        private final ArrayNode columns = JsonNodeFactory.instance.arrayNode();
        private final ArrayNode rows = JsonNodeFactory.instance.arrayNode();
        private String empty = "none";

        private Table(String id, String title) {
            this.id = id;
            this.title = title;
        }

        public Table column(String columnId, String label, Unit unit) {
            columns.addObject().put("id", columnId).put("label", label).put("unit", unit.label);
            return this;
        }

        /** What the page says when the table has no rows. */
        public Table empty(String text) {
            this.empty = text;
            return this;
        }

        /** A row: one cell per column, numbers (NaN for unknown) or strings. */
        public Table row(Object... cells) {
            if (cells.length != columns.size()) {
                throw new IllegalArgumentException("status table " + id + ": a row of " + cells.length + " cells for "
                        + columns.size() + " columns");
            }
            ArrayNode r = rows.addArray();
            for (Object c : cells) {
                switch (c) {
                    case null -> r.addNull();
                    case Double d when !Double.isFinite(d) -> r.addNull();
                    case Integer i -> r.add(i);
                    case Long l -> r.add(l);
                    case Number n -> r.add(n.doubleValue());
                    case Boolean b -> r.add(b);
                    default -> r.add(c.toString());
                }
            }
            return this;
        }

        ObjectNode toJson() {
            ObjectNode t = JsonNodeFactory.instance.objectNode().put("id", id).put("title", title).put("empty", empty);
            t.set("columns", columns.deepCopy());
            t.set("rows", rows.deepCopy());
            return t;
        }
    }
}

package io.kvpool.it;

import com.sun.net.httpserver.HttpServer;
import io.kvpool.cli.EmbeddedPool;
import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.web.History;
import io.kvpool.web.StatusPages;
import io.kvpool.web.StatusView;
import io.kvpool.web.Unit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.InstantSource;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The status page in a real browser: headless Chromium (Debian's, installed by
 * {@code scripts/chromium.sh} when missing) loads the page served by a running pool, its script
 * fetches the JSON and draws it, and the test reads the drawn DOM ({@code --dump-dom} after a
 * virtual-time budget, so the page has polled a few times) and checks its numbers against the pool's
 * own account after known operations. It saves a screenshot to {@code target/status-page.png}; with
 * {@code -Dkvpool.screenshot.docs=true} it also runs traffic for a while ({@code kvpool.screenshot.seconds},
 * 75 by default) so the charts have shape, and takes {@code docs/img/status-page.png} while it runs.
 *
 * <p>What it reads from the page (ids are the contract between the status views and this test):
 * master cards {@code objects, segments, capacity, used, hit_rate, epoch, puts_per_s, gets_per_s},
 * master table {@code segments} columns {@code name, state, capacity, used, objects}; node page cards
 * {@code objects, capacity, used} (bytes in objects' regions, where the master's {@code used} counts
 * allocations). Nothing here waits by sleeping: each check loads the page until
 * it shows what is expected, under a deadline that only bounds a hang.
 */
class StatusPageIT {

    private static final Path SCRIPT = Path.of("..", "scripts", "chromium.sh").toAbsolutePath().normalize();
    /** Bounds a hang; a healthy run on two loaded cores needs a few seconds per page load. */
    private static final Duration DEADLINE = Duration.ofMinutes(3);
    /** Virtual time the page runs before its DOM is read: several one-second polls. */
    private static final int BUDGET_MS = 5_000;

    @BeforeAll
    static void chromium() throws Exception {
        Process p = new ProcessBuilder("bash", SCRIPT.toString(), "install").redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertThat(p.waitFor(15, TimeUnit.MINUTES)).as("scripts/chromium.sh install finished").isTrue();
        Assumptions.assumeTrue(p.exitValue() != 3, () -> "chromium is not available here: " + out.strip());
        assertThat(p.exitValue()).as("scripts/chromium.sh install: " + out).isZero();
    }

    @Test
    void masterPageShowsThePoolAfterKnownOperations(@TempDir Path dir) throws Exception {
        boolean docs = Boolean.getBoolean("kvpool.screenshot.docs");
        Size segment = docs ? Size.ofMiB(64) : Size.ofMiB(8);
        AtomicInteger disks = new AtomicInteger();
        try (InProcessCluster cluster = new InProcessCluster(2, segment, m -> m,
                n -> n.withDisk(dir.resolve("disk-" + disks.incrementAndGet()), Size.ofMiB(256)));
             // no location cache: every get asks the master, so its hit rate is exactly ours
             KvPoolClient c = cluster.client(cfg -> cfg.withLocationCache(0))) {
            int[] sizes = {1_000, 4_096, 20_000, 65_536, 300_000};
            for (int i = 0; i < sizes.length; i++) {
                assertThat(c.put("page/" + i, Payloads.make("page/" + i, 1, sizes[i]))).isEqualTo(PutStatus.OK);
            }
            int hits = 3;
            for (int i = 0; i < hits; i++) {
                assertThat(c.get("page/" + i)).isPresent();
            }
            assertThat(c.get("page/absent")).isEmpty();
            PoolStats pool = c.stats();
            assertThat(pool.keys()).isEqualTo(sizes.length);

            String url = "http://127.0.0.1:" + cluster.master.httpPort() + "/";
            Dom page = load(url, d -> d.card("objects") != null && d.card("objects").has("data-value")
                    && d.card("hit_rate") != null && d.card("hit_rate").has("data-value")
                    && d.table("segments").size() == 2, "the master page with its cards and two segment rows");

            assertThat(page.body().attr("data-state")).isEqualTo("live");
            assertThat(page.byId("title").text()).isEqualTo("kvpool master");
            assertCard(page, "objects", sizes.length, "5");
            assertCard(page, "segments", 2, "2");
            assertCard(page, "capacity", 2 * segment.bytes(), bytesText(2 * segment.bytes()));
            assertCard(page, "used", pool.allocatedBytes(), bytesText(pool.allocatedBytes()));
            assertCard(page, "epoch", pool.epoch(), Long.toString(pool.epoch()));
            // 3 hits and a miss: 75%
            assertCard(page, "hit_rate", 0.75, "75.0%");
            assertThat(page.card("puts_per_s")).as("puts card").isNotNull();
            assertThat(page.card("gets_per_s")).as("gets card").isNotNull();

            List<Map<String, Dom.Cell>> rows = page.table("segments");
            Map<String, PoolStats.SegmentStats> byName = pool.segments().stream()
                    .collect(Collectors.toMap(PoolStats.SegmentStats::name, s -> s));
            long usedSum = 0;
            long objectSum = 0;
            for (Map<String, Dom.Cell> row : rows) {
                String name = row.get("name").value();
                PoolStats.SegmentStats s = byName.get(name);
                assertThat(s).as("segment row " + name + " is one of " + byName.keySet()).isNotNull();
                assertThat(row.get("state").text()).isEqualTo("active");
                assertThat(row.get("capacity").number()).isEqualTo(s.capacityBytes());
                assertThat(row.get("capacity").text()).isEqualTo(bytesText(s.capacityBytes()));
                assertThat(row.get("used").number()).as("used bytes of " + name).isEqualTo(s.usedBytes());
                assertThat(row.get("used").text()).isEqualTo(bytesText(s.usedBytes()));
                assertThat(row.get("objects").number()).as("objects of " + name).isEqualTo(s.objects());
                usedSum += s.usedBytes();
                objectSum += (long) row.get("objects").number();
            }
            assertThat(objectSum).isEqualTo(sizes.length);
            assertThat(usedSum).isEqualTo(pool.allocatedBytes());
            // charts: one uPlot per history chart, drawn by the page's script
            assertThat(page.all(e -> e.hasClass("uplot"))).hasSizeGreaterThanOrEqualTo(3);

            screenshot(url, Path.of("target", "status-page.png").toAbsolutePath(), 1000);
            if (docs) {
                // the docs' picture is taken while traffic runs, so its rates are live and its charts full
                CountDownLatch warm = new CountDownLatch(1);
                AtomicBoolean stop = new AtomicBoolean();
                AtomicReference<Throwable> failed = new AtomicReference<>();
                Thread load = Thread.ofPlatform().name("status-page-traffic").start(() -> {
                    try {
                        traffic(c, Duration.ofSeconds(Long.getLong("kvpool.screenshot.seconds", 75)), warm, stop);
                    } catch (Throwable t) {
                        failed.set(t);
                    } finally {
                        warm.countDown();
                    }
                });
                try {
                    assertThat(warm.await(10, TimeUnit.MINUTES)).as("traffic warmed up").isTrue();
                    assertThat(failed.get()).as("traffic").isNull();
                    screenshot(url, Path.of("..", "docs", "img", "status-page.png").toAbsolutePath().normalize(), 1240);
                } finally {
                    stop.set(true);
                    load.join();
                }
            }
        }
    }

    @Test
    void nodePageUnderServeShowsItsSegment() throws Exception {
        Size segment = Size.ofMiB(16);
        try (EmbeddedPool pool = new EmbeddedPool(MasterConfig.defaults().withListen("127.0.0.1", 0, 0)
                .withSummaryInterval(Duration.ZERO),
                master -> NodeConfig.defaults(master, segment).withListen("127.0.0.1", 0));
             KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(pool.masterAddress()))) {
            long objectBytes = 0; // the node counts the regions its objects fill: header, key, value, aligned
            for (int i = 0; i < 4; i++) {
                String key = "node/" + i;
                int size = 10_000 * (i + 1);
                assertThat(c.put(key, Payloads.make(key, 1, size))).isEqualTo(PutStatus.OK);
                objectBytes += ObjectLayout.regionLength(key.getBytes(StandardCharsets.UTF_8).length, size);
            }
            String base = "http://127.0.0.1:" + pool.master().httpPort() + "/";

            Dom master = load(base, d -> d.card("objects") != null && "4".equals(d.card("objects").attr("data-value")),
                    "the serve master page with 4 objects");
            assertThat(master.all(e -> e.tag.equals("a") && e.attr("href").equals(base + "node/")))
                    .as("the master page links the node's page").hasSize(1);

            Dom node = load(base + "node/", d -> d.card("objects") != null && d.card("objects").has("data-value"),
                    "the node page under /node/");
            assertThat(node.body().attr("data-role")).isEqualTo("node");
            assertCard(node, "objects", 4, "4");
            assertCard(node, "capacity", segment.bytes(), "16.0 MiB");
            assertCard(node, "used", objectBytes, bytesText(objectBytes));
        }
    }

    /**
     * The page's own behaviour on a view with every unit, hostile names and a link it must not make
     * live; the view answers once and then fails, so the page must say it is disconnected and keep
     * showing what it had.
     */
    @Test
    void pageFormatsByUnitNeverRendersDataAsMarkupAndKeepsDataWhenDisconnected() throws Exception {
        String hostile = "<img src=x onerror=\"document.title='pwned'\">";
        AtomicInteger asked = new AtomicInteger();
        StatusView view = new StatusView("master", "formats <b>test</b>", 1_700_000_000_000L).subtitle("sub")
                .card("count", "Count", 1_234_567, Unit.COUNT)
                .card("bytes", "Bytes", 1_536, Unit.BYTES)
                .card("big", "Big", 123_456_789, Unit.BYTES)
                .card("ratio", "Ratio", 0.875, Unit.RATIO)
                .card("small_ratio", "Small ratio", 0.05, Unit.RATIO)
                .card("rate", "Rate", 12_345.6, Unit.PER_SECOND)
                .card("slow_rate", "Slow rate", 2_968.4, Unit.PER_SECOND)
                .card("byte_rate", "Byte rate", 3 << 20, Unit.BYTES_PER_SECOND)
                .card("ms", "Latency", 0.0123, Unit.SECONDS)
                .card("us", "Short latency", 0.0000042, Unit.SECONDS)
                .card("when", "When", 1_700_000_000_000L, Unit.TIME)
                .card("unknown", "Unknown", Double.NaN, Unit.BYTES)
                .card("text", "Text", hostile, "<i>detail</i>")
                .link("<i>bad</i>", "javascript:document.title='pwned'")
                .link("metrics", "metrics");
        view.table("things", "Things").column("name", "Name", Unit.TEXT).column("size", "Size", Unit.BYTES)
                .column("share", "Share", Unit.RATIO).row(hostile, 10L << 30, 0.5).row("plain", Double.NaN, null);
        History history = History.builder().chart("ops", "Ops", Unit.PER_SECOND)
                .rate("gets", "gets", () -> asked.get() * 100.0).gauge("level", "level", () -> 7)
                .chart("mem", "Memory", Unit.BYTES).gauge("used", "used", () -> 5L << 20).build(60);
        for (int i = 0; i < 5; i++) {
            history.sample(1_700_000_000_000L + i * 1000L);
        }
        HttpServer http = StatusPages.listen("test", "127.0.0.1", 0);
        try (StatusPages pages = StatusPages.mount(http, "/", null, () -> {
            if (asked.incrementAndGet() > 1) {
                throw new IllegalStateException("gone");
            }
            return view;
        }, history, InstantSource.system(), Duration.ofHours(1))) {
            http.start();
            String url = "http://127.0.0.1:" + http.getAddress().getPort() + "/";
            Dom page = load(url, d -> "disconnected".equals(d.body().attr("data-state")),
                    "the page disconnected after its first poll");
            assertThat(page.body().attr("data-polls")).as("one poll rendered").isEqualTo("1");
            assertThat(page.byId("state-text").text()).startsWith("disconnected: showing data from ");

            assertCard(page, "count", 1_234_567, "1,234,567");
            assertCard(page, "bytes", 1_536, "1.50 KiB");
            assertCard(page, "big", 123_456_789, "118 MiB");
            assertCard(page, "ratio", 0.875, "87.5%");
            assertCard(page, "small_ratio", 0.05, "5.00%");
            assertCard(page, "rate", 12_345.6, "12.3k/s");
            assertCard(page, "slow_rate", 2_968.4, "2,968/s");
            assertCard(page, "byte_rate", 3 << 20, "3.00 MiB/s");
            assertCard(page, "ms", 0.0123, "12.3 ms");
            assertCard(page, "us", 0.0000042, "4.20 µs");
            // the browser runs in UTC (TZ=UTC below); an instant of another day shows its date
            assertCard(page, "when", 1_700_000_000_000L, "2023-11-14 22:13:20");
            assertThat(page.card("unknown").has("data-value")).as("an unknown value has no data-value").isFalse();
            assertThat(cardText(page, "unknown")).isEqualTo("–");
            assertThat(page.card("text").attr("data-value")).isEqualTo(hostile);
            assertThat(cardText(page, "text")).isEqualTo(hostile);

            // data is text, never markup: no element the data spelled exists, the title is the data's text
            assertThat(page.all(e -> Set.of("img", "b", "i").contains(e.tag))).isEmpty();
            assertThat(page.byId("title").text()).isEqualTo("formats <b>test</b>");
            assertThat(page.all(e -> e.tag.equals("a") && e.attr("href").startsWith("javascript"))).isEmpty();
            assertThat(page.byId("links").all(e -> e.tag.equals("a"))).extracting(Dom.Element::text).containsExactly("metrics");

            List<Map<String, Dom.Cell>> rows = page.table("things");
            assertThat(rows).hasSize(2);
            assertThat(rows.get(0).get("name").value()).isEqualTo(hostile);
            assertThat(rows.get(0).get("name").text()).isEqualTo(hostile);
            assertThat(rows.get(0).get("size").text()).isEqualTo("10.0 GiB");
            assertThat(rows.get(0).get("share").text()).isEqualTo("50.0%");
            assertThat(rows.get(1).get("size").value()).isNull();
            assertThat(rows.get(1).get("size").text()).isEqualTo("–");

            // a uPlot per chart, its legend naming the series
            for (String chart : List.of("ops", "mem")) {
                Dom.Element section = page.first(e -> e.hasClass("chart") && chart.equals(e.attr("data-id")));
                assertThat(section).as("chart " + chart).isNotNull();
                assertThat(section.all(e -> e.tag.equals("canvas"))).as("canvas of " + chart).isNotEmpty();
            }
            assertThat(page.all(e -> e.hasClass("u-label")).stream().map(Dom.Element::text).toList())
                    .contains("gets", "level", "used");
        } finally {
            http.stop(0);
        }
    }

    // ------------------------------------------------------------------ checks

    private static void assertCard(Dom page, String id, double raw, String shown) {
        Dom.Element card = page.card(id);
        assertThat(card).as("card " + id).isNotNull();
        assertThat(card.has("data-value")).as("card " + id + " has a value").isTrue();
        assertThat(Double.parseDouble(card.attr("data-value"))).as("card " + id + " raw value").isEqualTo(raw);
        assertThat(cardText(page, id)).as("card " + id + " as shown").isEqualTo(shown);
    }

    private static String cardText(Dom page, String id) {
        return page.card(id).first(e -> e.hasClass("card-value")).text();
    }

    /** Bytes as the page shows them: B below 1 KiB, else three significant digits of KiB, MiB, GiB. */
    private static String bytesText(long n) {
        if (n < 1024) {
            return String.format(Locale.US, "%,d B", n);
        }
        double v = n;
        String[] units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        int i = 0;
        while (v >= 1024 && i < units.length - 1) {
            v /= 1024;
            i++;
        }
        int decimals = v >= 100 ? 0 : v >= 10 ? 1 : 2;
        return String.format(Locale.ROOT, "%." + decimals + "f %s", v, units[i]);
    }

    // ------------------------------------------------------------------ the browser

    /** Loads {@code url} until the drawn page satisfies {@code ready}; fails at the deadline naming what was awaited. */
    private static Dom load(String url, Predicate<Dom> ready, String what) throws Exception {
        long end = System.nanoTime() + DEADLINE.toNanos();
        Dom last = null;
        String why = "no page loaded";
        do {
            Chromium.Run r = Chromium.run(List.of("--virtual-time-budget=" + BUDGET_MS, "--dump-dom", url));
            if (r.ok()) {
                last = Dom.parse(r.stdout());
                try {
                    if (ready.test(last)) {
                        return last;
                    }
                    why = "the page did not show it yet: body " + last.body().attrs;
                } catch (RuntimeException e) {
                    why = "the page did not show it yet: " + e;
                }
            } else {
                why = "chromium failed: " + r.describe();
            }
        } while (System.nanoTime() < end);
        throw new AssertionError("waited " + DEADLINE + " for " + what + " at " + url + ": " + why
                + (last == null ? "" : "\nlast DOM:\n" + last.source));
    }

    /** A picture of the page 1440 pixels wide, checked to be a PNG of something. */
    private static void screenshot(String url, Path png, int height) throws Exception {
        Files.createDirectories(png.getParent());
        Files.deleteIfExists(png);
        Chromium.Run r = Chromium.run(List.of("--virtual-time-budget=" + BUDGET_MS, "--window-size=1440," + height,
                "--screenshot=" + png, url));
        assertThat(r.ok()).as("screenshot: " + r.describe()).isTrue();
        byte[] head = new byte[8];
        try (var in = Files.newInputStream(png)) {
            assertThat(in.readNBytes(head, 0, 8)).isEqualTo(8);
        }
        assertThat(head).as("a PNG").startsWith((byte) 0x89, (byte) 'P', (byte) 'N', (byte) 'G');
        assertThat(Files.size(png)).as("a picture of something").isGreaterThan(20_000);
    }

    /**
     * Uneven traffic for the docs' screenshot: puts of 16 to 256 KiB that fill the pool past its
     * watermark (evictions, spills to SSD) and waves of gets, some of evicted keys. Counts down
     * {@code warm} after {@code warmUp}, then goes on until {@code stop}.
     */
    private static void traffic(KvPoolClient c, Duration warmUp, CountDownLatch warm, AtomicBoolean stop) {
        long start = System.nanoTime();
        byte[] value = new byte[256 << 10];
        int n = 0;
        while (!stop.get()) {
            double t = (System.nanoTime() - start) / 1e9;
            if (t >= warmUp.toSeconds()) {
                warm.countDown();
            }
            int puts = (int) (20 + 18 * Math.sin(t / 9));
            int gets = (int) (60 + 50 * Math.sin(t / 6 + 1));
            for (int i = 0; i < puts; i++, n++) {
                int size = (16 << 10) + (n * 7919) % (240 << 10);
                c.put("traffic/" + n, MemorySegment.ofArray(value).asSlice(0, size));
            }
            for (int i = 0; i < gets; i++) {
                c.get("traffic/" + Math.max(0, n - 1 - (i * 31) % Math.max(1, n)));
            }
            try {
                Thread.sleep(100); // shapes the load; nothing waits on it
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    /** Runs {@code scripts/chromium.sh run ...}: headless, no background networking, a fresh profile. */
    static final class Chromium {
        record Run(int exit, String stdout, String stderr) {
            boolean ok() {
                return exit == 0;
            }

            String describe() {
                String tail = stderr.lines().filter(l -> !l.contains("dbus")).reduce((a, b) -> b).orElse("");
                return "exit " + exit + (tail.isEmpty() ? "" : ", last stderr line: " + tail);
            }
        }

        static Run run(List<String> args) throws Exception {
            Path out = Files.createTempFile("kvpool-chromium", ".out");
            Path err = Files.createTempFile("kvpool-chromium", ".err");
            try {
                List<String> cmd = new ArrayList<>(List.of("bash", SCRIPT.toString(), "run"));
                cmd.addAll(args);
                ProcessBuilder pb = new ProcessBuilder(cmd).redirectOutput(out.toFile()).redirectError(err.toFile());
                pb.environment().put("TZ", "UTC");
                Process p = pb.start();
                if (!p.waitFor(DEADLINE.toSeconds(), TimeUnit.SECONDS)) {
                    // stop what we started, by id: chromium's processes, then the script
                    p.descendants().forEach(ProcessHandle::destroyForcibly);
                    p.destroyForcibly();
                    p.waitFor(30, TimeUnit.SECONDS);
                    return new Run(-1, "", "chromium did not finish within " + DEADLINE + ": "
                            + Files.readString(err));
                }
                return new Run(p.exitValue(), Files.readString(out), Files.readString(err));
            } finally {
                Files.deleteIfExists(out);
                Files.deleteIfExists(err);
            }
        }
    }

    // ------------------------------------------------------------------ the drawn page

    /**
     * Chromium's serialized DOM, read back into a tree: enough of HTML for a document the browser
     * itself wrote (well nested, attributes quoted, void elements unclosed, entities in text).
     */
    static final class Dom {
        private static final Pattern TAG = Pattern.compile(
                "<(/?)([a-zA-Z][\\w-]*)((?:\\s+[^\\s=>/]+(?:=\"[^\"]*\")?)*)\\s*/?>|<!--.*?-->|<!doctype[^>]*>",
                Pattern.DOTALL | Pattern.CASE_INSENSITIVE);
        private static final Pattern ATTR = Pattern.compile("([^\\s=>/]+)(?:=\"([^\"]*)\")?");
        private static final Set<String> VOID = Set.of("area", "base", "br", "col", "embed", "hr", "img", "input",
                "link", "meta", "source", "track", "wbr");
        private static final Set<String> RAW = Set.of("script", "style");

        final String source;
        final Element root = new Element("#root", Map.of());

        private Dom(String source) {
            this.source = source;
        }

        static Dom parse(String html) {
            Dom d = new Dom(html);
            Deque<Element> open = new ArrayDeque<>();
            open.push(d.root);
            Matcher m = TAG.matcher(html);
            int at = 0;
            while (m.find(at)) {
                if (m.start() > at) {
                    open.peek().children.add(Element.text(unescape(html.substring(at, m.start()))));
                }
                at = m.end();
                if (m.group(2) == null) {
                    continue; // a comment or the doctype
                }
                String tag = m.group(2).toLowerCase(Locale.ROOT);
                if (m.group(1).equals("/")) {
                    while (open.size() > 1 && !open.pop().tag.equals(tag)) {
                        // an element the serializer left open closes with its parent
                    }
                    continue;
                }
                Map<String, String> attrs = new LinkedHashMap<>();
                Matcher a = ATTR.matcher(m.group(3));
                while (a.find()) {
                    attrs.put(a.group(1).toLowerCase(Locale.ROOT), a.group(2) == null ? "" : unescape(a.group(2)));
                }
                Element e = new Element(tag, attrs);
                open.peek().children.add(e);
                if (RAW.contains(tag)) {
                    int close = html.toLowerCase(Locale.ROOT).indexOf("</" + tag, at);
                    at = close < 0 ? html.length() : html.indexOf('>', close) + 1;
                } else if (!VOID.contains(tag)) {
                    open.push(e);
                }
            }
            return d;
        }

        private static String unescape(String s) {
            if (s.indexOf('&') < 0) {
                return s;
            }
            return s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'")
                    .replace("&nbsp;", "\u00a0").replace("&amp;", "&");
        }

        Element body() {
            return first(e -> e.tag.equals("body"));
        }

        Element byId(String id) {
            return first(e -> id.equals(e.attr("id")));
        }

        /** The card with this id, or null. */
        Element card(String id) {
            return first(e -> e.hasClass("card") && id.equals(e.attr("data-id")));
        }

        /** The rows of the table with this id, each cell by its column id; empty when there is no such table. */
        List<Map<String, Cell>> table(String id) {
            Element t = first(e -> e.tag.equals("table") && id.equals(e.attr("data-id")));
            List<Map<String, Cell>> rows = new ArrayList<>();
            if (t == null) {
                return rows;
            }
            for (Element tr : t.all(e -> e.tag.equals("tr"))) {
                Map<String, Cell> row = new LinkedHashMap<>();
                for (Element td : tr.children) {
                    if (td.tag.equals("td")) {
                        row.put(td.attr("data-col"), new Cell(td.has("data-value") ? td.attr("data-value") : null,
                                td.text()));
                    }
                }
                if (!row.isEmpty()) {
                    rows.add(row);
                }
            }
            return rows;
        }

        Element first(Predicate<Element> p) {
            return root.first(p);
        }

        List<Element> all(Predicate<Element> p) {
            return root.all(p);
        }

        /** One table cell: its raw value (null when unknown) and the text shown. */
        record Cell(String value, String text) {
            double number() {
                assertThat(value).as("cell value").isNotNull();
                return Double.parseDouble(value);
            }
        }

        static final class Element {
            final String tag;
            final Map<String, String> attrs;
            final List<Element> children = new ArrayList<>();
            private final String text;

            Element(String tag, Map<String, String> attrs) {
                this(tag, attrs, null);
            }

            private Element(String tag, Map<String, String> attrs, String text) {
                this.tag = tag;
                this.attrs = attrs;
                this.text = text;
            }

            static Element text(String s) {
                return new Element("#text", Map.of(), s);
            }

            boolean has(String name) {
                return attrs.containsKey(name);
            }

            String attr(String name) {
                return attrs.getOrDefault(name, "");
            }

            boolean hasClass(String c) {
                return List.of(attr("class").split("\\s+")).contains(c);
            }

            /** The text inside, as the page shows it (whitespace at the ends trimmed). */
            String text() {
                StringBuilder b = new StringBuilder();
                appendText(b);
                return b.toString().strip();
            }

            private void appendText(StringBuilder b) {
                if (text != null) {
                    b.append(text);
                }
                for (Element c : children) {
                    c.appendText(b);
                }
            }

            Element first(Predicate<Element> p) {
                for (Element c : children) {
                    if (c.text == null && p.test(c)) {
                        return c;
                    }
                    Element f = c.first(p);
                    if (f != null) {
                        return f;
                    }
                }
                return null;
            }

            List<Element> all(Predicate<Element> p) {
                List<Element> out = new ArrayList<>();
                collect(p, out);
                return out;
            }

            private void collect(Predicate<Element> p, List<Element> out) {
                for (Element c : children) {
                    if (c.text == null && p.test(c)) {
                        out.add(c);
                    }
                    c.collect(p, out);
                }
            }

            @Override
            public String toString() {
                return text != null ? text : "<" + tag + " " + attrs + ">";
            }
        }
    }
}

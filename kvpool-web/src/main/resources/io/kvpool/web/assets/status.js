/*
 * kvpool's live status page: one script for the master, a node and an engine alike.
 *
 * Every second it fetches api/status (a StatusView: title, cards, tables, links) and api/history
 * (a History: timestamps and chart series) relative to the page, so the page works under any
 * prefix ("/" or "/node/"), and renders them. The page knows nothing about roles: each process
 * describes itself, and the unit of each number says how to format it.
 *
 * What tests read (and why the markup looks the way it does):
 *   - each card is an element with data-id (the card's id) and data-value (its raw value as the
 *     JSON had it; absent while the value is unknown); its text is the formatted value;
 *   - each table is a <table data-id=...>; every cell has data-col (its column's id) and
 *     data-value (raw; absent when null);
 *   - <body data-state> is "connecting", "live" or "disconnected"; data-polls counts the polls
 *     that rendered fresh data.
 * Data is only ever put in the page with textContent and attributes, never parsed as markup, so a
 * segment or key name cannot inject anything. When a fetch fails the last data stays on screen and
 * the header says since when it is stale.
 *
 * Charts are uPlot (served from the page's own assets: no internet access needed), created once per
 * chart and fed with setData; a ResizeObserver keeps each one as wide as its panel. Nulls in a
 * series are gaps.
 */
(function () {
  "use strict";

  var POLL_MS = 1000;
  var FETCH_TIMEOUT_MS = 5000;
  var PALETTE = ["#2563c9", "#d9731a", "#1e9481", "#b8407a", "#6f56c4", "#6b8f1f", "#8a6a2d", "#3b8fc2"];
  var NUM = new Intl.NumberFormat("en-US", { maximumFractionDigits: 2 });

  // ---------------------------------------------------------------- formatting

  /** n with `sig` significant digits, but never more than 3 decimals nor exponent notation. */
  function sig3(n) {
    var a = Math.abs(n);
    if (a >= 100 || a === 0) return n.toFixed(0);
    if (a >= 10) return n.toFixed(1);
    if (a >= 1) return n.toFixed(2);
    return n.toFixed(3);
  }

  var BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  function bytes(n) {
    var a = Math.abs(n);
    if (a < 1024) return NUM.format(Math.round(n)) + " B";
    var i = 0;
    while (a >= 1024 && i < BYTE_UNITS.length - 1) {
      a /= 1024;
      n /= 1024;
      i++;
    }
    return sig3(n) + " " + BYTE_UNITS[i];
  }

  /** Counts too big to read at a glance get k, M, G (rates only; cards show exact counts). */
  function short(n) {
    var a = Math.abs(n);
    if (a >= 1e9) return sig3(n / 1e9) + "G";
    if (a >= 1e6) return sig3(n / 1e6) + "M";
    if (a >= 1e4) return sig3(n / 1e3) + "k";
    if (a >= 1000 || Number.isInteger(n)) return NUM.format(Math.round(n));
    return sig3(n);
  }

  function seconds(s) {
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return sig3(s * 1e6) + " µs";
    if (a < 1) return sig3(s * 1e3) + " ms";
    if (a < 120) return sig3(s) + " s";
    if (a < 7200) return sig3(s / 60) + " min";
    if (a < 172800) return sig3(s / 3600) + " h";
    return sig3(s / 86400) + " d";
  }

  function pad2(n) {
    return n < 10 ? "0" + n : "" + n;
  }

  function clock(ms) {
    var d = new Date(ms);
    var t = pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
    var now = new Date();
    if (d.toDateString() !== now.toDateString()) {
      t = d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + " " + t;
    }
    return t;
  }

  /** A raw value as the page shows it, by its unit. */
  function format(unit, v) {
    if (v === null || v === undefined || v === "") return "–";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return "–";
    switch (unit) {
      case "bytes": return bytes(v);
      case "bytes_per_s": return bytes(v) + "/s";
      case "ratio": return (v * 100).toFixed(Math.abs(v) < 0.1 && v !== 0 ? 2 : 1) + "%";
      case "per_s": return short(v) + "/s";
      case "seconds": return seconds(v);
      case "time": return v > 0 ? clock(v) : "–";
      case "count": return Number.isInteger(v) ? NUM.format(v) : sig3(v);
      default: return Number.isInteger(v) ? NUM.format(v) : sig3(v);
    }
  }

  /** Axis tick labels: one scale for the whole axis, as few decimals as tell the ticks apart. */
  function axisTicks(unit, splits) {
    var max = 0;
    for (var i = 0; i < splits.length; i++) max = Math.max(max, Math.abs(splits[i]));
    var step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : max || 1;
    var div = 1, suffix = "";
    if (unit === "bytes" || unit === "bytes_per_s") {
      var k = 0;
      while (max >= 1024 && k < BYTE_UNITS.length - 1) {
        max /= 1024;
        div *= 1024;
        k++;
      }
      suffix = " " + BYTE_UNITS[k] + (unit === "bytes_per_s" ? "/s" : "");
    } else if (unit === "ratio") {
      div = 0.01;
      suffix = "%";
    } else if (unit === "seconds") {
      if (max < 1e-3) { div = 1e-6; suffix = " µs"; }
      else if (max < 1) { div = 1e-3; suffix = " ms"; }
      else suffix = " s";
    } else {
      if (max >= 1e9) { div = 1e9; suffix = "G"; }
      else if (max >= 1e6) { div = 1e6; suffix = "M"; }
      else if (max >= 1e4) { div = 1e3; suffix = "k"; }
      if (unit === "per_s") suffix += "/s";
    }
    // as many decimals as the step needs (2.5k steps print 2.5k, 7.5k, not 3k, 8k), at most 3
    var s = step / div, dec = 0;
    while (dec < 3 && Math.abs(s * Math.pow(10, dec) - Math.round(s * Math.pow(10, dec))) > 1e-6 * s * Math.pow(10, dec)) {
      dec++;
    }
    return splits.map(function (v) {
      if (v === null) return "";
      return v === 0 ? "0" : (v / div).toFixed(dec) + suffix;
    });
  }

  /** Tick steps a reader expects: powers of two for bytes, round percentages for ratios. */
  function axisIncrs(unit) {
    var out = [], k, m;
    if (unit === "bytes" || unit === "bytes_per_s") {
      for (k = 0; k <= 5; k++) {
        for (m = 1; m < 1024; m *= 2) out.push(m * Math.pow(1024, k));
      }
      return out;
    }
    if (unit === "ratio") return [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1];
    if (unit === "count") { // whole steps: a count of objects has no quarter ticks
      for (k = 1; k <= 1e15; k *= 10) out.push(k, 2 * k, 5 * k);
      return out;
    }
    return undefined; // uPlot's own 1, 2, 5 steps
  }

  /** Time ticks as 24-hour wall-clock times, with seconds only when ticks are under a minute apart. */
  function timeTicks(splits) {
    var step = splits.length > 1 ? splits[1] - splits[0] : 60;
    return splits.map(function (t) {
      var d = new Date(t * 1000);
      var hm = pad2(d.getHours()) + ":" + pad2(d.getMinutes());
      return step < 60 ? hm + ":" + pad2(d.getSeconds()) : hm;
    });
  }

  // ---------------------------------------------------------------- small DOM helpers

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  /** Sets data-value to the raw value, or removes it when the value is unknown. */
  function setRaw(e, v) {
    if (v === null || v === undefined || (typeof v === "number" && !isFinite(v))) {
      e.removeAttribute("data-value");
    } else {
      e.setAttribute("data-value", String(v));
    }
  }

  function setText(e, t) {
    if (e.textContent !== t) e.textContent = t;
  }

  /** Only links that stay on the web (relative, http, https): never javascript: or data:. */
  function safeHref(href) {
    try {
      var u = new URL(String(href), document.baseURI);
      return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
    } catch (e) {
      return null;
    }
  }

  /** Removes the rendered items (cards, tables, charts) the latest data no longer has. */
  function prune(items, seen, dispose) {
    Object.keys(items).forEach(function (id) {
      if (seen[id]) return;
      if (dispose) dispose(items[id]);
      items[id].root.remove();
      delete items[id];
    });
  }

  function isNumericUnit(unit) {
    return unit !== "text" && unit !== "time";
  }

  // ---------------------------------------------------------------- header

  var $ = function (id) { return document.getElementById(id); };
  var lastGood = 0;
  var polls = 0;

  function renderHeader(v) {
    setText($("title"), v.title || "kvpool");
    setText($("subtitle"), v.subtitle || "");
    document.title = v.title || "kvpool";
    if (v.role) document.body.setAttribute("data-role", v.role);
    var nav = $("links");
    nav.textContent = "";
    (v.links || []).forEach(function (l) {
      var href = safeHref(l.href);
      if (!href) return;
      var a = el("a", null, l.label);
      a.href = href;
      nav.appendChild(a);
    });
  }

  function setState(state, text) {
    document.body.setAttribute("data-state", state);
    setText($("state-text"), text);
  }

  // ---------------------------------------------------------------- cards

  var cards = {}; // id -> {root, value, detail, meter}

  function renderCards(list) {
    var box = $("cards");
    var seen = {};
    list.forEach(function (c, i) {
      var k = cards[c.id];
      if (!k) {
        k = { root: el("div", "card"), label: el("div", "card-label"), value: el("div", "card-value"),
              detail: el("div", "card-detail"), meter: null };
        k.root.setAttribute("data-id", c.id);
        k.root.append(k.label, k.value, k.detail);
        cards[c.id] = k;
      }
      if (box.children[i] !== k.root) box.insertBefore(k.root, box.children[i] || null);
      seen[c.id] = true;
      k.root.setAttribute("data-unit", c.unit);
      setRaw(k.root, c.value);
      setText(k.label, c.label);
      setText(k.value, format(c.unit, c.value));
      setText(k.detail, c.detail || "");
      if (c.unit === "ratio") {
        if (!k.meter) {
          k.meter = el("div", "meter");
          k.meter.appendChild(el("span"));
          k.root.insertBefore(k.meter, k.detail);
        }
        var f = typeof c.value === "number" && isFinite(c.value) ? Math.max(0, Math.min(1, c.value)) : 0;
        k.meter.firstChild.style.width = (f * 100).toFixed(1) + "%";
      }
    });
    prune(cards, seen);
    balance(box);
  }

  /**
   * As many columns as fit (each at least the box's --item-min wide), but rows of equal length where
   * possible: 12 cards in 6 + 6 rather than 7 + 5, 4 charts in 2 + 2 rather than 3 + 1.
   */
  function balance(box) {
    var n = box.children.length;
    if (n === 0) return;
    var style = getComputedStyle(box);
    var min = parseFloat(style.getPropertyValue("--item-min")) || 170;
    var gap = parseFloat(style.columnGap) || 0;
    var fit = Math.max(1, Math.floor((box.clientWidth + gap) / (min + gap)));
    var rows = Math.ceil(n / fit);
    var cols = Math.ceil(n / rows);
    var want = "repeat(" + cols + ", minmax(0, 1fr))";
    if (box.style.gridTemplateColumns !== want) box.style.gridTemplateColumns = want;
  }

  function balanceAll() {
    balance($("cards"));
    balance($("charts"));
  }

  // ---------------------------------------------------------------- tables

  var tables = {}; // id -> {root, title, table, thead, tbody, empty, columnsKey}

  function renderTables(list) {
    var box = $("tables");
    var seen = {};
    list.forEach(function (t, i) {
      var k = tables[t.id];
      var columns = t.columns || [];
      var columnsKey = JSON.stringify(columns);
      if (!k) {
        k = { root: el("section", "panel table-panel"), title: el("h2"), wrap: el("div", "table-wrap"),
              table: el("table"), thead: el("thead"), tbody: el("tbody"), empty: el("p", "empty"),
              columnsKey: null };
        k.table.setAttribute("data-id", t.id);
        k.table.append(k.thead, k.tbody);
        k.wrap.append(k.table);
        k.root.append(k.title, k.wrap, k.empty);
        tables[t.id] = k;
      }
      if (box.children[i] !== k.root) box.insertBefore(k.root, box.children[i] || null);
      seen[t.id] = true;
      setText(k.title, t.title);
      if (k.columnsKey !== columnsKey) {
        k.thead.textContent = "";
        var hr = el("tr");
        columns.forEach(function (c) {
          var th = el("th", isNumericUnit(c.unit) ? "num" : null, c.label);
          th.setAttribute("data-col", c.id);
          th.scope = "col";
          hr.appendChild(th);
        });
        k.thead.appendChild(hr);
        k.columnsKey = columnsKey;
      }
      var rows = t.rows || [];
      // rebuild the body in one go: rows come and go with segments, and a few hundred cells are cheap
      var body = el("tbody");
      rows.forEach(function (r) {
        var tr = el("tr");
        columns.forEach(function (c, j) {
          var v = r[j];
          var td = el("td", isNumericUnit(c.unit) ? "num" : null);
          td.setAttribute("data-col", c.id);
          setRaw(td, v);
          if (c.unit === "ratio" && typeof v === "number" && isFinite(v)) {
            var m = el("span", "cell-meter");
            var bar = el("span");
            bar.style.width = (Math.max(0, Math.min(1, v)) * 100).toFixed(1) + "%";
            m.appendChild(bar);
            td.appendChild(m);
            td.appendChild(document.createTextNode(format(c.unit, v)));
          } else {
            td.textContent = format(c.unit, v);
          }
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      k.table.replaceChild(body, k.tbody);
      k.tbody = body;
      k.root.classList.toggle("is-empty", rows.length === 0);
      setText(k.empty, rows.length === 0 ? (t.empty || "none") : "");
    });
    prune(tables, seen);
  }

  // ---------------------------------------------------------------- charts

  var charts = {}; // id -> {root, plot, u, key, unit}
  var resizer = typeof ResizeObserver === "function" ? new ResizeObserver(onResize) : null;

  function plotSize(box) {
    var w = Math.max(200, Math.floor(box.clientWidth));
    // tall enough to read, short enough that a laptop screen shows the cards and a row of charts
    var h = Math.round(Math.max(150, Math.min(300, w * 0.55, (window.innerHeight || 800) * 0.26)));
    return { width: w, height: h };
  }

  function onResize(entries) {
    entries.forEach(function (e) {
      var id = e.target.getAttribute("data-chart");
      var k = charts[id];
      if (!k || !k.u) return;
      var s = plotSize(k.plot);
      if (s.width !== k.u.width || s.height !== k.u.height) k.u.setSize(s);
    });
  }

  function lastNonNull(a) {
    for (var i = a.length - 1; i >= 0; i--) if (a[i] !== null && a[i] !== undefined) return a[i];
    return null;
  }

  function makePlot(k, c, data) {
    var unit = c.unit;
    var series = [{
      label: "time",
      value: function (u, v, sidx, idx) { return idx === null || v === null ? "latest" : clock(v * 1000); }
    }];
    c.series.forEach(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      series.push({
        label: s.label,
        stroke: color,
        width: 1.75,
        fill: i === 0 ? color + "1a" : undefined, // the first line's area only: overlapping fills turn muddy
        spanGaps: false,
        points: { show: false },
        // with the cursor off the chart the legend shows each line's latest value
        value: function (u, v, sidx, idx) {
          return format(unit, idx === null ? lastNonNull(u.data[sidx]) : v);
        }
      });
    });
    var grid = { stroke: "rgba(20, 30, 50, 0.07)", width: 1 };
    var ticks = { stroke: "rgba(20, 30, 50, 0.15)", width: 1, size: 4 };
    var axisFont = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    var size = plotSize(k.plot);
    var opts = {
      padding: [10, 16, 0, 0],
      width: size.width,
      height: size.height,
      scales: { x: { time: true }, y: { range: function (u, min, max) {
        // axes start at zero, so a flat line reads as flat, not as noise; ratios span 0..100%
        if (min === null || max === null) return [0, 1];
        var lo = Math.min(0, min), hi = max > lo ? max : lo + 1;
        if (unit === "ratio") return [lo, Math.max(1, hi)];
        return [lo, hi + (hi - lo) * 0.08];
      } } },
      series: series,
      axes: [
        { stroke: "#5b6475", grid: grid, ticks: ticks, font: axisFont, space: 70, size: 30,
          values: function (u, splits) { return timeTicks(splits); } },
        {
          stroke: "#5b6475", grid: grid, ticks: ticks, font: axisFont, space: 36, incrs: axisIncrs(unit),
          values: function (u, splits) { return axisTicks(unit, splits); },
          size: function (u, values) {
            var n = 0;
            (values || []).forEach(function (s) { n = Math.max(n, String(s).length); });
            return Math.max(40, 14 + n * 6.6);
          }
        }
      ],
      legend: { live: true, markers: { width: 0, fill: function (u, i) { return u.series[i].stroke(u, i); } } },
      cursor: { points: { size: 6 }, drag: { x: false, y: false } }
    };
    k.u = new uPlot(opts, data, k.plot);
  }

  function dropChart(k) {
    if (resizer) resizer.unobserve(k.plot);
    k.u.destroy();
    k.root.remove();
  }

  function renderCharts(h) {
    var box = $("charts");
    var t = (h.t || []).map(function (ms) { return ms / 1000; });
    var seen = {};
    (h.charts || []).forEach(function (c, i) {
      var key = JSON.stringify([c.unit, c.series.map(function (s) { return [s.id, s.label]; })]);
      var k = charts[c.id];
      if (k && k.key !== key) { // the series changed: start this chart afresh
        dropChart(k);
        delete charts[c.id];
        k = null;
      }
      var data = [t].concat(c.series.map(function (s) { return s.values || []; }));
      if (!k) {
        k = { root: el("section", "panel chart"), title: el("h2"), plot: el("div", "plot"), u: null, key: key };
        k.root.setAttribute("data-id", c.id);
        k.plot.setAttribute("data-chart", c.id);
        k.root.appendChild(k.title);
        k.root.appendChild(k.plot);
        box.insertBefore(k.root, box.children[i] || null);
        charts[c.id] = k;
        makePlot(k, c, data);
        if (resizer) resizer.observe(k.plot);
      } else {
        if (box.children[i] !== k.root) box.insertBefore(k.root, box.children[i] || null);
        k.u.setData(data);
      }
      setText(k.title, c.title);
      seen[c.id] = true;
    });
    prune(charts, seen, dropChart);
    balance(box);
    box.classList.toggle("is-empty", (h.charts || []).length === 0);
  }

  // ---------------------------------------------------------------- polling

  function fetchJson(path) {
    var ctl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, FETCH_TIMEOUT_MS) : null;
    return fetch(path, { cache: "no-store", signal: ctl ? ctl.signal : undefined, headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(path + ": HTTP " + r.status);
        return r.json();
      })
      .finally(function () { if (timer) clearTimeout(timer); });
  }

  function poll() {
    Promise.all([fetchJson("api/status"), fetchJson("api/history")])
      .then(function (got) {
        var v = got[0], h = got[1];
        renderHeader(v);
        renderCards(v.cards || []);
        renderTables(v.tables || []);
        if (typeof uPlot === "function") renderCharts(h);
        lastGood = typeof v.time === "number" && v.time > 0 ? v.time : Date.now();
        polls++;
        document.body.setAttribute("data-polls", String(polls));
        setState("live", "updated " + clock(lastGood));
      })
      .catch(function (e) {
        var why = e && e.name === "AbortError" ? "no answer" : (e && e.message) || "fetch failed";
        setState("disconnected", lastGood
          ? "disconnected: showing data from " + clock(lastGood) + " (" + why + ")"
          : "disconnected: cannot reach the server (" + why + ")");
      })
      .then(function () { setTimeout(poll, POLL_MS); });
  }

  window.addEventListener("resize", balanceAll);
  setState("connecting", "connecting…");
  poll();
})();

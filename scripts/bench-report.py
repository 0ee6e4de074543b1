#!/usr/bin/env python3
"""Prints the markdown tables of docs/benchmarks.md from one `kvpool bench` results.json.

Usage: scripts/bench-report.py bench-results/<run>/results.json
Nothing is typed by hand: every figure in the tables comes from the run's JSON.
"""
import json
import sys


def fmt(v, f):
    if v is None or isinstance(v, str) or v != v:
        return "-"
    return f.format(v)


def size(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return "-" if not b else f"{b} B"


def main(path):
    doc = json.load(open(path))
    rows = doc["rows"]
    env = doc["environment"]
    print(f"Run: mode {env.get('mode')}, Java {env.get('java')}, {env.get('cpus')} CPUs, "
          f"{env.get('os')}, Redis {env.get('redis', '-')}.\n")

    print("### Store: 1 MiB values\n")
    print("| target | op | clients | GB/s | p50 µs | p99 µs |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["section"] == "store" and r["valueSize"] == 1 << 20:
            print(f"| {r['target']} | {r['op']} | {r['clients']} | {fmt(r['gbPerSec'], '{:.2f}')} | "
                  f"{fmt(r['p50Micros'], '{:.0f}')} | {fmt(r['p99Micros'], '{:.0f}')} |")

    for s in sorted({r["valueSize"] for r in rows if r["section"] == "store"} - {1 << 20}):
        print(f"\n### Store: {size(s)} values (GB/s)\n")
        targets = []
        for r in rows:
            if r["section"] == "store" and r["valueSize"] == s and r["target"] not in targets:
                targets.append(r["target"])
        clients = sorted({r["clients"] for r in rows if r["section"] == "store" and r["valueSize"] == s})
        print("| target | op | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in clients) + " |")
        print("| --- | --- | " + " | ".join("---:" for _ in clients) + " |")
        for t in targets:
            for op in ("put", "get"):
                vals = []
                for c in clients:
                    m = [r for r in rows if r["section"] == "store" and r["valueSize"] == s and r["target"] == t
                         and r["op"] == op and r["clients"] == c]
                    vals.append(fmt(m[0]["gbPerSec"], "{:.2f}") if m else "-")
                print(f"| {t} | {op} | " + " | ".join(vals) + " |")

    print("\n### Lookup, metadata, reset\n")
    print("| section | target | op | clients | keys/s | p50 µs | p99 µs | note |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if r["section"] in ("lookup", "metadata", "reset"):
            print(f"| {r['section']} | {r['target']} | {r['op']} | {r['clients'] or '-'} | "
                  f"{fmt(r['opsPerSec'], '{:,.0f}')} | {fmt(r['p50Micros'], '{:.0f}')} | "
                  f"{fmt(r['p99Micros'], '{:.0f}')} | {r['note'] or ''} |")

    mooncake(rows)

    print("\n### Targets\n")
    print("| target | measured | goal | met | basis |")
    print("| --- | ---: | --- | --- | --- |")
    for c in doc["targets"]:
        print(f"| {c['name']} | {c['measured']:.2f} {c['unit']} | {c['goal']} | "
              f"{'yes' if c['met'] else '**no**'} | {c['basis']} |")


def mooncake(rows):
    """The mooncake section: calls/s of each system per row, kvpool's ratios to Mooncake, p50 per call."""
    sel = [r for r in rows if r["section"] == "mooncake"]
    if not sel:
        return
    print("\n### The real Mooncake and kvpool.mooncake\n")
    print("| op | size | procs | Mooncake calls/s (p50 µs) | kvpool calls/s (p50 µs) | ratio | kvpool over TCP calls/s (p50 µs) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    keys = []
    for r in sel:
        k = (r["op"], r["valueSize"], r["clients"])
        if k not in keys:
            keys.append(k)
    for op, vs, c in keys:
        got = {r["target"]: r for r in sel if (r["op"], r["valueSize"], r["clients"]) == (op, vs, c)}
        base = got.get("mooncake")

        def cell(t):
            r = got.get(t)
            return "-" if r is None else f"{r['opsPerSec']:,.0f} ({r['p50Micros']:.0f})"

        def ratio(t):
            r = got.get(t)
            if r is None or base is None or not base["opsPerSec"]:
                return "-"
            x = r["opsPerSec"] / base["opsPerSec"]
            return f"{x:.2f}x" if x >= 2 else f"**{x:.2f}x**"
        print(f"| {op} | {size(vs)} | {c} | {cell('mooncake')} | {cell('kvpool')} | {ratio('kvpool')} | "
              f"{cell('kvpool-tcp')} | {ratio('kvpool-tcp')} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/bench-report.py RESULTS_JSON")
    main(sys.argv[1])

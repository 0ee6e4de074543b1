#!/usr/bin/python3
"""Fills in the "keys" of every scenario of the connector contract vectors, and lays the file out.

The scenarios (kvpool-connector/src/test/resources/connector-contract-vectors.json) name blocks by
label: "b#2" is block 2 of request b, "b#2@v2" the same block under weight version v2. This script
computes each label's pool key independently of kvpool's code, with Debian's python3-cbor2 and
hashlib (vLLM's sha256_cbor chain, as scripts/gen-block-hash-vectors.py), and the key layout of
docs/architecture.md:

  kvp1/{model}/{weights}/tp0of1-pp0of1/{dtype}/{block hash, 64 hex digits}

with model and weights percent-escaped (every byte outside A-Z a-z 0-9 - . _ ~). The Java and the
Python contract tests then check their own keys against these.

Usage: /usr/bin/python3 scripts/gen-connector-contract-keys.py   (rewrites the file in place)
"""
import hashlib
import json
import sys
from pathlib import Path

import cbor2

VECTORS = Path(__file__).resolve().parents[1] / "kvpool-connector" / "src" / "test" / "resources" \
    / "connector-contract-vectors.json"
SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def escape(s):
    return "".join(chr(c) if c in SAFE else "%%%02X" % c for c in s.encode("utf-8"))


def block_hash(seed, request, block_size, block):
    """The chained hash of block `block` of a request: extra keys on every block, the salt on block 0."""
    tokens = request["tokens"]
    extra = list(request.get("extraKeys") or [])
    salt = request.get("salt")
    parent = sha256_cbor(seed)
    for b in range(block + 1):
        keys = extra + ([salt] if salt is not None and b == 0 else [])
        parent = sha256_cbor((parent, tuple(tokens[b * block_size:(b + 1) * block_size]), keys or None))
    return parent


def labels(node):
    """Every block label a scenario's ops mention."""
    out = set()
    if isinstance(node, str) and "#" in node:
        out.add(node)
    elif isinstance(node, list):
        for x in node:
            out |= labels(x)
    elif isinstance(node, dict):
        for k, v in node.items():
            out |= labels(k) | labels(v)
    return out


def key_of(label, scenario, defaults):
    name, _, weights = label.partition("@")
    req, _, block = name.partition("#")
    request = scenario["requests"][req]
    bs = scenario.get("blockSize", defaults["blockSize"])
    if (int(block) + 1) * bs > len(request["tokens"]):
        sys.exit(f"{scenario['name']}: label {label} names a block past request {req}'s tokens")
    prefix = "kvp1/%s/%s/tp0of1-pp0of1/%s/" % (escape(defaults["model"]), escape(weights or defaults["weights"]),
                                                 escape(defaults["dtype"]))
    return prefix + block_hash(defaults["seed"], request, bs, int(block)).hex()


def compact(v):
    return json.dumps(v, ensure_ascii=False)


def layout(doc):
    """The file's layout: one line per about paragraph, request, op and key."""
    lines = ["{", '  "about": [']
    lines += ["    " + compact(a) + ("," if i < len(doc["about"]) - 1 else "") for i, a in enumerate(doc["about"])]
    lines += ["  ],", '  "defaults": ' + compact(doc["defaults"]) + ",",
              '  "implementations": ' + compact(doc["implementations"]) + ",", '  "scenarios": [']
    for si, s in enumerate(doc["scenarios"]):
        lines.append("    {")
        fields = []
        for k, v in s.items():
            if k in ("requests", "keys"):
                body = [f"        {compact(rk)}: {compact(rv)}" for rk, rv in v.items()]
                fields.append([f'      "{k}": {{'] + [b + "," for b in body[:-1]] + body[-1:] + ["      }"])
            elif k == "ops":
                body = [f"        {compact(op)}" for op in v]
                fields.append(['      "ops": ['] + [b + "," for b in body[:-1]] + body[-1:] + ["      ]"])
            else:
                fields.append([f"      {compact(k)}: {compact(v)}"])
        for fi, f in enumerate(fields):
            if fi < len(fields) - 1:
                f[-1] += ","
            lines += f
        lines.append("    }" + ("," if si < len(doc["scenarios"]) - 1 else ""))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def main():
    doc = json.loads(VECTORS.read_text())
    for s in doc["scenarios"]:
        s.pop("keys", None)
        found = sorted(labels(s["ops"]))
        s["keys"] = {label: key_of(label, s, doc["defaults"]) for label in found}
    VECTORS.write_text(layout(doc))
    print(f"{VECTORS}: keys for {sum(len(s['keys']) for s in doc['scenarios'])} labels in "
          f"{len(doc['scenarios'])} scenarios")


if __name__ == "__main__":
    main()

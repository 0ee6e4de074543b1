#!/usr/bin/python3
"""Writes the test vectors for kvpool's sha256_cbor block hashing.

The hashes are computed here, independently of the Java code, with Debian's python3-cbor2
(`apt-get install python3-cbor2`; run with /usr/bin/python3) and hashlib, following vLLM's scheme:

  root hash   = SHA-256(canonical CBOR of the seed string)          (vLLM: PYTHONHASHSEED)
  block hash  = SHA-256(canonical CBOR of [parent hash bytes, [token ids...], extra keys or null])

where the first block's parent is the root hash and only full blocks are hashed.

Usage: scripts/gen-block-hash-vectors.py > kvpool-connector/src/test/resources/block-hash-vectors.json
"""
import hashlib
import json
import random
import sys

import importlib.metadata

import cbor2


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def chain(seed, tokens, block_size, extra):
    parent = sha256_cbor(seed)
    out = []
    for b in range(len(tokens) // block_size):
        block = tuple(tokens[b * block_size:(b + 1) * block_size])
        keys = extra(b) if callable(extra) else extra
        parent = sha256_cbor((parent, block, keys))
        out.append(parent.hex())
    return sha256_cbor(seed).hex(), out


def salted(blocks, salt, lora=()):
    """Per-block extra keys of a request with a cache salt, as vLLM builds them."""
    return [(tuple(lora) + ((salt,) if b == 0 else ())) or None for b in range(blocks)]


def to_json(v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, tuple):
        return [to_json(x) for x in v]
    return v


def main():
    rnd = random.Random(20261122)
    cases = []

    def add(name, seed, tokens, block_size, extra=None, per_block=None):
        keys = (lambda b: per_block[b]) if per_block is not None else extra
        root, hashes = chain(seed, tokens, block_size, keys)
        cases.append({
            "name": name,
            "seed": seed,
            "blockSize": block_size,
            "tokens": tokens,
            "extraKeys": None if per_block is not None else to_json(extra),
            "perBlockExtraKeys": None if per_block is None else [to_json(k) for k in per_block],
            "root": root,
            "blockHashes": hashes,
        })

    add("empty prompt", "0", [], 16)
    add("one partial block: nothing hashed", "0", list(range(15)), 16)
    add("one full block", "0", list(range(16)), 16)
    add("two blocks and a partial one", "0", list(range(40)), 16)
    add("other seed", "12345", list(range(32)), 16)
    add("empty seed string", "", list(range(16)), 16)
    add("unicode seed", "s\u00e9ed-\u4e2d", list(range(16)), 16)
    add("token ids across CBOR integer widths", "0",
        [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**32 - 1, 2**32, 7, 8, 9, 10, 11], 16)
    add("block size 1", "0", [5, 6, 7], 1)
    add("block size 256", "0", [rnd.randrange(0, 128256) for _ in range(600)], 256)
    add("cache salt as extra key", "0", list(range(48)), 16, extra=("salt-v2",))
    add("lora name and id", "0", list(range(32)), 16, extra=("adapter-a", 3))
    add("negative and large ints", "0", list(range(16)), 16, extra=(-1, -24, -25, -256, -65537, 2**40))
    add("bytes and booleans", "0", list(range(16)), 16, extra=(b"\x00\xff", True, False, None))
    add("nested arrays", "0", list(range(16)), 16, extra=(("mm-hash-1", 0), ("mm-hash-2", 12)))
    add("different extra keys per block", "0", list(range(48)), 16,
        per_block=[None, ("img-1",), ("img-1", "img-2")])
    # vLLM's per-request cache_salt (generate_block_hash_extra_keys): the salt follows the LoRA and
    # multimodal keys, on the block starting at token 0 only; a block with no keys hashes None
    add("cache salt on the first block only", "0", list(range(48)), 16,
        per_block=salted(3, "salt-a"))
    add("cache salt after a LoRA name, first block only", "0", list(range(48)), 16,
        per_block=salted(3, "salt-a", lora=("adapter-a", 3)))
    for i in range(6):
        n = rnd.randrange(16, 400)
        add("random %d" % i, str(rnd.randrange(0, 2**32)), [rnd.randrange(0, 152064) for _ in range(n)],
            rnd.choice([4, 16, 32]))
    json.dump({"generator": "scripts/gen-block-hash-vectors.py", "cbor2": importlib.metadata.version("cbor2"), "cases": cases},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

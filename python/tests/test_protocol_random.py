"""Randomized inputs for every decoder the Python client runs on what a server sends: the Java wire
vectors mutated (bits flipped, bytes inserted, cut, repeated) and plain random bytes. Whatever the
bytes, a decoder returns a value or raises ``ProtocolError``; any other exception (IndexError,
struct.error, ValueError, a huge allocation) is a bug. The seed is printed so a failure repeats
(``KVPOOL_FUZZ_SEED=N``); ``KVPOOL_FUZZ_ROUNDS`` makes a longer run.
"""

from __future__ import annotations

import os
import random
import subprocess
from typing import Any, Callable

import pytest

from conftest import JAR, find_java
from kvpool import protocol as p

ROUNDS = int(os.environ.get("KVPOOL_FUZZ_ROUNDS", "3000"))
SEED = int(os.environ.get("KVPOOL_FUZZ_SEED", str(random.SystemRandom().randrange(1 << 32))))

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "hello_reply": p.decode_hello_reply,
    "put_start_reply": p.decode_put_start_reply,
    "write_lease_reply": p.decode_write_lease,
    "codes": lambda b: p.decode_codes(b, "codes"),
    "replica_lists": p.decode_replica_lists,
    "flags": lambda b: p.decode_flags(b, "flags"),
    "sizes": p.decode_sizes,
    "removed": lambda b: p.decode_removed(b, "removed"),
    "cluster_stats": p.decode_cluster_stats,
    "header_node_read_reply": p.decode_header,
}


@pytest.fixture(scope="module")
def vectors() -> dict[str, bytes]:
    out = subprocess.run([str(find_java()), "-cp", str(JAR), "io.kvpool.protocol.WireVectors"],
                         capture_output=True, text=True, check=True, timeout=60)
    return {k: bytes.fromhex(v) for k, v in (line.split(" ", 1) for line in out.stdout.splitlines())
            if not k.startswith(("opcode.", "result.", "status.", "version"))}


def mutate(rng: random.Random, good: bytes) -> bytes:
    b = bytearray(good)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 2 and b:  # cut
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op == 3 and b:  # an extreme value where a count or length may sit
            i = rng.randrange(len(b))
            b[i:i + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"])
        elif op == 4 and b:  # repeat a slice
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 32)]
        else:  # truncate
            del b[rng.randrange(len(b) + 1):]
    return bytes(b)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_decoder_returns_or_raises_protocol_error(vectors: dict[str, bytes], name: str) -> None:
    print(f"seed {SEED} (KVPOOL_FUZZ_SEED={SEED} repeats this run)")
    rng = random.Random(f"{SEED}/{name}")
    decode = DECODERS[name]
    good = vectors[name]
    decode(good)  # the unmutated vector decodes
    for i in range(ROUNDS):
        data = mutate(rng, good) if i % 4 else rng.randbytes(rng.randint(0, 96))
        try:
            decode(data)
        except p.ProtocolError:
            pass
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{name} raised {type(e).__name__}: {e} for {data.hex()} (seed {SEED})") from e

"""kvpool.connector.cbor against python3-cbor2's canonical encoding, byte for byte."""

from __future__ import annotations

import random

import pytest

from kvpool.connector import cbor

cbor2 = pytest.importorskip("cbor2")

BOUNDARIES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
              -1, -24, -25, -256, -257, -65536, -65537, -2**32, -2**32 - 1, -2**63, -2**64]


@pytest.mark.parametrize("value", BOUNDARIES)
def test_integers_at_every_width_boundary(value: int) -> None:
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


@pytest.mark.parametrize("value", [
    None, True, False, "", "a", "salt-v2", "s\u00e9ed-\u4e2d", "x" * 23, "x" * 24, "x" * 300, "y" * 70000,
    b"", b"\x00\xff", bytes(range(256)), b"z" * 70000,
    [], (), [1, 2, 3], (b"\x01" * 32, tuple(range(16)), None), ("adapter-a", 3), (("mm-hash-1", 0), ("mm-hash-2", 12)),
    [[[[]]]], list(range(1000)), [None, True, False, -1, "s", b"b"],
])
def test_values_match_cbor2(value: object) -> None:
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


def test_random_nested_values_match_cbor2() -> None:
    rnd = random.Random(20261123)

    def gen(depth: int) -> object:
        kind = rnd.randrange(7 if depth < 4 else 5)
        if kind == 0:
            return rnd.choice([None, True, False])
        if kind == 1:
            return rnd.randrange(-2**64, 2**64)
        if kind == 2:
            return "".join(chr(rnd.randrange(1, 0x2FFF)) for _ in range(rnd.randrange(40)))
        if kind == 3:
            return bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))
        if kind == 4:
            return rnd.randrange(0, 1 << rnd.choice([5, 8, 16, 32, 64]))
        items = [gen(depth + 1) for _ in range(rnd.randrange(30))]
        return items if kind == 5 else tuple(items)

    for _ in range(500):
        v = gen(0)
        assert cbor.encode(v) == cbor2.dumps(v, canonical=True), v


def test_numpy_integers_encode_as_ints() -> None:
    np = pytest.importorskip("numpy")
    assert cbor.encode([np.int64(5), np.uint32(70000), np.int32(-3)]) == cbor2.dumps([5, 70000, -3], canonical=True)


@pytest.mark.parametrize("value,err,text", [
    (1.5, TypeError, "float"),
    ({"a": 1}, TypeError, "dict"),
    ({1, 2}, TypeError, "set"),
    (object(), TypeError, "object"),
    (2**64, ValueError, "over 2**64 - 1"),
    (-2**64 - 1, ValueError, "under -2**64"),
])
def test_unsupported_values_are_refused_naming_them(value: object, err: type, text: str) -> None:
    with pytest.raises(err, match=text.replace("*", r"\*")):
        cbor.encode([value])

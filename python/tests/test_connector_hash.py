"""Block hashes: the Java side's vectors (scripts/gen-block-hash-vectors.py, which BlockHasherTest also
checks), vLLM's scheme rebuilt by hand with cbor2, and the cache salt's placement."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvpool.connector import BlockHasher, ConnectorRequest, extra_keys_for, sha256_cbor

VECTORS = Path(__file__).resolve().parents[2] / "kvpool-connector" / "src" / "test" / "resources" / "block-hash-vectors.json"


def _value(n: object) -> object:
    """A JSON value of the vectors back to what was hashed: {"bytes": hex} is a byte string."""
    if isinstance(n, dict):
        return bytes.fromhex(n["bytes"])
    if isinstance(n, list):
        return [_value(x) for x in n]
    return n


def _cases() -> list[dict]:
    return json.loads(VECTORS.read_text())["cases"]


def test_the_vectors_are_there_and_many() -> None:
    assert len(_cases()) > 20


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_matches_the_java_vectors(case: dict) -> None:
    h = BlockHasher(case["blockSize"], case["seed"])
    assert h.root.hex() == case["root"]
    per_block = case["perBlockExtraKeys"]
    extra = _value(case["extraKeys"])
    got = h.hashes(case["tokens"], extra_keys=(lambda b: _value(per_block[b])) if per_block is not None else extra)
    assert [x.hex() for x in got] == case["blockHashes"]


def test_salted_vectors_through_connector_requests() -> None:
    """The two salted cases, built as requests: the salt joins block 0's extra keys only."""
    checked = 0
    for c in _cases():
        if not c["name"].endswith("first block only"):
            continue
        lora = ["adapter-a", 3] if "LoRA" in c["name"] else None
        r = ConnectorRequest("v", c["tokens"], extra_keys=lora, cache_salt="salt-a")
        h = BlockHasher(c["blockSize"], c["seed"])
        assert [x.hex() for x in h.hashes(r.tokens, extra_keys=r.extra_keys_for)] == c["blockHashes"]
        checked += 1
    assert checked == 2


def test_vllm_scheme_by_hand_with_cbor2() -> None:
    """NONE_HASH = sha256_cbor(PYTHONHASHSEED); hash = sha256_cbor((parent, tuple(tokens), extra_keys))."""
    cbor2 = pytest.importorskip("cbor2")

    def ref(obj: object) -> bytes:
        return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()

    tokens = [7, 300, 70000, 2**31 - 1] * 12
    h = BlockHasher(16, "42")
    assert h.root == ref("42") == sha256_cbor("42")
    parent = ref("42")
    want = []
    for b in range(3):
        parent = ref((parent, tuple(tokens[16 * b:16 * b + 16]), ("salt",) if b == 0 else None))
        want.append(parent)
    assert h.hashes(tokens, extra_keys=lambda b: extra_keys_for(None, "salt", b)) == want


def test_only_full_blocks_and_each_hash_covers_its_prefix() -> None:
    h = BlockHasher(4, "0")
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    b = [1, 2, 3, 4, 5, 6, 7, 0, 9]
    ha, hb = h.hashes(a), h.hashes(b)
    assert len(ha) == 2 and ha[0] == hb[0] and ha[1] != hb[1]
    assert BlockHasher(4, "1").hashes(a)[0] != ha[0]
    assert h.hashes(a, extra_keys=["salt"])[0] != ha[0]
    assert h.hashes(a, length=7) == ha[:1]
    assert h.next(ha[0], a, 4) == ha[1]


def test_token_sequences_of_any_kind_hash_alike() -> None:
    np = pytest.importorskip("numpy")
    h = BlockHasher(16, "0")
    t = list(range(40))
    assert h.hashes(t) == h.hashes(tuple(t)) == h.hashes(np.arange(40, dtype=np.int64))


def test_extra_keys_for_matches_java_connector_request() -> None:
    assert extra_keys_for(None, None, 0) is None
    assert extra_keys_for([], None, 0) is None
    assert extra_keys_for(None, "salt-a", 0) == ["salt-a"]
    assert extra_keys_for(None, "salt-a", 1) is None
    assert extra_keys_for(["adapter-a", 3], "salt-a", 0) == ["adapter-a", 3, "salt-a"]
    assert extra_keys_for(["adapter-a", 3], "salt-a", 2) == ["adapter-a", 3]
    with pytest.raises(ValueError, match="cache_salt"):
        ConnectorRequest("x", [1] * 16, cache_salt="")


def test_bad_arguments_are_refused_with_clear_messages() -> None:
    with pytest.raises(ValueError, match="block size"):
        BlockHasher(0, "0")
    with pytest.raises(ValueError, match="seed"):
        BlockHasher(16, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs past"):
        BlockHasher(16, "0").next(b"\0" * 32, [1, 2, 3], 0)

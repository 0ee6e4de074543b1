"""Pool keys: the same spelling as Java's KeyFormat (KeyFormatTest's cases)."""

from __future__ import annotations

import pytest

from kvpool.connector import KeyFormat, dtype_name, escape

H = bytes.fromhex("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")


def test_keys_spell_every_field_and_escape_the_model_name() -> None:
    f = KeyFormat("meta-llama/Llama-3.1-8B", "step-1200", "bf16", tp_rank=1, tp_size=2)
    assert f.key(H) == "kvp1/meta-llama%2FLlama-3.1-8B/step-1200/tp1of2-pp0of1/bf16/" + H.hex()
    assert f.key(H).startswith(f.version_prefix())
    assert f.key(H).startswith(KeyFormat.model_prefix(f.model))


def test_the_reference_engine_keys() -> None:
    """What `kvpool engine --model tiny` writes: model kvpool-ref-tiny, weights v1, f32, one rank."""
    assert KeyFormat("kvpool-ref-tiny", "v1", "f32").key(H) == "kvp1/kvpool-ref-tiny/v1/tp0of1-pp0of1/f32/" + H.hex()


def test_another_weight_version_changes_every_key_and_its_prefix_does_not_cover_the_old() -> None:
    v1 = KeyFormat("m", "v1", "f32")
    v10 = v1.with_weights("v10")
    assert v10.key(H) != v1.key(H)
    assert not v10.key(H).startswith(v1.version_prefix())
    assert not v1.key(H).startswith(v10.version_prefix())
    assert not KeyFormat("a/b", "v", "f32").key(H).startswith(KeyFormat.model_prefix("a"))


def test_non_ascii_is_escaped_byte_by_byte() -> None:
    assert escape("\u00e9 ~x") == "%C3%A9%20~x"
    assert escape("A-Za-z0-9._~") == "A-Za-z0-9._~"
    assert escape("a/b%c") == "a%2Fb%25c"


def test_bad_formats_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="model"):
        KeyFormat("", "v", "f32")
    with pytest.raises(ValueError, match="tensor-parallel rank 2 of 2"):
        KeyFormat("m", "v", "f32", tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="pipeline-parallel"):
        KeyFormat("m", "v", "f32", pp_size=0)
    with pytest.raises(ValueError, match="over the pool's 512"):
        KeyFormat("m" * 440, "v", "f32")
    with pytest.raises(ValueError, match="32 bytes"):
        KeyFormat("m", "v").key(b"\0" * 3)


def test_dtype_names() -> None:
    np = pytest.importorskip("numpy")
    assert dtype_name(np.float32) == dtype_name(np.dtype("float32")) == dtype_name("float32") == "f32"
    assert dtype_name("bfloat16") == "bf16" and dtype_name("float16") == "f16"
    torch = pytest.importorskip("torch")
    assert dtype_name(torch.float32) == "f32" and dtype_name(torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="no key spelling"):
        dtype_name("complex64")

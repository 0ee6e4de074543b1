"""How a block's pool key is spelled, identical to the Java side's
``io.kvpool.connector.hash.KeyFormat``, so Python and Java engines share KV::

    kvp1/{model}/{weights}/tp{rank}of{size}-pp{rank}of{size}/{kv dtype}/{block hash, 64 hex digits}

    kvp1/meta-llama%2FLlama-3.1-8B/step-1200/tp0of2-pp0of1/bf16/5f0c...e1

* ``model``, ``weights`` (a weight version or a cache salt) and the dtype are percent-escaped: every
  byte of their UTF-8 outside ``A-Z a-z 0-9 - . _ ~`` becomes ``%XX`` (upper-case hex), so a ``/`` in a
  model name cannot make one key a prefix of another's fields.
* The weight version is part of every key (versioned keys): a new version makes all older KV
  unreachable at once, and :meth:`KeyFormat.version_prefix` names all of it for ``remove_prefix``.
* Each tensor-parallel rank holds its own slice of a block's KV, so the ranks are in the key, and so
  is the KV dtype (the reference engine writes ``f32``).
"""

from __future__ import annotations

from typing import Any

from .hashing import HASH_BYTES

__all__ = ["KeyFormat", "escape", "dtype_name", "VERSION", "MAX_KEY_BYTES"]

VERSION = "kvp1"
#: The pool's key limit, in bytes.
MAX_KEY_BYTES = 512

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def escape(s: str) -> str:
    """Percent-escapes every UTF-8 byte outside ``A-Z a-z 0-9 - . _ ~`` (as Java's ``KeyFormat.escape``)."""
    return "".join(chr(c) if c in _SAFE else "%%%02X" % c for c in s.encode("utf-8"))


def _require_text(s: Any, what: str) -> str:
    if s is None:
        raise ValueError(f"{what} must not be None")
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, got {type(s).__name__}")
    if not s:
        raise ValueError(f"{what} must not be empty")
    return s


_DTYPE_NAMES = {
    "float32": "f32", "float": "f32", "f32": "f32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "f16", "half": "f16", "f16": "f16",
    "float64": "f64", "f64": "f64",
    "float8_e4m3fn": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2",
    "uint8": "u8", "int8": "i8",
}


def dtype_name(dtype: Any) -> str:
    """The key's spelling of a KV dtype: ``torch.float32``, ``numpy.float32``, ``"float32"`` -> ``"f32"``;
    bfloat16 -> ``"bf16"``, float16 -> ``"f16"`` (the Java reference engine writes ``f32``)."""
    name = str(dtype)
    for prefix in ("torch.", "<class 'numpy.", "numpy."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    name = name.rstrip("'>")
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"no key spelling for KV dtype {dtype!r} (known: {sorted(set(_DTYPE_NAMES))})") from None


class KeyFormat:
    """Model, weight version, parallel ranks and KV dtype: everything that makes KV differ for the
    same tokens. Immutable; :meth:`with_weights` gives the format of another weight version.

    Raises ValueError for an empty field, an invalid rank, or keys over :data:`MAX_KEY_BYTES` (naming
    the field to shorten).
    """

    __slots__ = ("model", "weights", "kv_dtype", "tp_rank", "tp_size", "pp_rank", "pp_size", "prefix")

    def __init__(self, model: str, weights: str, kv_dtype: str = "f32", *, tp_rank: int = 0, tp_size: int = 1,
                 pp_rank: int = 0, pp_size: int = 1) -> None:
        self.model = _require_text(model, "model")
        self.weights = _require_text(weights, "weight version")
        self.kv_dtype = _require_text(kv_dtype, "kv dtype")
        if tp_size < 1 or tp_rank < 0 or tp_rank >= tp_size:
            raise ValueError(f"tensor-parallel rank {tp_rank} of {tp_size} is not valid")
        if pp_size < 1 or pp_rank < 0 or pp_rank >= pp_size:
            raise ValueError(f"pipeline-parallel rank {pp_rank} of {pp_size} is not valid")
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, pp_rank, pp_size
        #: Every key of this format starts with this.
        self.prefix = (KeyFormat.version_prefix_of(model, weights)
                       + f"tp{tp_rank}of{tp_size}-pp{pp_rank}of{pp_size}/{escape(kv_dtype)}/")
        length = len(self.prefix) + 2 * HASH_BYTES
        if length > MAX_KEY_BYTES:
            raise ValueError(f"keys for model '{model}' and weights '{weights}' would be {length} bytes, over the "
                             f"pool's {MAX_KEY_BYTES}; shorten the model name or the weight version")

    def with_weights(self, weights: str) -> "KeyFormat":
        """The same model, ranks and dtype under another weight version."""
        return KeyFormat(self.model, weights, self.kv_dtype, tp_rank=self.tp_rank, tp_size=self.tp_size,
                         pp_rank=self.pp_rank, pp_size=self.pp_size)

    def key(self, block_hash: bytes) -> str:
        """The pool key of a block (ASCII)."""
        if len(block_hash) != HASH_BYTES:
            raise ValueError(f"a block hash has {HASH_BYTES} bytes, got {len(block_hash)}")
        return self.prefix + bytes(block_hash).hex()

    def keys(self, block_hashes: Any) -> list[str]:
        """The keys of several blocks, in order."""
        return [self.key(h) for h in block_hashes]

    def version_prefix(self) -> str:
        """Every key of this model and weight version, any rank or dtype, starts with this."""
        return KeyFormat.version_prefix_of(self.model, self.weights)

    @staticmethod
    def version_prefix_of(model: str, weights: str) -> str:
        """``kvp1/{model}/{weights}/``, escaped."""
        return f"{VERSION}/{escape(_require_text(model, 'model'))}/{escape(_require_text(weights, 'weight version'))}/"

    @staticmethod
    def model_prefix(model: str) -> str:
        """Every key of this model, any weight version, starts with this."""
        return f"{VERSION}/{escape(_require_text(model, 'model'))}/"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyFormat) and self.prefix == other.prefix

    def __hash__(self) -> int:
        return hash(self.prefix)

    def __repr__(self) -> str:
        return f"KeyFormat({self.prefix}<hash>)"

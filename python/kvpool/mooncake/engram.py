"""Mooncake's Engram store (embedding tables kept in the store) and its NoF registration helper.

Design note: how a lookup reads. Mooncake's ``EngramStore`` keeps one float32 table ``[N_h, D]`` per
head under the key ``engram:l{layer_id}:h{head}`` and answers ``lookup(row_ids [B, L, H])`` with the
selected rows ``[B, L, H, D]``, reading only those rows (ranged reads). This class stores the same
tables under the same keys in the same layout, so tables written by either system are read by the other;
it runs on the host (numpy), nothing needs a GPU. kvpool has no ranged read (a node sends whole values),
so a lookup reads each head table whole the first time and keeps it, together with the object's
generation. Every later lookup asks the master for the tables' current generations (one round trip,
as Mooncake's own lookup queries the tables' replicas first) and reads again only a table whose
generation changed: the rows returned are always those of the tables in the store at the lookup. The
price is memory: an ``EngramStore`` holds a copy of its layer's tables once it has looked rows up
(``remove_from_store`` and ``populate`` drop it).

As in the binding, failures raise: ``RuntimeError`` for a failed populate, lookup or removal and for
bad row ids or buffers, ``ValueError`` for an invalid configuration, ``TypeError`` for wrong argument
types.
"""

from __future__ import annotations

import operator
import threading
from typing import TYPE_CHECKING, Any, NoReturn, Optional, Sequence

from .args import I32, I64, _int_arg, _str_arg, _uint
from .codes import _INVALID, _NOT_FOUND, _NOT_SUPPORTED, _OK, log

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__ = ["EngramStoreConfig", "EngramStore", "MooncakeDistributedNoFRegister"]

_FLOAT32_BYTES = 4


def _numpy() -> Any:
    import numpy
    return numpy


class EngramStoreConfig:
    """Mooncake's ``EngramStoreConfig``: ``table_vocab_sizes`` (rows per head table, default ``[1024]``)
    and ``embedding_dim`` (floats per row, default 64). Checked when an ``EngramStore`` is made."""

    __slots__ = ("_table_vocab_sizes", "_embedding_dim")

    def __init__(self) -> None:
        self._table_vocab_sizes: list[int] = [1024]
        self._embedding_dim = 64

    @property
    def table_vocab_sizes(self) -> list[int]:
        """Rows of each head's table ``[N_0, ..., N_{H-1}]`` (a copy: change it by assigning a list)."""
        return list(self._table_vocab_sizes)

    @table_vocab_sizes.setter
    def table_vocab_sizes(self, value: Sequence[int]) -> None:
        if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
            raise TypeError(f"table_vocab_sizes must be a list of int, got {type(value).__name__}")
        self._table_vocab_sizes = [_int_arg(v, "table_vocab_sizes item", I64) for v in value]

    @property
    def embedding_dim(self) -> int:
        """Floats per row (``D``)."""
        return self._embedding_dim

    @embedding_dim.setter
    def embedding_dim(self, value: int) -> None:
        self._embedding_dim = _int_arg(value, "embedding_dim", I32)


def _lookup_failed(why: str, *args: Any) -> NoReturn:
    log.error("kvpool.mooncake EngramStore lookup failed: " + why, *args)
    raise RuntimeError("EngramStore lookup failed")


def _populate_failed(why: str, *args: Any) -> NoReturn:
    log.error("kvpool.mooncake EngramStore populate failed: " + why, *args)
    raise RuntimeError("populate failed")


def _as_row_id(value: Any) -> int:
    if not isinstance(value, float):
        try:
            n = operator.index(value)
            if I64[0] <= n <= I64[1]:
                return n
        except TypeError:
            pass
    raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type 'long'")


class EngramStore:
    """Mooncake's ``EngramStore``: one layer's per-head embedding tables in the store, rows looked up by id.

    ``EngramStore(layer_id, config, store=None)``: ``store`` is a set-up kvpool
    ``MooncakeDistributedStore`` (or None: the metadata getters work, the rest raise ``RuntimeError``).
    """

    def __init__(self, layer_id: int, config: EngramStoreConfig, store: Optional[MooncakeDistributedStore] = None,
                 ) -> None:
        layer = _int_arg(layer_id, "layer_id", I32)
        if not isinstance(config, EngramStoreConfig):
            raise TypeError(f"config must be an EngramStoreConfig, got {type(config).__name__}")
        if store is not None:
            from .store import MooncakeDistributedStore
            if not isinstance(store, MooncakeDistributedStore):
                raise RuntimeError("EngramStore store parameter must be a kvpool.mooncake MooncakeDistributedStore "
                                   f"(got {type(store).__name__})")
        sizes, dim = config.table_vocab_sizes, config.embedding_dim
        if not sizes:
            raise ValueError("EngramStoreConfig.table_vocab_sizes must not be empty")
        if dim <= 0:
            raise ValueError("EngramStoreConfig.embedding_dim must be positive")
        if any(n <= 0 for n in sizes):
            raise ValueError("EngramStoreConfig.table_vocab_sizes must contain only positive values")
        self._store = store
        self._sizes = sizes
        self._dim = dim
        self._keys = [f"engram:l{layer}:h{h}" for h in range(len(sizes))]
        self._lock = threading.Lock()
        self._tables: dict[int, tuple[int, Any]] = {}  # head -> (generation, float32 [rows, D])

    # ------------------------------------------------------------------------------ metadata

    def get_table_vocab_sizes(self) -> list[int]:
        """Rows of each head's table."""
        return list(self._sizes)

    def get_store_keys(self) -> list[str]:
        """The store keys of the head tables, ``engram:l{layer_id}:h{head}``."""
        return list(self._keys)

    def get_num_heads(self) -> int:
        """The number of heads (tables)."""
        return len(self._sizes)

    def get_embedding_dim(self) -> int:
        """Floats per row."""
        return self._dim

    # ------------------------------------------------------------------------------ populate

    def populate(self, embedding_buffers: list) -> None:
        """Writes the layer's tables, one numpy array ``[N_h, D]`` per head (converted to float32 as the
        binding does). Create-only: raises ``RuntimeError`` if any head's key exists (remove the layer
        first), for a wrong count or shape, or when a write fails (the tables written are removed again)."""
        if not isinstance(embedding_buffers, list):
            raise TypeError(f"populate(): embedding_buffers must be a list, got {type(embedding_buffers).__name__}")
        np = _numpy()
        if len(embedding_buffers) != len(self._sizes):
            raise RuntimeError("embedding_buffers size must match num_heads")
        arrays = []
        for buf, rows in zip(embedding_buffers, self._sizes):
            if not isinstance(buf, np.ndarray):
                raise RuntimeError("embedding_buffers must be NumPy arrays")
            try:
                arr = np.ascontiguousarray(buf, dtype=np.float32)
            except (TypeError, ValueError):
                raise RuntimeError("embedding_buffers must be float32 arrays") from None
            if arr.ndim != 2:
                raise RuntimeError("each embedding buffer must be 2D [N_h, D]")
            if arr.shape != (rows, self._dim):
                raise RuntimeError("embedding buffer shape does not match get_table_vocab_sizes()/get_embedding_dim()")
            arrays.append(arr)
        store = self._store
        if store is None:
            _populate_failed("the EngramStore has no store")
        with self._lock:
            self._tables.clear()
        present = store.batch_is_exist(self._keys)
        if len(present) != len(self._keys):
            _populate_failed("could not check the keys of layer tables %s", self._keys[0])
        for key, flag in zip(self._keys, present):
            if flag < 0:
                _populate_failed("could not check key %r before writing (%d)", key, flag)
            if flag:
                _populate_failed("key %r exists; populate writes empty keys only: remove the layer first "
                                 "(remove_from_store)", key)
        codes = store.batch_put_from(self._keys, [int(a.ctypes.data) for a in arrays], [a.nbytes for a in arrays])
        if len(codes) == len(self._keys) and all(c == _OK for c in codes):
            return
        for key, code in zip(self._keys, codes):
            if code == _OK:
                rc = store.remove(key, True)
                if rc not in (_OK, _NOT_FOUND):
                    log.error("kvpool.mooncake EngramStore populate: could not roll back key %r (%d)", key, rc)
        _populate_failed("writing the tables returned %s", codes)

    # -------------------------------------------------------------------------------- lookup

    def lookup(self, row_ids: Any) -> Any:
        """The rows ``row_ids[b, l, h]`` of head ``h``'s table as a numpy float32 array ``[B, L, H, D]``.
        ``row_ids`` is a numpy array (converted to int64) or nested lists ``[B][L][H]``. Raises
        ``RuntimeError`` for an empty, ragged or wrongly shaped input, a row id outside ``[0, N_h)``, a
        missing table or a failed read."""
        np = _numpy()
        heads = len(self._sizes)
        if isinstance(row_ids, np.ndarray):
            try:
                ids = np.ascontiguousarray(row_ids, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise RuntimeError("row_ids array must be convertible to int64") from None
            if ids.ndim != 3:
                raise RuntimeError("row_ids array must have shape [B, L, H]")
            if ids.shape[2] != heads:
                raise RuntimeError("row_ids last dimension must match num_heads")
        else:
            nested = [[[_as_row_id(h) for h in token] for token in batch] for batch in row_ids]
            if not nested or not nested[0]:
                raise RuntimeError("row_ids must not be empty")
            if self._store is None:
                _lookup_failed("the EngramStore has no store")
            length = len(nested[0])
            if any(len(b) != length or any(len(t) != heads for t in b) for b in nested):
                _lookup_failed("row_ids is not a [B, L, %d] array (ragged or wrong number of heads)", heads)
            ids = np.array(nested, dtype=np.int64).reshape(len(nested), length, heads)
        return self._gather(np, ids)

    def _gather(self, np: Any, ids: Any) -> Any:
        if self._store is None:
            _lookup_failed("the EngramStore has no store")
        b, l_, heads = ids.shape
        if b == 0 or l_ == 0:
            _lookup_failed("row_ids is empty")
        needed = []
        for h, rows in enumerate(self._sizes):
            col = ids[:, :, h]
            lo, hi = int(col.min()), int(col.max())
            if lo < 0 or hi >= rows:
                _lookup_failed("row id %d of head %d is outside [0, %d)", lo if lo < 0 else hi, h, rows)
            needed.append(hi + 1)
        tables = self._current_tables(np, needed)
        out = np.empty((b, l_, heads, self._dim), dtype=np.float32)
        for h, table in enumerate(tables):
            out[:, :, h, :] = table[ids[:, :, h]]
        return out

    def _current_tables(self, np: Any, needed: list[int]) -> list[Any]:
        """Each head's table as it is in the store now: kept copies whose generation is still current,
        the others read whole. ``needed[h]`` rows must be there."""
        store = self._store
        assert store is not None
        client = store._require("EngramStore.lookup")
        if client is None:
            _lookup_failed("the store is not set up")
        try:
            locs = client.replica_locations(self._keys)
        except Exception as e:  # noqa: BLE001
            _lookup_failed("asking the master for the tables failed: %s", e)
        row_bytes = self._dim * _FLOAT32_BYTES
        tables: list[Any] = [None] * len(self._keys)
        stale: list[tuple[int, int, int]] = []  # head, value length, generation
        with self._lock:
            kept = dict(self._tables)
        for h, (key, loc) in enumerate(zip(self._keys, locs)):
            if loc is None:
                _lookup_failed("table %r is not in the store", key)
            length, generation, _ = loc
            if length // row_bytes < needed[h]:
                _lookup_failed("table %r holds %d rows of %d floats; row %d was asked for", key, length // row_bytes,
                               self._dim, needed[h] - 1)
            have = kept.get(h)
            if have is not None and have[0] == generation:
                tables[h] = have[1]
            else:
                stale.append((h, length, generation))
        if stale:
            bufs = [np.empty(length, dtype=np.uint8) for _, length, _ in stale]
            got = store.batch_get_into([self._keys[h] for h, _, _ in stale], [int(buf.ctypes.data) for buf in bufs],
                                       [length for _, length, _ in stale])
            fresh = {}
            for (h, length, generation), buf, n in zip(stale, bufs, got):
                if n != length:
                    _lookup_failed("reading table %r returned %d (expected %d bytes)", self._keys[h], n, length)
                rows = length // row_bytes
                table = buf[:rows * row_bytes].view(np.float32).reshape(rows, self._dim)
                tables[h] = table
                # labelled with the generation seen before the read: if the table was replaced meanwhile,
                # the next lookup sees a newer generation and reads it again
                fresh[h] = (generation, table)
            with self._lock:
                self._tables.update(fresh)
        return tables

    # -------------------------------------------------------------------------------- remove

    def remove_from_store(self, force: bool = False) -> int:
        """Removes the layer's head tables from the store: the number removed (missing keys are not
        counted). Raises ``RuntimeError`` with the first error code when a removal fails, or without a
        store (rc=-600). ``force`` is passed on (kvpool grants no leases that could hold a removal back)."""
        with self._lock:
            self._tables.clear()
        store = self._store
        if store is None:
            raise RuntimeError(f"remove_from_store failed, rc={_INVALID}")
        removed = 0
        first_error = 0
        for key in self._keys:
            rc = store.remove(key, bool(force))
            if rc == _OK:
                removed += 1
            elif rc != _NOT_FOUND and first_error == 0:
                first_error = rc
        if first_error:
            raise RuntimeError(f"remove_from_store failed, rc={first_error}")
        return removed


class MooncakeDistributedNoFRegister:
    """Mooncake's NVMe-oF target registration with its master. kvpool has no NVMe-oF tier: both calls
    return -1012 (NOT_SUPPORTED) and log why."""

    def __init__(self) -> None:
        """Takes no arguments, as the binding's."""

    def real_register(self, nqn: str, nsid: int, traddr: str, trsvcid: int, base: int, size: int,
                      master_server_addr: str) -> int:
        """Not supported: -1012 and a log line (arguments checked as the binding types them)."""
        _str_arg(nqn, "nqn")
        _uint(nsid, "nsid")
        _str_arg(traddr, "traddr")
        _uint(trsvcid, "trsvcid")
        _uint(base, "base")
        _uint(size, "size")
        _str_arg(master_server_addr, "master_server_addr")
        log.error("kvpool.mooncake MooncakeDistributedNoFRegister.real_register (NVMe-oF target %s at %s:%d) is not "
                  "supported: kvpool has no NVMe-oF tier; give kvpool nodes an SSD tier with --disk-dir/--disk-size",
                  nqn, traddr, trsvcid)
        return _NOT_SUPPORTED

    def real_unregister_by_endpoint(self, nqn: str, nsid: int, traddr: str, trsvcid: int,
                                    master_server_addr: str) -> int:
        """Not supported: -1012 and a log line."""
        _str_arg(nqn, "nqn")
        _uint(nsid, "nsid")
        _str_arg(traddr, "traddr")
        _uint(trsvcid, "trsvcid")
        _str_arg(master_server_addr, "master_server_addr")
        log.error("kvpool.mooncake MooncakeDistributedNoFRegister.real_unregister_by_endpoint (NVMe-oF target %s at "
                  "%s:%d) is not supported: kvpool has no NVMe-oF tier", nqn, traddr, trsvcid)
        return _NOT_SUPPORTED


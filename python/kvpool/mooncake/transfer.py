"""Moving values between callers' buffers and the kvpool client for the store: writes gathered into
staging windows, reads scattered out of them, and the replication settings a put carries."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..buffers import RawBuffer
from ..protocol import PIN_FOREVER
from ..results import TOO_SMALL
from .args import _MAX_KEY_BYTES, Pieces, _buffer_address, _host_memory, _key_ok, _memmove, _pieces_ok
from .codes import _INVALID, _NOT_FOUND, _OK, _code_for, _put_code, _warn_once, log

#: A soft pin without ``soft_pin_ttl_ms`` lasts this long (Mooncake's ``default_kv_soft_pin_ttl``, 30 minutes).
DEFAULT_SOFT_PIN_SECONDS = 30 * 60

#: Gathered values (multi-buffer puts and gets) are staged in sub-batches of at most this many bytes.
STAGING_BATCH_BYTES = 64 << 20


class _Item:
    """One value to write: its source pieces ``(address, size)`` or a ready buffer."""

    __slots__ = ("key", "pieces", "view", "size")

    def __init__(self, key: str, pieces: Optional[Pieces] = None, view: Optional[memoryview] = None) -> None:
        self.key = key
        self.pieces = pieces
        self.view = view
        self.size = view.nbytes if view is not None else sum(s for _, s in pieces or ())


def _replication(config: Any, what: str) -> tuple[int, dict[str, Any]]:
    """(0, client kwargs) for a ReplicateConfig, or (negative code, {})."""
    if config is None:
        return _OK, {"replicas": 1}
    replica_num = int(getattr(config, "replica_num", 1) or 0)
    nof = int(getattr(config, "nof_replica_num", 0) or 0)
    dfs = int(getattr(config, "dfs_replica_num", 0) or 0)
    if getattr(config, "prefer_alloc_in_same_node", False):
        log.error("kvpool.mooncake %s: prefer_alloc_in_same_node is not supported", what)
        return _INVALID, {}
    if replica_num == 0:
        log.error("kvpool.mooncake %s: replica_num is 0", what)
        return _INVALID, {}
    if nof or dfs:
        _warn_once("nofdfs", "kvpool.mooncake: nof_replica_num/dfs_replica_num ignored: kvpool keeps memory "
                   "replicas (and its nodes' own disk tier)")
    pin = _pin_seconds(config, what)
    if pin is None:
        return _INVALID, {}
    kw: dict[str, Any] = {"replicas": max(1, min(replica_num, 255))}
    if pin:
        kw["pin_seconds"] = pin
    preferred = getattr(config, "preferred_segment", "") or ""
    if not preferred:
        segs = getattr(config, "preferred_segments", None) or []
        preferred = segs[0] if segs else ""
    if preferred:
        kw["preferred_segment"] = str(preferred)
    return _OK, kw


def _pin_seconds(config: Any, what: str) -> Optional[int]:
    """The kvpool pin of a ReplicateConfig: 0 none, seconds, or PIN_FOREVER; None (logged) when invalid.

    ``with_hard_pin`` pins until the object is removed or replaced. A soft pin (``with_soft_pin``, or
    ``soft_pin_action == ENABLE``) lasts ``soft_pin_ttl_ms`` rounded up to whole seconds, else 30 minutes;
    a TTL without a soft pin is invalid, as in Mooncake. kvpool pins differ from Mooncake's in two ways:
    a pinned object is still evicted once nothing unpinned is left (never a failed put), and reading it
    does not extend the pin.
    """
    if getattr(config, "with_hard_pin", False):
        return PIN_FOREVER
    action = int(getattr(config, "soft_pin_action", 0) or 0)
    soft = bool(getattr(config, "with_soft_pin", False)) or action == 1  # SoftPinAction.ENABLE
    ttl = getattr(config, "soft_pin_ttl_ms", None)
    if ttl is None:
        return DEFAULT_SOFT_PIN_SECONDS if soft else 0
    if not soft:
        log.error("kvpool.mooncake %s: soft_pin_ttl_ms is set but the soft pin is not enabled", what)
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        log.error("kvpool.mooncake %s: soft_pin_ttl_ms must be a positive number of milliseconds, got %r", what, ttl)
        return None
    return min(math.ceil(ttl / 1000), 0x7FFFFFFF)


# ------------------------------------------------------------------------------------------ writes

def write_items(client: Any, op: str, items: Sequence[Optional[_Item]], config: Any, upsert: bool) -> list[int]:
    """Writes items (None = already failed) with one batch call per staging window; a code per item."""
    out = [_INVALID] * len(items)
    code, kw = _replication(config, op)
    if code:
        return [code] * len(items)
    max_value = getattr(client, "max_value_bytes", None)
    todo: list[int] = []
    seen = _host_memory.seen()
    for i, it in enumerate(items):
        if it is None:
            continue
        if not _key_ok(it.key):
            log.error("kvpool.mooncake %s: key %r is empty or longer than %d UTF-8 bytes", op, it.key[:80],
                      _MAX_KEY_BYTES)
            continue
        if it.size == 0:
            log.error("kvpool.mooncake %s: empty value for key %r", op, it.key[:80])
            continue
        if max_value is not None and it.size > max_value:
            log.error("kvpool.mooncake %s: value for key %r has %d bytes; the kvpool master accepts at most %d",
                      op, it.key[:80], it.size, max_value)
            continue
        if it.pieces is not None and not _pieces_ok(it.pieces, False, op, it.key, seen):
            continue
        todo.append(i)
    # windows: gathered values are copied into one staging buffer each, so bound the bytes per call
    window: list[int] = []
    staged = 0
    for i in todo + [-1]:
        it = items[i] if i >= 0 else None
        gather = it is not None and it.pieces is not None and len(it.pieces) != 1
        if window and (it is None or (gather and staged + it.size > STAGING_BATCH_BYTES)):
            _write_window(client, op, [items[j] for j in window], window, kw, upsert, out)  # type: ignore[misc]
            window, staged = [], 0
        if i >= 0:
            window.append(i)
            if gather:
                staged += it.size  # type: ignore[union-attr]
    return out


def _write_window(client: Any, op: str, items: list[_Item], index: list[int], kw: dict[str, Any], upsert: bool,
                  out: list[int]) -> None:
    values: list[Any] = []
    for it in items:
        if it.view is not None:
            values.append(it.view)
        elif len(it.pieces) == 1:  # type: ignore[arg-type]
            values.append(RawBuffer(*it.pieces[0]))  # type: ignore[index]
        else:
            staging = bytearray(it.size)
            base = _buffer_address(staging)
            off = 0
            for addr, n in it.pieces:  # type: ignore[union-attr]
                _memmove(base + off, addr, n)
                off += n
            values.append(staging)
    keys = [it.key for it in items]
    try:
        if len(items) == 1:
            status = [(client.upsert if upsert else client.put)(keys[0], values[0], **kw)]
        else:
            status = (client.upsert_batch if upsert else client.put_batch)(keys, values, **kw)
        codes = [_put_code(s, upsert) for s in status]
    except Exception as e:  # noqa: BLE001
        code = _code_for(e, data=True)
        log.error("kvpool.mooncake %s of %d key(s) failed (%d): %s", op, len(items), code, e)
        codes = [code] * len(items)
    for i, c in zip(index, codes):
        out[i] = c


# ------------------------------------------------------------------------------------------- reads

def get_values(client: Any, ks: list[str], op: str) -> list[Optional[bytes]]:
    """Each key's value, None for a miss, a key kvpool cannot hold, or when the batch call fails (logged)."""
    out: list[Optional[bytes]] = [None] * len(ks)
    idx = [i for i, k in enumerate(ks) if _key_ok(k)]
    if not idx:
        return out
    try:
        got = client.get_batch([ks[i] for i in idx])
    except Exception as e:  # noqa: BLE001
        log.error("kvpool.mooncake %s of %d key(s) failed: %s", op, len(idx), e)
        return out
    for i, v in zip(idx, got):
        out[i] = v
    return out


def read_pieces(client: Any, op: str, ks: list[str], pieces: list[Pieces]) -> list[int]:
    """Reads ks[i] into pieces[i] (scattering over several pieces); a length or code per key."""
    out = [_INVALID] * len(ks)
    direct: list[int] = []
    scatter: list[int] = []
    seen = _host_memory.seen()
    for i, (k, pc) in enumerate(zip(ks, pieces)):
        if not _key_ok(k):
            out[i] = _NOT_FOUND  # no such object can exist in kvpool (Mooncake: OBJECT_NOT_FOUND)
        elif not _pieces_ok(pc, True, op, k, seen):
            out[i] = _INVALID
        elif len(pc) == 1 and pc[0][0] != 0:
            direct.append(i)
        else:
            scatter.append(i)
    if direct:
        bufs = [RawBuffer(*pieces[i][0]) if pieces[i][0][1] else bytearray(0) for i in direct]
        _read_into(client, op, [ks[i] for i in direct], bufs, direct, out)
    # scattered keys: read into staging buffers, then copy out in order, a window of bytes at a time
    need = {i: sum(n for _, n in pieces[i]) for i in scatter}
    start = 0
    while start < len(scatter):
        window: list[int] = []
        total = 0
        while start < len(scatter) and (not window or total + need[scatter[start]] <= STAGING_BATCH_BYTES):
            window.append(scatter[start])
            total += need[scatter[start]]
            start += 1
        staging = [bytearray(need[i]) for i in window]
        _read_into(client, op, [ks[i] for i in window], staging, window, out)
        for i, buf in zip(window, staging):
            got = out[i]
            if got <= 0 or not buf:
                continue
            src = _buffer_address(buf)
            off = 0
            for addr, n in pieces[i]:
                take = min(n, got - off)
                if take <= 0:
                    break
                _memmove(addr, src + off, take)
                off += take
    return out


def _read_into(client: Any, op: str, keys: list[str], bufs: list[Any], index: list[int], out: list[int]) -> None:
    try:  # one key asks the master as a single get does (_batch=False)
        got = client.get_into_batch(keys, bufs, _batch=len(keys) > 1)
    except Exception as e:  # noqa: BLE001
        c = _code_for(e, data=True)
        log.error("kvpool.mooncake %s of %d key(s) failed (%d): %s", op, len(keys), c, e)
        for i in index:
            out[i] = c
        return
    for k, i, n in zip(keys, index, got):
        if n == TOO_SMALL:
            log.error("kvpool.mooncake %s: the value of %r is larger than the buffer given for it", op, k)
        out[i] = n if n >= 0 else _INVALID if n == TOO_SMALL else _NOT_FOUND

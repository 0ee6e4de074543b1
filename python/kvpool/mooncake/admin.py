"""Mooncake's replica, segment and task administration on the store: replica descriptors, replica clearing,
segment mounting, copy and move tasks, and the counters.

Design note: replica clearing. Mooncake's ``batch_replica_clear`` lets the client that wrote an object
drop its copies once the object's lease has run out: all of them, or only those on one segment. kvpool
differs in three ways, and this module does what is true in each:

* kvpool grants this client no leases (it asks the master on every read), so no copy is held back by
  one: a key is cleared at once, without waiting ``default_kv_lease_ttl`` after its put or last read.
* kvpool objects have no owner, so a key is cleared whoever wrote it (Mooncake skips other clients' keys).
* kvpool's master removes whole objects; it has no request that drops one copy and keeps the others.
  With a segment name, a key whose every copy is on that segment is removed (what Mooncake leaves
  too: no copy, no object); a key with copies elsewhere as well is not cleared, and a warning says so.
  Between the lookup and the removal an upsert elsewhere could replace the object; the removal then
  takes the new object too (kvpool's REMOVE names a key, not a generation).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..protocol import TIER_MEMORY, value_offset
from .args import _key_ok, _keys_arg, _str_arg, _uint
from .codes import _INTERNAL, _INVALID, _NOT_SUPPORTED, _OK, _warn_once, log
from .descriptors import QueryTaskResponse, ReplicaDescriptor

__all__: list[str] = []

#: One key's copies as kvpool's client reports them: (value length, generation, [(segment, tier, offset)]).
_Location = tuple[int, int, list[tuple[str, int, int]]]

_NO_SEGMENTS = ("kvpool clients contribute no memory or disk to the pool: capacity comes from kvpool nodes. "
                "Run a kvpool node to add a segment (kvpool node --master HOST:PORT --segment-size SIZE "
                "[--disk-dir DIR --disk-size SIZE]) and stop it to take the segment away")
_NO_TASKS = ("kvpool's master places copies itself (ReplicateConfig.replica_num, preferred_segment) and makes "
             "missing ones again by its own repair; it takes no requests to copy or move a copy to a named "
             "segment")


def _descriptors(key: str, loc: _Location) -> list[ReplicaDescriptor]:
    """A ReplicaDescriptor per copy kvpool's master lists (copies on a segment it no longer lists left out)."""
    length, _, copies = loc
    start = value_offset(len(key.encode("utf-8")))
    out = []
    for segment, tier, offset in copies:
        if not segment:
            continue  # the segment left the pool after the master's answer: nothing can read this copy
        if tier == TIER_MEMORY:
            out.append(ReplicaDescriptor._memory_copy(segment, offset + start, length))
        else:
            out.append(ReplicaDescriptor._local_disk_copy())
    return out


def _task_id_arg(task_id: Any) -> tuple[int, int]:
    """A UUID as the binding takes it: a sequence of two unsigned 64-bit ints; TypeError otherwise."""
    if isinstance(task_id, (str, bytes, bytearray)) or not isinstance(task_id, Sequence):
        raise TypeError(f"task_id must be a tuple of two ints, got {type(task_id).__name__}")
    if len(task_id) != 2:
        raise TypeError(f"task_id must be a tuple of two ints, got {len(task_id)} items")
    hi, lo = (_uint(x, "task_id") for x in task_id)
    return hi, lo


class _AdminMethods:
    """The administration methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""

    if TYPE_CHECKING:
        _lock: threading.Lock
        _registered: dict[int, int]
        _dummy: bool

        def _require(self, what: str) -> Any:
            """The store core's: the kvpool client, or None (logged) before setup."""

    # ------------------------------------------------------------------------- replica descriptors

    def _locations(self, op: str, keys: list[str]) -> Optional[list[Optional[_Location]]]:
        """Where each key's copies are (None for an absent key or one kvpool cannot hold); None, after
        logging, before setup or when the master could not be asked."""
        client = self._require(op)
        if client is None:
            return None
        out: list[Optional[_Location]] = [None] * len(keys)
        idx = [i for i, k in enumerate(keys) if _key_ok(k)]
        if not idx:
            return out
        try:
            found = client.replica_locations([keys[i] for i in idx])
        except Exception as e:  # noqa: BLE001 - a failed call is an answer, never an exception
            log.error("kvpool.mooncake %s of %d key(s) failed: %s", op, len(idx), e)
            return None
        for i, loc in zip(idx, found):
            out[i] = loc
        return out

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The object's copies as ``ReplicaDescriptor`` objects; ``[]`` (after logging) when the key is
        absent, before setup, or when the master cannot be asked. A memory copy's descriptor gives the
        kvpool node's ``host:port`` as ``transport_endpoint``, the value's length as ``size`` and the
        value's byte offset in that node's segment as ``buffer_address``; a copy on a node's SSD tier
        is a local-disk replica. Like a read, the lookup counts as an access for eviction."""
        k = _str_arg(key, "key")
        locs = self._locations("get_replica_desc", [k])
        if locs is None:
            return []
        loc = locs[0]
        if loc is None:
            log.error("kvpool.mooncake get_replica_desc: object not found for key %r", k[:80])
            return []
        out = _descriptors(k, loc)
        if not out:
            log.error("kvpool.mooncake get_replica_desc: empty replica list for key %r", k[:80])
        return out

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """``get_replica_desc`` for many keys in one master round trip: a dict from each present key to its
        copies; absent keys are left out (and logged), as in Mooncake. ``{}`` before setup or when the
        master cannot be asked."""
        ks = _keys_arg(keys)
        locs = self._locations("batch_get_replica_desc", ks)
        if locs is None:
            return {}
        out: dict[str, list[ReplicaDescriptor]] = {}
        for k, loc in zip(ks, locs):
            if loc is None:
                log.error("kvpool.mooncake batch_get_replica_desc: object not found for key %r", k[:80])
            else:
                out[k] = _descriptors(k, loc)
        return out

    # ----------------------------------------------------------------------------- replica clearing

    def batch_replica_clear(self, keys: Sequence[str],
                            segment_name: str = "") -> list[str]:
        """Drops the keys' copies and returns the keys cleared, in the order given; ``[]`` before setup or
        when the master cannot be asked.

        With no ``segment_name`` every present key is removed. With one (a kvpool node's ``host:port``)
        a key is removed when all its copies are on that segment; a key with no copy there is skipped
        (as in Mooncake), and one with copies on other segments too is skipped with a warning, because
        kvpool cannot drop one copy and keep the rest. kvpool grants this client no leases and records
        no owners, so keys are cleared at once and whoever wrote them (Mooncake waits for the lease to
        run out and clears only the caller's own keys).
        """
        ks = _keys_arg(keys)
        segment = _str_arg(segment_name, "segment_name")
        op = "batch_replica_clear"
        client = self._require(op)
        if client is None:
            return []
        unique: list[str] = []
        seen: set[str] = set()
        for k in ks:
            if not _key_ok(k):
                log.warning("kvpool.mooncake %s: key %r is empty or longer than kvpool keys, skipping", op, k[:80])
            elif k not in seen:
                seen.add(k)
                unique.append(k)
        if not unique:
            return []
        targets = unique
        if segment:
            locs = self._locations(op, unique)
            if locs is None:
                return []
            targets = []
            for k, loc in zip(unique, locs):
                if loc is None:
                    log.warning("kvpool.mooncake %s: key %r not found, skipping", op, k[:80])
                    continue
                names = {s for s, _, _ in loc[2]}
                if segment not in names:
                    log.warning("kvpool.mooncake %s: key %r has no replica on segment %s, skipping", op, k[:80],
                                segment)
                elif names != {segment}:
                    others = ", ".join(sorted(n or "?" for n in names - {segment}))
                    log.warning("kvpool.mooncake %s: key %r not cleared: it also has copies on %s, and kvpool "
                                "cannot drop the copy on %s alone (its master removes whole objects)", op,
                                k[:80], others, segment)
                else:
                    targets.append(k)
            if not targets:
                return []
        try:
            removed = client.remove_batch(targets)
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake %s of %d key(s) failed: %s", op, len(targets), e)
            return []
        cleared = []
        for k, ok in zip(targets, removed):
            if ok:
                cleared.append(k)
            else:
                log.warning("kvpool.mooncake %s: key %r not found, skipping", op, k[:80])
        return cleared

    # -------------------------------------------------------------------------------------- counters

    def get_offload_rpc_read_count(self) -> int:
        """Mooncake's count of reads this client had served from a local-disk (SSD offload) copy through
        the owner's offload RPC. kvpool's client does not count its reads of disk-tier copies, so this
        is 0 (as Mooncake answers for a client without SSD offload); the nodes count disk-tier hits
        (``disk_hits`` per segment in ``kvpool.Client.status()``)."""
        _warn_once("offload_rpc_read_count", "kvpool.mooncake get_offload_rpc_read_count: always 0: the kvpool "
                   "client does not count its reads of disk-tier copies; each node's disk_hits (kvpool status) "
                   "counts them pool-wide")
        return 0

    def alloc_from_mem_pool(self, size: int) -> int:
        """After ``setup_dummy``: the address of ``size`` new bytes of shared memory, as the wheel's dummy
        client answers (a memfd named ``mooncake_shm`` of exactly that size, page-aligned, zeroed; rounded up
        to hugepages with MC_STORE_USE_HUGEPAGE), or 0 (logged) when it cannot be had, ``size`` 0 included.
        ``register_buffer(address, size)`` takes it; ``MooncakeHostMemAllocator().free(address)`` frees it
        (``close()`` does not, as in the wheel). For a store set up with ``setup()``, and before any setup, 0:
        Mooncake's real client has no such pool (kvpool reads and writes any host memory: pass buffers of
        your own to ``put_from`` / ``get_into``)."""
        n = _uint(size, "size")
        if not self._dummy:
            _warn_once("alloc_from_mem_pool", "kvpool.mooncake alloc_from_mem_pool: returns 0: only a store set up "
                       "with setup_dummy has a memory pool (as in Mooncake); use buffers of your own with "
                       "put_from/get_into")
            return 0
        from . import host_memory  # after this module in the package's order; it imports neither
        try:
            return host_memory._shm_alloc(n)
        except RuntimeError as e:
            log.error("kvpool.mooncake alloc_from_mem_pool: Failed to allocate from mem pool: %s", e)
            return 0

    def _register_pool_memory(self, ptr: int, n: int) -> Optional[int]:
        """register_buffer of the dummy client's pool memory: 0 for a whole allocation (again too), -1 for
        anything else inside one; None when ``ptr`` is not pool memory (the ordinary rules apply)."""
        from . import host_memory
        seg = host_memory._shm_segment(ptr)
        if seg is None:
            return None
        page = host_memory._shm_page()
        if page:
            n = -(-n // page) * page
        base, length = seg
        if ptr != base or n != length:
            log.error("kvpool.mooncake register_buffer: invalid buffer address or size for the memory pool: "
                      "0x%x +%d, the allocation is 0x%x +%d (register it whole)", ptr, n, base, length)
            return _INTERNAL
        with self._lock:
            self._registered[ptr] = n
        return _OK

    def _unregister_pool_memory(self, ptr: int) -> Optional[int]:
        """unregister_buffer of the dummy client's pool memory: 0, or -1 for an address that is not the start
        of a registered allocation; None when ``ptr`` is not pool memory."""
        from . import host_memory
        seg = host_memory._shm_segment(ptr)
        if seg is None:
            return None
        with self._lock:
            if ptr != seg[0] or self._registered.pop(ptr, None) is None:
                log.error("kvpool.mooncake unregister_buffer: 0x%x is not a registered memory pool buffer", ptr)
                return _INTERNAL
        return _OK

    # -------------------------------------------------------------------------------------- segments

    def mount_segment(self, path: str, size: int, offset: int = 0,
                      protocol: str = "tcp", location: str = "") -> dict:
        """Not supported: ``{'ret': -1012, 'segment_ids': []}`` (NOT_SUPPORTED) and a log line. kvpool
        clients lend no memory to the pool; a kvpool node does."""
        _str_arg(path, "path")
        _uint(size, "size")
        _uint(offset, "offset")
        _str_arg(protocol, "protocol")
        _str_arg(location, "location")
        log.error("kvpool.mooncake mount_segment is not supported: %s", _NO_SEGMENTS)
        return {"ret": _NOT_SUPPORTED, "segment_ids": []}

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp",
                                   location: str = "") -> dict:
        """Not supported: ``{'ret': -1012, 'segment_ids': [], 'allocated_size': 0}`` and a log line."""
        _uint(size, "size")
        _str_arg(protocol, "protocol")
        _str_arg(location, "location")
        log.error("kvpool.mooncake allocate_and_mount_segment is not supported: %s", _NO_SEGMENTS)
        return {"ret": _NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0}

    def unmount_segment(self, segment_ids: Sequence[str],
                        grace_period_seconds: int = 0) -> int:
        """Not supported: -1012 and a log line (this client mounted no segment to unmount)."""
        _keys_arg(segment_ids, "segment_ids")
        _uint(grace_period_seconds, "grace_period_seconds")
        log.error("kvpool.mooncake unmount_segment is not supported: %s", _NO_SEGMENTS)
        return _NOT_SUPPORTED

    def unmount_and_free_segment(self, segment_ids: Sequence[str],
                                 grace_period_seconds: int = 0) -> int:
        """Not supported: -1012 and a log line (this client allocated no segment to free)."""
        _keys_arg(segment_ids, "segment_ids")
        _uint(grace_period_seconds, "grace_period_seconds")
        log.error("kvpool.mooncake unmount_and_free_segment is not supported: %s", _NO_SEGMENTS)
        return _NOT_SUPPORTED

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """Drains this client's local SSD-offload segment: 0, with a warning, since a kvpool client has
        none (Mooncake answers 0 the same way for a client without SSD offload); -600 before setup.
        A kvpool node's SSD tier goes away with the node (or is set by its ``--disk-dir``)."""
        _uint(grace_period_seconds, "grace_period_seconds")
        if self._require("unmount_local_disk_segment") is None:
            return _INVALID
        _warn_once("unmount_local_disk_segment", "kvpool.mooncake unmount_local_disk_segment: nothing to drain: a "
                   "kvpool client has no local disk segment (SSD tiers belong to kvpool nodes)")
        return _OK

    # ----------------------------------------------------------------------------------------- tasks

    def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[tuple[int, int], int]:
        """Not supported: ``((0, 0), -1012)`` (Mooncake's failure shape: a null task UUID and the code) and
        a log line. Ask for copies when writing instead (``ReplicateConfig.replica_num``)."""
        k = _str_arg(key, "key")
        _keys_arg(targets, "targets")
        log.error("kvpool.mooncake create_copy_task for key %r is not supported: %s", k[:80], _NO_TASKS)
        return (0, 0), _NOT_SUPPORTED

    def create_move_task(self, key: str, source: str,
                         target: str) -> tuple[tuple[int, int], int]:
        """Not supported: ``((0, 0), -1012)`` and a log line."""
        k = _str_arg(key, "key")
        _str_arg(source, "source")
        _str_arg(target, "target")
        log.error("kvpool.mooncake create_move_task for key %r is not supported: %s", k[:80], _NO_TASKS)
        return (0, 0), _NOT_SUPPORTED

    def query_task(self, task_id: tuple[int, int]) -> tuple[Optional[QueryTaskResponse], int]:
        """Not supported: ``(None, -1012)`` and a log line; kvpool creates no copy or move tasks, so there is
        none to ask about. ``task_id`` is checked as the binding does (two unsigned ints, else TypeError)."""
        hi, lo = _task_id_arg(task_id)
        log.error("kvpool.mooncake query_task %d-%d is not supported: kvpool creates no copy or move tasks (%s)",
                  hi, lo, _NO_TASKS)
        return None, _NOT_SUPPORTED


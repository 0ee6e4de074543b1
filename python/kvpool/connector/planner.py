"""The connector's scheduler side: each request's block hashes, the match the last lookup offered,
the loads the engine accepted, and a step's work. The Python twin of Java's
``io.kvpool.connector.Planner``; the contract vectors
(``kvpool-connector/src/test/resources/connector-contract-vectors.json``) hold both to the same rules.

Matches and loads across a reset
--------------------------------
The engine acts on a lookup's answer later: it allocates blocks, then a step runs. A reset or a
weight switch in between makes the answer stale, but the engine already counts those tokens as
coming from the cache; dropping the plan would leave its blocks unfilled and unreported. So
:meth:`Planner.void_all` keeps every pending answer and planned load, marked void: the alloc of a
void match plans void loads, and the step reports void loads as failed without reading anything (the
engine then recomputes or fails by its load failure policy).

Misuse
------
A negative computed count, external tokens the last lookup did not offer, off a block boundary or
past the blocks allocated, are refused (``ValueError`` naming the request). Computed tokens past the
request's are refused by :class:`~kvpool.connector.values.ScheduledRequest` itself.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Optional, Sequence

from .describe import block_infos
from .hashing import BlockHasher
from .keys import KeyFormat
from .values import NO_MATCH, ConnectorMeta, ConnectorRequest, Load, Match, Save, ScheduledRequest

__all__ = ["Planner", "GroupBlocks"]


class GroupBlocks(NamedTuple):
    """A request's blocks in another KV cache group of a hybrid model: its block refs (block ids the worker's
    cache resolves to the group, ``kvpool.connector.groups``) by block index, the group's key format, and the
    ref that stands for a null block (a block the engine does not keep, e.g. outside a sliding window)."""

    refs: Sequence[int]
    keys: KeyFormat
    null: int


class Planner:
    """See the module docstring. Thread-safe (one lock)."""

    def __init__(self, hasher: BlockHasher) -> None:
        self.hasher = hasher
        #: put the saved blocks' tokens and parent hashes in the step's work, for the KV events (describe.py)
        self.describe = False
        self._lock = threading.RLock()
        self._hashes: dict[str, list[bytes]] = {}
        self._matched: dict[str, int] = {}  # request -> tokens computed when the last lookup offered a match
        self._void_matched: dict[str, int] = {}  # the same, for matches offered before a reset
        self._planned: list[Load] = []
        self._voided: list[Load] = []

    def hashes(self, r: ConnectorRequest) -> list[bytes]:
        """The hashes of the request's full blocks, computed once per block as the request grows."""
        with self._lock:
            h = self._hashes.get(r.id)
            full = self.hasher.full_blocks(r.num_tokens)
            if h is None or len(h) < full:
                grown = [] if h is None else list(h)
                parent = grown[-1] if grown else self.hasher.root
                bs = self.hasher.block_size
                for b in range(len(grown), full):
                    parent = self.hasher.next(parent, r.tokens, b * bs, r.extra_keys_for(b))
                    grown.append(parent)
                self._hashes[r.id] = grown
                h = grown
            return h

    def first_block(self, r: ConnectorRequest, computed: int) -> int:
        """The first block a lookup with ``computed`` tokens local asks about (a partly computed block
        is asked whole), or -1 when no full block is left to ask about."""
        if computed < 0:
            raise ValueError(f"request {r.id}: {computed} computed tokens (negative)")
        start = computed // self.hasher.block_size
        return -1 if start >= self.hasher.full_blocks(r.num_tokens) else start

    def answer(self, r: ConnectorRequest, computed: int, start: int, present: int) -> Match:
        """Records a lookup's answer: ``present`` blocks held from block ``start`` on, for a request
        with ``computed`` tokens local. The latest answer is the one the engine acts on."""
        tokens = 0 if start < 0 else (start + present) * self.hasher.block_size - computed
        with self._lock:
            self._void_matched.pop(r.id, None)
            if tokens <= 0:
                self._matched.pop(r.id, None)
                return NO_MATCH
            self._matched[r.id] = computed
        return Match(tokens, False)

    def alloc(self, r: ConnectorRequest, block_ids: Sequence[int], external: int, keys: KeyFormat,
              groups: Sequence[GroupBlocks] = ()) -> None:
        """The engine allocated ``block_ids`` and takes ``external`` tokens: plan their loads. ``groups``: the
        other KV cache groups of a hybrid model, each loaded over the same block indices (but its null blocks,
        which the engine does not keep)."""
        with self._lock:
            computed = self._matched.pop(r.id, None)
            stale = self._void_matched.pop(r.id, None)
            if external <= 0:
                return
            into = self._planned
            if computed is None:
                if stale is None:
                    raise ValueError(f"request {r.id}: {external} external tokens, but the last lookup offered none")
                computed = stale
                into = self._voided  # matched before a reset: the engine counts on these tokens, so they fail
            bs = self.hasher.block_size
            if (computed + external) % bs != 0:
                raise ValueError(f"request {r.id}: {computed} computed plus {external} external "
                                 f"tokens do not end on a block boundary (block size {bs})")
            h = self.hashes(r)
            start = computed // bs  # a partly computed first block is loaded whole: same bytes
            end = (computed + external) // bs
            for ids, fmt, null in ((block_ids, keys, None), *((g.refs, g.keys, g.null) for g in groups)):
                if end > len(h) or end > len(ids):
                    raise ValueError(f"request {r.id}: {external} external tokens after {computed} "
                                     f"need {end} blocks; it has {len(ids)} allocated and {len(h)} full")
                for b in range(start, end):
                    if null is None or int(ids[b]) != null:
                        into.append(Load(r.id, int(ids[b]), b, fmt.key(h[b])))

    def build(self, scheduled: Sequence[ScheduledRequest], keys: KeyFormat, generation: int,
              groups: Optional[dict[str, Sequence[GroupBlocks]]] = None) -> ConnectorMeta:
        """The step's work: the loads planned since the last call, and saves of the blocks that fill in it
        (in every KV cache group ``groups`` gives for the request, but null blocks)."""
        with self._lock:
            bs = self.hasher.block_size
            saves: list[Save] = []
            infos: list[Any] = []
            for s in scheduled:
                first_new = s.computed_before // bs  # a block partly computed before may fill now
                filled = s.computed_after // bs
                if filled <= first_new:
                    continue
                h = self.hashes(s.request)
                tables: list[tuple[Sequence[int], KeyFormat, Optional[int]]] = [(s.block_ids, keys, None)]
                tables += [(g.refs, g.keys, g.null) for g in (groups or {}).get(s.request.id, ())]
                for ids, fmt, null in tables:
                    for b in range(first_new, min(filled, len(ids))):
                        if null is None or int(ids[b]) != null:
                            saves.append(Save(s.request.id, int(ids[b]), b, fmt.key(h[b])))
                if self.describe:  # the attention blocks only: routers know no other group
                    infos += block_infos(s.request, h, keys, range(first_new, min(filled, len(s.block_ids))), bs)
            meta = ConnectorMeta(list(self._planned), saves, generation, list(self._voided), infos,
                                 sum(s.computed_after - s.computed_before for s in scheduled))
            self._planned.clear()
            self._voided.clear()
            return meta

    def void_all(self) -> None:
        """A reset or weight switch: every pending match and planned load becomes void."""
        with self._lock:
            self._voided.extend(self._planned)
            self._planned.clear()
            self._void_matched.update(self._matched)
            self._matched.clear()

    def forget(self, request_id: str) -> None:
        """Forgets a finished request's hashes and match."""
        with self._lock:
            self._hashes.pop(request_id, None)
            self._matched.pop(request_id, None)
            self._void_matched.pop(request_id, None)

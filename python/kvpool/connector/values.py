"""The values the connector's two sides exchange with the engine and with each other: requests as
the connector sees them, a step's work (:class:`ConnectorMeta`), lookups' answers, reset results and
counters. The Java twins are the records of ``io.kvpool.connector``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence

from .hashing import extra_keys_for

__all__ = [
    "ConnectorRequest", "ScheduledRequest", "Match", "NO_MATCH", "Load", "Save", "ConnectorMeta", "EMPTY_META",
    "ResetResult", "ConnectorStats", "COUNTERS",
]


@dataclass(frozen=True)
class ConnectorRequest:
    """A request as the connector sees it: its id, its tokens so far (prompt, then generated ones;
    only the first ``num_tokens`` count, default all), the extra keys that make its KV differ for the
    same tokens (a LoRA name, ...; ``None`` for none) and its cache salt (vLLM's ``cache_salt``,
    joined to the extra keys of block 0 only). ``tokens`` may be any sequence of ints (a list, a
    tuple, vLLM's ``ConstantList``, a numpy array)."""

    id: str
    tokens: Sequence[int]
    num_tokens: int = -1
    extra_keys: Optional[Sequence[Any]] = None
    cache_salt: Optional[str] = None

    def __post_init__(self) -> None:
        if self.id is None:
            raise ValueError("request id must not be None")
        if self.num_tokens == -1:
            object.__setattr__(self, "num_tokens", len(self.tokens))
        if not 0 <= self.num_tokens <= len(self.tokens):
            raise ValueError(f"request {self.id}: num_tokens {self.num_tokens} outside 0..{len(self.tokens)}")
        if self.cache_salt is not None and self.cache_salt == "":
            raise ValueError(f"request {self.id}: cache_salt must not be empty (None for none)")

    def extra_keys_for(self, block: int) -> Optional[list]:
        """The extra keys hashed with block ``block`` (the salt on block 0 only), or ``None``."""
        return extra_keys_for(self.extra_keys, self.cache_salt, block)


@dataclass(frozen=True)
class ScheduledRequest:
    """A request run this step: its block table (block i holds tokens ``[i*bs, (i+1)*bs)``) and the
    tokens whose KV exists before and after the step. Blocks that become full are saved. Computed
    tokens past the request's (``computed_after > request.num_tokens``) are refused: they have no
    token ids to hash, so no key."""

    request: ConnectorRequest
    block_ids: Sequence[int]
    computed_before: int
    computed_after: int

    def __post_init__(self) -> None:
        if self.computed_before < 0 or self.computed_after < self.computed_before:
            raise ValueError(f"request {self.request.id}: computed tokens go from {self.computed_before} "
                             f"to {self.computed_after}")
        if self.computed_after > self.request.num_tokens:
            raise ValueError(f"request {self.request.id}: {self.computed_after} tokens computed but only "
                             f"{self.request.num_tokens} known")


class Match(NamedTuple):
    """Tokens past those already computed that the pool can supply (whole blocks), and whether they
    load asynchronously across steps (never, for kvpool: loads complete within the step)."""

    tokens: int
    load_async: bool = False


NO_MATCH = Match(0, False)


class Load(NamedTuple):
    """Fill block ``block_id`` (request ``request_id``'s block number ``block_index``) from ``key``."""

    request_id: str
    block_id: int
    block_index: int
    key: str


class Save(NamedTuple):
    """Save block ``block_id`` (request ``request_id``'s block number ``block_index``) as ``key``."""

    request_id: str
    block_id: int
    block_index: int
    key: str


@dataclass
class ConnectorMeta:
    """One step's transfer work, built by the scheduler side and carried out by the worker side.
    ``generation`` is the cache generation the step was planned in: work planned before a reset is
    never carried out after it. ``void_loads`` were planned before a reset that came before this
    step was built: the worker reports their blocks as failed loads without reading anything.
    Picklable (vLLM ships it to worker processes)."""

    loads: list[Load] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)
    generation: int = 0
    void_loads: list[Load] = field(default_factory=list)
    #: what the engine knows of the saved blocks, for the master's KV events (``kvpool.BlockInfo``; see
    #: :mod:`kvpool.connector.describe`); empty unless the planner describes them
    infos: list[Any] = field(default_factory=list)
    #: tokens the step computes (its requests' ``computed_after - computed_before``): the prefill rate's measure
    step_tokens: int = 0

    def is_empty(self) -> bool:
        return not self.loads and not self.saves and not self.void_loads

    def saves_not_over_failed_loads(self, failed_block_ids: "set[int] | frozenset[int]") -> list[Save]:
        """The saves whose blocks were not computed over a failed load: a block's KV depends on every
        block before it, so once a request's load of block i failed (``failed_block_ids``, of this
        step's loads and void loads), its blocks after i computed in this step are wrong and must not
        be stored under the keys of the right tokens."""
        first_failed: dict[str, int] = {}
        for l in (*self.loads, *self.void_loads):
            if l.block_id in failed_block_ids:
                first_failed[l.request_id] = min(l.block_index, first_failed.get(l.request_id, l.block_index))
        if not first_failed:
            return self.saves
        return [s for s in self.saves if s.block_index < first_failed.get(s.request_id, s.block_index + 1)]


EMPTY_META = ConnectorMeta()


def check_settings(client: Any, hasher: Any, keys: Any, reset_scope: str, max_queued_saves: int, granularity: str,
                   async_loads: bool, layer_read_bytes: int = 0) -> None:
    """``PoolConnector``'s arguments, checked: a ValueError naming the first bad one."""
    if client is None or hasher is None or keys is None:
        raise ValueError("client, hasher and keys are required")
    if granularity not in ("block", "layer"):
        raise ValueError(f"granularity must be 'block' or 'layer', got {granularity!r}")
    if async_loads and granularity != "block":
        raise ValueError("async_loads moves whole blocks: it cannot be combined with granularity 'layer'")
    if reset_scope not in ("all", "model"):
        raise ValueError(f"reset_scope must be 'all' or 'model', got {reset_scope!r}")
    if max_queued_saves < 1:
        raise ValueError(f"max_queued_saves must be at least 1, got {max_queued_saves}")
    if not isinstance(layer_read_bytes, int) or layer_read_bytes < 0:
        raise ValueError(f"layer_read_bytes must be an int of at least 0, got {layer_read_bytes!r}")


@dataclass(frozen=True)
class ResetResult:
    """Whether the pool is now empty of everything saved before, how many objects were removed, and
    why not if it failed."""

    success: bool
    removed: int = 0
    message: str = ""


@dataclass(frozen=True)
class ConnectorStats:
    """A snapshot of a connector's counters (they only grow). ``dropped_saves`` counts saves planned
    but never stored (a reset or weight switch in between, a full save queue, a fenced or failed put,
    blocks computed over a failed load); ``queue_full_drops`` and ``fenced_saves`` are the parts of it
    that a full queue and the pool's fence caused. ``skipped_saves``: the pool already held the
    block, was full, or was left alone after a missed deadline. ``abandoned_loads``: block loads past their
    deadline; ``skipped_lookups``: lookups answered as misses while the pool was left alone."""

    lookups: int = 0
    matched_tokens: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    failed_loads: int = 0
    saved_blocks: int = 0
    saved_bytes: int = 0
    skipped_saves: int = 0
    dropped_saves: int = 0
    resets: int = 0
    queue_full_drops: int = 0
    fenced_saves: int = 0
    abandoned_loads: int = 0
    skipped_lookups: int = 0


COUNTERS = tuple(ConnectorStats.__dataclass_fields__)

"""Hybrid models in ``kvpool.vllm``: several KV cache groups under vLLM's hybrid allocator.

vLLM gives a connector that declares ``SupportsHMA`` one block table per KV cache group. This module reads the
groups from the ``KVCacheConfig`` (on both the scheduler and the worker side) and turns vLLM's per-group block
ids into what :class:`~kvpool.connector.PoolConnector` plans with (``kvpool.connector.groups``):

* the *primary* group is the first transferable full-attention group: its blocks keep the plain keys (shared
  with engines of one group: vLLM on CPU, the Java reference engine) and its lookup is the one
  ``prefix_match``; the other groups are numbered 1, 2, ... in vLLM's order, keyed ``g{n}-{kind}/``;
* a hit is offered only where every group holds what it needs: full attention every block, a sliding window
  the ``cdiv(window - 1, block_size) + 1`` blocks before the hit's end (vLLM's own rule,
  ``SlidingWindowManager``, plus one block vLLM may keep beside them);
* Mamba / linear-attention state (``MambaSpec``) in vLLM's ``align`` cache mode: the block table is indexed by
  position and block ``i``, where vLLM keeps it, holds the state after token ``(i + 1) * block_size`` (the
  state a chunk ends on, and the prefill checkpoint vLLM exports one block before it; the blocks between are
  null). So a state is saved as the block it is in fills, keyed by that block's chained hash (the state is a
  function of the whole prefix, as the hash is), and a hit ending at block ``e`` needs exactly group block
  ``e - 1``: a window of one. vLLM allocates that block for the load (its table for a hit is nulls and one
  block) and carries the state on from it;
* loads are asynchronous (vLLM's ``WAITING_FOR_REMOTE_KVS``): with several groups a block id does not name a
  block, so vLLM takes load failures per request (``failed_recving``), never per block.

Refused at construction, with a message naming the group: Mamba state in another cache mode (``none`` keeps
one running state a request, nothing a later prompt can start from) or with speculative blocks (they move
inside the table), groups whose block size differs from the engine's, and layer-by-layer moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .connector.groups import GroupRule, group_keys, ref
from .connector.keys import KeyFormat
from .connector.planner import GroupBlocks

__all__ = ["Hybrid", "read_hybrid", "NULL_BLOCK_ID"]

#: vLLM's null block (``vllm.v1.attention.backends.utils.NULL_BLOCK_ID``): a block the engine does not keep.
NULL_BLOCK_ID = 0


def _kind(spec: Any) -> str:
    name = type(spec).__name__
    if hasattr(spec, "shapes") and hasattr(spec, "dtypes"):
        return "mamba"
    if "SlidingWindow" in name:
        return "swa"
    if "ChunkedLocal" in name:
        return "chunked"
    if "MLA" in name:
        return "mla"
    return "full"


@dataclass(frozen=True)
class Hybrid:
    """The transferable groups of a hybrid model: ``order[n]`` is vLLM's index of our group ``n`` (0: the
    primary), ``rules[n]`` what it needs of a hit."""

    order: tuple[int, ...]
    rules: tuple[GroupRule, ...]

    def split(self, tables: Sequence[Sequence[int]], keys: KeyFormat) -> tuple[list[int], list[GroupBlocks]]:
        """vLLM's per-group block ids (indexed by vLLM's group index) as the primary group's ids and the other
        groups' refs."""
        primary = [int(b) for b in tables[self.order[0]]]
        others = [GroupBlocks([ref(n, int(b)) for b in tables[v]], group_keys(keys, n, self.rules[n].kind),
                              ref(n, NULL_BLOCK_ID))
                  for n, v in enumerate(self.order) if n > 0]
        return primary, others


def _check_state(spec: Any, what: str) -> None:
    """Raises ValueError unless ``spec`` (a ``MambaSpec``) keeps a state per block boundary kvpool can move."""
    mode = getattr(spec, "mamba_cache_mode", "none")
    if mode != "align":
        raise ValueError(f"kvpool connector: {what} holds Mamba / linear-attention state in cache mode {mode!r}; "
                         "kvpool moves the per-block states of mode 'align' (start vLLM with "
                         "--mamba-cache-mode align)")
    if int(getattr(spec, "num_speculative_blocks", 0) or 0) > 0:
        raise ValueError(f"kvpool connector: {what} holds Mamba state with {spec.num_speculative_blocks} "
                         "speculative blocks, which vLLM moves inside the block table; kvpool does not move "
                         "those (turn speculative decoding off for this model)")


def read_hybrid(kv_cache_config: Any, block_size: int, layerwise: bool) -> Optional[Hybrid]:
    """The hybrid groups of ``kv_cache_config``, or None for a model of one transferable group (or no config).
    Raises ValueError naming a group kvpool cannot move."""
    if kv_cache_config is None:
        return None
    groups = [(i, g) for i, g in enumerate(getattr(kv_cache_config, "kv_cache_groups", ()) or ())
              if getattr(g, "enable_kv_transfer", True) is not False]
    if len(groups) <= 1:
        if groups and _kind(groups[0][1].kv_cache_spec) == "mamba":
            raise ValueError("kvpool connector: this model keeps only Mamba / linear-attention state (KV cache "
                             "group 0); kvpool moves state beside a full-attention group, whose blocks name the hits")
        return None
    kinds = {i: _kind(g.kv_cache_spec) for i, g in groups}
    for i, g in groups:
        what = f"KV cache group {i} ({type(g.kv_cache_spec).__name__}, {len(g.layer_names)} layers)"
        if kinds[i] == "mamba":
            _check_state(g.kv_cache_spec, what)
        if int(g.kv_cache_spec.block_size) != block_size:
            raise ValueError(f"kvpool connector: {what} holds {g.kv_cache_spec.block_size} tokens a block; the "
                             f"engine's block size is {block_size} (kvpool needs one block size for every group)")
    if layerwise:
        raise ValueError("kvpool connector: layerwise moves one KV cache group; this model has "
                         f"{len(groups)} (set layerwise false)")
    primary = next((i for i, _ in groups if kinds[i] in ("full", "mla")), None)
    if primary is None:
        raise ValueError("kvpool connector: no full-attention KV cache group among "
                         + ", ".join(f"{i}: {kinds[i]}" for i, _ in groups))
    order = (primary,) + tuple(i for i, _ in groups if i != primary)
    rules = []
    for n, v in enumerate(order):
        spec = dict(groups)[v].kv_cache_spec
        window = getattr(spec, "sliding_window", None) if kinds[v] == "swa" else None
        blocks = None if window is None else -(-(int(window) - 1) // block_size) + 1
        if kinds[v] == "mamba":
            blocks = 1  # the state at the hit's end, in the block before it
        rules.append(GroupRule(n, kinds[v], blocks))
    return Hybrid(order, tuple(rules))

"""Telling the pool what the engine knows of the blocks it saves, for routers (BLOCK_INFO, docs/operations.md "KV
events for routers"): the scheduler side, which has the tokens, puts a :class:`~kvpool.BlockInfo` per saved block in
the step's :class:`~kvpool.connector.values.ConnectorMeta` (``Planner.describe``), and the worker side sends them on
its save thread just ahead of the step's puts, so the master's ``BlockStored`` for those keys carries the tokens,
the block size and the parent hash. Off by default (one master round trip per step with saves); the vLLM connector
turns it on with ``kv_events_info``."""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from ..block_info import BlockInfo, router_block_hash
from .keys import KeyFormat
from .values import ConnectorRequest

log = logging.getLogger("kvpool.connector")

__all__ = ["DescribeBlocks", "block_infos"]


def block_infos(request: ConnectorRequest, hashes: Sequence[bytes], keys: KeyFormat, blocks: range,
                block_size: int) -> list[BlockInfo]:
    """The infos of ``request``'s full blocks ``blocks`` (indexes), keyed as ``keys`` names them: each block's tokens,
    its parent's hash as routers are told it, and the request's cache salt on block 0 (where vLLM's hash has it)."""
    out = []
    for b in blocks:
        parent: Optional[int] = router_block_hash(keys.key(hashes[b - 1])) if b > 0 else None
        tokens = [int(t) for t in request.tokens[b * block_size:(b + 1) * block_size]]
        out.append(BlockInfo(keys.key(hashes[b]), tokens, block_size, parent_block_hash=parent,
                             cache_salt=request.cache_salt if b == 0 else None))
    return out


class DescribeBlocks:
    """A save-thread job: BLOCK_INFO for a step's blocks, ahead of their puts (the save queue keeps the order)."""

    def __init__(self, infos: Sequence[BlockInfo]) -> None:
        self.infos = list(infos)

    def run(self, store: Any, fence: Any, outcomes: Any) -> None:
        """Sends the infos; a failure costs only the routers' view of these blocks' tokens, never the saves."""
        try:
            store.describe_blocks(self.infos)
        except Exception as e:  # noqa: BLE001 - logged, never raised into the engine
            log.warning("kvpool: telling the master about %d blocks failed: %s", len(self.infos), e)

"""What a router asks of the pool about a prompt (TIER_LOOKUP, docs/protocol.md section 4.38): of its block keys, in
order, how many leading ones the pool holds (the prefix an engine would load), and how many of those sit in memory
and how many on the SSD tier only. The Java client's ``io.kvpool.protocol.TierCounts`` is the same, and the master
answers it over HTTP too (``POST /api/tiers``, docs/operations.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TierCounts", "ABSENT", "MEMORY", "STORAGE"]

#: A key the pool does not hold.
ABSENT = 0
#: A key with a copy in memory.
MEMORY = 1
#: A key whose copies are all on the SSD tier.
STORAGE = 2


@dataclass(frozen=True)
class TierCounts:
    """``keys`` asked about; ``prefix_blocks`` leading ones present in some tier, of which ``memory_blocks`` have a
    copy in memory and ``storage_blocks`` are on the SSD tier only."""

    keys: int
    prefix_blocks: int
    memory_blocks: int
    storage_blocks: int

    @staticmethod
    def of(codes: bytes) -> "TierCounts":
        """The counts of per-key codes (:data:`ABSENT`, :data:`MEMORY`, :data:`STORAGE`), in the keys' order."""
        prefix = memory = 0
        while prefix < len(codes) and codes[prefix] != ABSENT:
            memory += codes[prefix] == MEMORY
            prefix += 1
        return TierCounts(len(codes), prefix, memory, prefix - memory)

    def tokens(self, block_size: int) -> dict[str, int]:
        """Token counts for blocks of ``block_size`` tokens, as the master's HTTP answer spells them."""
        return {"prefix": self.prefix_blocks * block_size, "CPU": self.memory_blocks * block_size,
                "STORAGE": self.storage_blocks * block_size}

    def to_json(self, block_size: int) -> dict[str, Any]:
        """The master's HTTP answer (``POST /api/tiers?block_size=...``) for the same keys."""
        return {"keys": self.keys, "block_size": block_size, "prefix_blocks": self.prefix_blocks,
                "memory_blocks": self.memory_blocks, "storage_blocks": self.storage_blocks,
                "tokens": self.tokens(block_size)}

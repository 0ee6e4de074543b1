"""What the Dynamo peer tests share: the pool's model and block size, prompts as the pool's connector keys and
Dynamo's hashes spell them, and ``Dynamo``, one test's pool client and indexer with what a test asks of both.
Blocks go into the pool the way a connector saves them: ``Client.describe_blocks`` with each block's tokens,
block size, parent hash and LoRA, then the puts under connector keys (``KeyFormat``), so that the master's
``BlockStored`` events carry the tokens Dynamo hashes.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from dynamo.llm import compute_block_hash_for_seq

import kvpool
from kvpool.connector.hashing import BlockHasher
from kvpool.connector.keys import KeyFormat

from dynamo_indexer import DEADLINE, DynamoIndexer, Match, tiers, until

MODEL = "tiny-llama"
BLOCK = 16
#: The pool's worker id in Dynamo (any id a deployment gives it).
WORKER = 4242
KEYS = KeyFormat(MODEL, "v1", "bf16")
HASHER = BlockHasher(BLOCK, seed="0")


@dataclass(frozen=True)
class Prompt:
    """A prompt of whole blocks: its tokens, its blocks' pool keys and the hashes the pool's events carry."""

    tokens: tuple[int, ...]
    keys: tuple[str, ...]
    hashes: tuple[int, ...]
    lora_name: Optional[str] = None

    @staticmethod
    def of(tokens: Sequence[int], lora_name: Optional[str] = None) -> "Prompt":
        assert len(tokens) % BLOCK == 0
        # the connector keys of another adapter differ (its name is an extra key of every block, as in vLLM)
        raw = HASHER.hashes(list(tokens), extra_keys=None if lora_name is None else [lora_name])
        keys = tuple(KEYS.key(h) for h in raw)
        return Prompt(tuple(tokens), keys, tuple(kvpool.router_block_hash(k) for k in keys), lora_name)

    @property
    def blocks(self) -> int:
        return len(self.keys)

    def infos(self) -> list[Any]:
        """Each block as a connector describes it before saving it."""
        return [kvpool.BlockInfo(key=k, token_ids=list(self.tokens[i * BLOCK:(i + 1) * BLOCK]), block_size=BLOCK,
                                 parent_block_hash=self.hashes[i - 1] if i else None, lora_name=self.lora_name)
                for i, k in enumerate(self.keys)]

    def local_hashes(self) -> list[int]:
        """Dynamo's own hashes of the prompt's blocks (what its query recomputes from the tokens)."""
        return list(compute_block_hash_for_seq(list(self.tokens), BLOCK, lora_name=self.lora_name))


_token_bases = itertools.count(1_000_000, 100_000)


def prompt(blocks: int, lora_name: Optional[str] = None) -> Prompt:
    """A prompt no other in the session shares a block with."""
    base = next(_token_bases)
    return Prompt.of(range(base, base + blocks * BLOCK), lora_name)


class Dynamo:
    """One test's view: the pool's client and Dynamo's indexer, with what a test asks of both."""

    def __init__(self, client: kvpool.Client, ix: DynamoIndexer) -> None:
        self.client = client
        self.ix = ix

    def store(self, p: Prompt, value: int | Sequence[int] = 4096, *, batch: bool = True,
              order: Optional[Sequence[int]] = None) -> None:
        """Describes ``p``'s blocks (tokens, parents), then puts them (``value`` bytes each, or per block): in one
        batch (the master then says one BlockStored for the chain) or one put each, in ``order`` (block indexes;
        default all, in order)."""
        assert self.client.describe_blocks(p.infos()) == p.blocks, "the master kept every block's info"
        sizes = [value] * p.blocks if isinstance(value, int) else list(value)
        idx = list(range(p.blocks)) if order is None else list(order)
        values = {i: bytes([i % 251]) * sizes[i] for i in idx}
        if batch:
            statuses = self.client.put_batch([p.keys[i] for i in idx], [values[i] for i in idx])
        else:
            statuses = [self.client.put(p.keys[i], values[i]) for i in idx]
        assert statuses == [kvpool.PutStatus.OK] * len(idx), statuses

    def match(self, p: Prompt | Sequence[int], lora_name: Optional[str] = None) -> Match:
        tokens = p.tokens if isinstance(p, Prompt) else p
        lora = p.lora_name if isinstance(p, Prompt) and lora_name is None else lora_name
        return Match.of(self.ix.query(MODEL, tokens, lora), WORKER, BLOCK)

    def tiers(self) -> dict[str, dict[int, Optional[int]]]:
        return tiers(self.ix.dump(MODEL), WORKER)

    def until(self, what: str, p: Prompt | Sequence[int], expected: Match) -> None:
        """Waits until Dynamo answers ``expected`` for ``p``, then checks it still does after a fresh probe went
        through the stream (so that no event still on its way changes the answer)."""
        until(what, lambda: self.match(p) == expected, lambda: f"got {self.match(p)}; {self.tiers()}")
        self.settle()
        assert self.match(p) == expected, f"{what}: the answer changed once the stream settled"

    def settle(self) -> None:
        """Stores a probe block, waits until Dynamo has it, removes it and waits until it is gone: every event the
        pool said before has then been taken in (one ordered stream). A probe said before the indexer's
        subscription was through (ZMQ's slow joiner) is never heard: then another probe, until one is."""
        deadline = time.monotonic() + DEADLINE
        while True:
            probe = prompt(1)
            self.store(probe, 64)
            heard = time.monotonic() + 2.0
            while self.match(probe).host != 1 and time.monotonic() < heard:
                time.sleep(0.05)
            if self.match(probe).host == 1:
                break
            assert self.client.remove(probe.keys[0])
            assert time.monotonic() < deadline, f"Dynamo never indexed a probe block: {self.ix.tail()}"
        assert self.client.remove(probe.keys[0])
        until("Dynamo forgets the probe block", lambda: self.match(probe) == Match(),
              lambda: f"{self.match(probe)} {self.tiers()}")

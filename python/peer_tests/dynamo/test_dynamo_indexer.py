"""Dynamo's KV indexer fed the pool's KV events: a real kvpool pool (master and node by PID) publishes, and Dynamo's
standalone indexer (``python -m dynamo.indexer``, ai-dynamo-runtime 1.6.1) subscribes to its PUB socket as to a
vLLM engine's, with nothing between them: no event is made, decoded or converted by the test. Blocks are described
(``Client.describe_blocks``: tokens, block size, parent hash, LoRA) and put under connector keys; the test then asks
Dynamo to score prompts by their tokens (``POST /query``), and reads its index (``GET /dump``).

What Dynamo does with the media (dynamo_indexer.py): CPU goes to its host-pinned tier, STORAGE to its disk tier,
one index each; its device overlap score (``scores``, what its router weighs as cached on the GPU) stays 0 for the
pool's blocks, and its tiered walk (device, then host, then disk) credits them.

Waits poll with generous deadlines; nothing depends on how long anything takes.
"""

from __future__ import annotations

import kvpool
from dynamo_indexer import Match, until
from dynamo_pool import BLOCK, MODEL, WORKER, Dynamo, prompt

HOST = "host_pinned"
DISK = "disk"


def in_memory(blocks: int) -> Match:
    """Dynamo's answer for ``blocks`` leading blocks of a prompt, all in the pool's memory."""
    return Match(device=0, gpu=0, host=blocks, disk=blocks, longest=blocks)


def test_a_prompt_in_memory_scores_its_blocks_in_dynamos_host_tier(dynamo: Dynamo) -> None:
    p = prompt(4)
    dynamo.store(p)
    dynamo.until("Dynamo scores the prompt's 4 blocks", p, in_memory(4))

    # Dynamo hashed the tokens the pool's events carried: its index holds the pool's block hashes, each with
    # Dynamo's own hash of that block's tokens, in the host tier only
    assert dynamo.tiers() == {HOST: dict(zip(p.hashes, p.local_hashes()))}
    # and it matches on its own hashes, never on the pool's
    assert Match.of(dynamo.ix.query_by_hash(MODEL, p.local_hashes()), WORKER, BLOCK) == in_memory(4)
    assert Match.of(dynamo.ix.query_by_hash(MODEL, list(p.hashes)), WORKER, BLOCK) == Match()

    other = prompt(4)
    assert dynamo.match(other) == Match(), "a prompt the pool does not hold scores 0"
    shared = p.tokens[:2 * BLOCK] + other.tokens[2 * BLOCK:]
    assert dynamo.match(shared) == in_memory(2), "a prompt sharing 2 blocks scores those 2"
    assert dynamo.match(other.tokens[:BLOCK] + p.tokens[BLOCK:]) == Match(), "the same tokens after another block"
    assert dynamo.match(p.tokens + other.tokens[:BLOCK]) == in_memory(4), "a longer prompt scores the 4 held"
    assert dynamo.match(p.tokens[:3 * BLOCK - 5]) == in_memory(2), "only whole blocks are scored"


def test_blocks_put_one_at_a_time_and_out_of_order_form_the_prompt(dynamo: Dynamo) -> None:
    p = prompt(5)
    dynamo.store(p, batch=False, order=[3, 1, 4, 0, 2])
    dynamo.until("Dynamo scores the 5 blocks put one at a time", p, in_memory(5))
    assert set(dynamo.tiers()[HOST]) == set(p.hashes)


def test_removed_blocks_score_less_and_remove_all_scores_0(dynamo: Dynamo) -> None:
    p, q = prompt(4), prompt(3)
    dynamo.store(p)
    dynamo.store(q, batch=False)
    dynamo.until("Dynamo scores p", p, in_memory(4))
    dynamo.until("Dynamo scores q", q, in_memory(3))

    assert dynamo.client.remove(p.keys[3])
    dynamo.until("the last block removed: 3", p, in_memory(3))
    assert dynamo.client.remove(p.keys[1])
    dynamo.until("the second block removed: only the first is a prefix", p, in_memory(1))
    assert set(dynamo.tiers()[HOST]) == {p.hashes[0], p.hashes[2]} | set(q.hashes)
    assert dynamo.client.remove(p.keys[0])
    dynamo.until("the first block removed: 0", p, Match())
    assert dynamo.match(q) == in_memory(3), "another prompt's blocks are untouched"

    assert dynamo.client.remove_all() >= 4
    dynamo.until("AllBlocksCleared: q scores 0", q, Match())
    assert dynamo.tiers() == {}, "AllBlocksCleared empties Dynamo's index of the pool"

    dynamo.store(p)
    dynamo.until("the prompt stored again after the reset", p, in_memory(4))


def test_a_lora_adapters_blocks_score_only_for_that_adapter(dynamo: Dynamo) -> None:
    p = prompt(3, lora_name="adapter-a")
    dynamo.store(p)
    dynamo.until("Dynamo scores the adapter's prompt", p, in_memory(3))
    assert dynamo.match(p.tokens, lora_name="adapter-b") == Match(), "another adapter"
    assert dynamo.match(list(p.tokens)) == Match(), "the base model"


def test_spilled_blocks_score_in_dynamos_disk_tier_after_the_blocks_in_memory(dynamo: Dynamo) -> None:
    # 60 blocks of 256 KiB (15 MiB) overflow the 8 MiB segment: the least recently used spill to the SSD tier.
    # Blocks 4..63 go first, then blocks 0..3 (4 KiB each), so the prompt's head is the most recent.
    n, head = 64, 4
    p = prompt(n)
    sizes = [4096] * head + [256 << 10] * (n - head)
    dynamo.store(p, sizes, batch=False, order=list(range(head, n)) + list(range(head)))

    def media() -> list[str]:
        """Where the pool holds each block now (TIER_LOOKUP per key, not a read): CPU, STORAGE or absent."""
        out = []
        for key in p.keys:
            t = dynamo.client.tier_lookup([key])
            out.append("CPU" if t.memory_blocks else "STORAGE" if t.storage_blocks else "absent")
        return out

    def dynamo_media() -> list[str]:
        tiers = dynamo.tiers()
        names = {HOST: "CPU", DISK: "STORAGE"}
        assert set(tiers) <= set(names), tiers
        where = {h: names[t] for t, blocks in tiers.items() for h in blocks}
        assert sum(len(b) for b in tiers.values()) == len(where), f"a block in two tiers at once: {tiers}"
        return [where.get(h, "absent") for h in p.hashes]

    def settled() -> bool:
        """Every block in the pool again (a spilling one is a miss until it is on disk), some on SSD, Dynamo's
        tiers saying the same block by block, and still so once a probe went through the stream. Only puts evict
        in this pool (conftest.py), so once the last spill is on disk the media stay put."""
        m = media()
        if "absent" in m or "STORAGE" not in m or dynamo_media() != m:
            return False
        dynamo.settle()
        return media() == m and dynamo_media() == m

    until("the pool's media stay put and Dynamo's tiers say the same", settled,
          lambda: f"pool {media()}; Dynamo {dynamo_media()}")
    m = media()
    assert m[:head] == ["CPU"] * head and m[head] == "STORAGE", f"the head stays in memory, the oldest spill: {m}"

    # Dynamo hashed the spilled blocks' tokens too (the STORAGE events carried them)
    local = dict(zip(p.hashes, p.local_hashes()))
    for tier, blocks in dynamo.tiers().items():
        assert blocks == {h: local[h] for h in blocks}, f"{tier}: Dynamo's hashes of the tokens"

    # the walk: the head in the host tier, then the run of spilled blocks that continues it in the disk tier
    on_disk = next((i for i in range(head, n) if m[i] != "STORAGE"), n) - head
    assert on_disk >= 2, f"at least blocks {head} and {head + 1} spilled: {m}"
    expected = Match(device=0, gpu=0, host=head, disk=head + on_disk, longest=head + on_disk)
    assert dynamo.match(p) == expected, f"pool media {m}"

    # a spilled block removed: the disk continuation ends before it
    assert dynamo.client.remove(p.keys[head + 1])
    dynamo.until("a spilled block removed", p, Match(device=0, gpu=0, host=head, disk=head + 1, longest=head + 1))

    # a prompt whose first block spilled: nothing in the host tier, Dynamo's disk walk starts at the root
    q = prompt(3)
    dynamo.store(q, 256 << 10, batch=False)
    for i in range(0, 40):  # push q out of memory: 40 more 256 KiB objects (10 MiB) put after it
        assert dynamo.client.put(f"filler/{i}", b"f" * (256 << 10)) == kvpool.PutStatus.OK
    until("q's blocks spilled, and Dynamo sees them on disk",
          lambda: all(dynamo.client.tier_lookup([k]).storage_blocks for k in q.keys)
          and dynamo.match(q) == Match(device=0, gpu=0, host=0, disk=3, longest=3),
          lambda: f"{[dynamo.client.tier_lookup([k]) for k in q.keys]}; {dynamo.match(q)}")

    assert dynamo.client.remove_all(force=True) > 0
    dynamo.until("AllBlocksCleared empties the disk tier too", p, Match())
    assert dynamo.match(q) == Match() and dynamo.tiers() == {}

"""llm-d's KV-cache indexer fed the KV events of real kvpool pools: what llm-d's router would score for a prompt.

llm-d never reads the pool's block hashes as its own keys: for each BlockStored it recomputes its keys from the
event's token ids (FNV-64a over CBOR, chained from its seed and the model of the topic; the parent's key found
through the parent's block hash, which it mapped when that block was stored) and maps the pool's hashes to them;
BlockRemoved finds its keys through that map; AllBlocksCleared drops every entry of the pod. A score is llm-d's
longest-prefix score of a prompt's token ids: per leading block held, the weight of the best medium holding it
(llm-d's defaults: cpu 0.8, gpu 1.0, and 1.0 for a medium it has no weight for, such as STORAGE).

Every event here is the pools' own (puts, removals, eviction, the SSD tier, remove_all through kvpool's client);
the harness is llm-d's code (conftest.py, peers/llm-d/harness/main.go).
"""

from __future__ import annotations

from typing import Any

import kvpool

from llmd_support import BLOCK, CPU_WEIGHT, STORAGE_WEIGHT, Fleet, Prompt, close, prompt, store, until

SPILL_VALUE = 256 << 10  # 64 of them overflow the 8 MiB segment
WEIGHT = {"CPU": CPU_WEIGHT, "STORAGE": STORAGE_WEIGHT}


def leading_score(tiers: list[str]) -> float:
    """What llm-d should score for blocks in ``tiers`` (in order): the weights of the leading blocks held."""
    total = 0.0
    for t in tiers:
        if not t:
            break
        total += WEIGHT[t]
    return total


def test_without_tokens_llm_d_indexes_nothing(llmd: Fleet) -> None:
    """A put whose tokens the master was not told (no describe_blocks) is a BlockStored with no token ids: llm-d
    hears it and cannot key it, so the pool is not scored for that prompt."""
    p = prompt(100, 3)
    before = llmd.llmd.stats()["events"].get("BlockStored", 0)
    with llmd.ssd.client() as c:
        store(c, p, describe=False)
    until("llm-d parsed the stores", lambda: (llmd.llmd.stats()["events"].get("BlockStored", 0) > before, None))
    # llm-d applies one pod's messages in order (one queue a pod): once the described block below is scored, the
    # stores above were applied, so the empty score after it is final
    described = prompt(100_000, 1)
    with llmd.ssd.client() as c:
        store(c, described)
    llmd.settle(llmd.ssd, described, CPU_WEIGHT)
    assert llmd.llmd.score(p) == {}


def test_llm_d_scores_the_pools_blocks_from_their_tokens(llmd: Fleet) -> None:
    a = prompt(1000, 4, extra_tokens=5)  # 4 full blocks and 5 tokens llm-d does not key (no partial blocks)
    with llmd.ssd.client() as c:
        store(c, a)
    scores = llmd.settle(llmd.ssd, a, 4 * CPU_WEIGHT)
    assert set(scores) == {llmd.ssd.pod}, "only the pool that holds the blocks scores"

    other = prompt(50_000, 4)
    assert llmd.llmd.score(other) == {}, "a prompt the pool does not hold scores 0"
    shared = Prompt(a.tokens[:2 * BLOCK] + other.tokens[2 * BLOCK:])
    assert close(llmd.llmd.score(shared)[llmd.ssd.pod], 2 * CPU_WEIGHT), "a shared prefix of 2 blocks scores 2 blocks"
    assert llmd.llmd.score(a.tokens[:3 * BLOCK + 7]) == {llmd.ssd.pod: 3 * CPU_WEIGHT}
    assert llmd.llmd.score(a.tokens[:BLOCK - 1]) == {}, "fewer tokens than a block: no key"
    # llm-d's keys are chained from the model the topic names: the same tokens under another model are not held
    assert llmd.llmd.score(a, model="another-model") == {}
    # a different first block breaks the chain: later blocks of the same tokens do not count
    assert llmd.llmd.score(Prompt(other.tokens[:BLOCK] + a.tokens[BLOCK:])) == {}

    # blocks saved later extend the chain: llm-d resolves their parent_block_hash to its key for the parent
    longer = prompt(1000, 6)
    with llmd.ssd.client() as c:
        store(c, longer, start=4)
    llmd.settle(llmd.ssd, longer, 6 * CPU_WEIGHT)

    # the other pool holding the first 2 blocks is a second pod, scored on its own
    with llmd.mem.client() as c:
        store(c, longer, end=2)
    scores = llmd.settle(llmd.mem, longer, 2 * CPU_WEIGHT)
    assert set(scores) == {llmd.ssd.pod, llmd.mem.pod} and close(scores[llmd.ssd.pod], 6 * CPU_WEIGHT), scores


def test_removals_and_remove_all_lower_the_score(llmd: Fleet) -> None:
    a = prompt(2000, 4)
    with llmd.ssd.client() as c, llmd.mem.client() as m:
        store(c, a)
        store(m, a)
        llmd.settle(llmd.ssd, a, 4 * CPU_WEIGHT)
        llmd.settle(llmd.mem, a, 4 * CPU_WEIGHT)

        assert c.remove(a.keys[2])
        llmd.settle(llmd.ssd, a, 2 * CPU_WEIGHT)  # the chain now ends at block 2
        assert c.remove(a.keys[0])
        llmd.settle(llmd.ssd, a, 0.0)  # no first block: the pool is not scored at all
        assert llmd.mem.pod in llmd.llmd.score(a) and llmd.ssd.pod not in llmd.llmd.score(a)

        store(c, a, start=0, end=1)  # block 0 again: blocks 0 and 1 lead, block 3 is cut off by block 2
        llmd.settle(llmd.ssd, a, 2 * CPU_WEIGHT)
        store(c, a, start=2, end=3)
        llmd.settle(llmd.ssd, a, 4 * CPU_WEIGHT)

        # remove_all with force: AllBlocksCleared, after which llm-d drops every entry of that pod and only that pod
        c.remove_all(force=True)
        llmd.settle(llmd.ssd, a, 0.0)
        assert close(llmd.llmd.score(a)[llmd.mem.pod], 4 * CPU_WEIGHT), "the other pool's blocks stay"

        # and without force
        store(c, a)
        llmd.settle(llmd.ssd, a, 4 * CPU_WEIGHT)
        c.remove_all()
        llmd.settle(llmd.ssd, a, 0.0)
    stats = llmd.llmd.stats()
    assert stats["events"].get("AllBlocksCleared", 0) >= 2 and stats["events"].get("BlockRemoved", 0) >= 2, stats


def test_eviction_lowers_the_score(llmd: Fleet) -> None:
    """The pool without an SSD tier evicts the oldest objects when it fills: BlockRemoved (CPU), and llm-d's score
    for the evicted prompt drops to what the pool still holds."""
    a = prompt(3000, 4)
    pool = llmd.mem
    with pool.client() as c:
        store(c, a, value_size=SPILL_VALUE)
        llmd.settle(pool, a, 4 * CPU_WEIGHT)
        for i in range(48):  # 12 MiB of other objects through the 8 MiB segment
            st = c.put(f"filler/{i}", b"f" * SPILL_VALUE)
            assert st in (kvpool.PutStatus.OK, kvpool.PutStatus.POOL_FULL), st

    def consistent() -> tuple[bool, Any]:
        tiers = pool.tiers(a.keys)
        s = llmd.llmd.score(a).get(pool.pod, 0.0)
        return tiers.count("CPU") < 4 and close(s, leading_score(tiers)), (tiers, s)

    tiers, s = until("the pool evicted the prompt's blocks and llm-d scores what is left", consistent)
    assert "STORAGE" not in tiers
    assert s < 4 * CPU_WEIGHT and close(s, leading_score(tiers)), (tiers, s)


def test_ssd_tier_blocks_are_medium_storage(llmd: Fleet) -> None:
    """64 blocks of 256 KiB through the 8 MiB segment: the oldest spill to the SSD tier (BlockRemoved CPU, then
    BlockStored STORAGE with the same tokens, its parent found through the parent's hash). llm-d keeps them as
    medium "storage", for which its default config has no weight, so each counts 1.0: more than a block in memory
    (cpu, 0.8). (``--promote-after 0``: no read moves a block back to memory.)"""
    weights = llmd.llmd.ask({"op": "config"})["weights"]
    assert weights == {"gpu": 1.0, "cpu": CPU_WEIGHT}, "llm-d's default medium weights, none for storage"
    c_prompt = prompt(5000, 64)
    pool = llmd.ssd
    with pool.client() as c:
        store(c, c_prompt, value_size=SPILL_VALUE)

    def settled() -> tuple[bool, Any]:
        """One look at the pool's media and llm-d's scores, valid if the media did not change meanwhile."""
        tiers = pool.tiers(c_prompt.keys)
        if not all(tiers) or "STORAGE" not in tiers:
            return False, tiers
        first = tiers.index("STORAGE")
        look = {"tiers": tiers, "first_ssd": first, "score": llmd.llmd.score(c_prompt).get(pool.pod, 0.0),
                "before_it": llmd.llmd.score(c_prompt.tokens[:first * BLOCK]).get(pool.pod, 0.0),
                "with_it": llmd.llmd.score(c_prompt.tokens[:(first + 1) * BLOCK]).get(pool.pod, 0.0)}
        return pool.tiers(c_prompt.keys) == tiers and close(look["score"], leading_score(tiers)), look

    look = until("every block is in the pool, some on SSD, and llm-d scores their media", settled)
    tiers = look["tiers"]
    assert close(look["score"], tiers.count("CPU") * CPU_WEIGHT + tiers.count("STORAGE") * STORAGE_WEIGHT), look
    assert close(look["with_it"] - look["before_it"], STORAGE_WEIGHT), f"a block on SSD adds 1.0: {look}"

    # removing a block on SSD is BlockRemoved (STORAGE): llm-d's chain for the pool now ends before it
    on_ssd = [i for i, t in enumerate(tiers) if t == "STORAGE" and i > 0]
    cut = on_ssd[len(on_ssd) // 2]
    with pool.client() as c:
        assert c.remove(c_prompt.keys[cut])
    now = pool.tiers(c_prompt.keys)
    assert now[cut] == "", now
    llmd.settle(pool, c_prompt, leading_score(now))

    # remove_all: AllBlocksCleared drops the pod's entries in every medium, SSD ones included
    with pool.client() as c:
        c.remove_all(force=True)
    llmd.settle(pool, c_prompt, 0.0)

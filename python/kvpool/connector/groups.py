"""Several KV cache groups in one engine (hybrid models: full attention beside sliding-window attention).

vLLM's hybrid allocator gives each group its own block table: block ids are unique within a group only. The
connector keeps its one-id-per-block interface by naming a block of group ``g`` by a *ref*,
``g << 40 | block_id`` (group 0's refs are its block ids), and :class:`GroupedKv` resolves refs to the group's
own cache. Each group's blocks are stored under keys of their own (:func:`group_keys`: the engine's key with
``g{g}-{kind}/`` after the prefix; group 0, the primary full-attention group, keeps the plain keys, so a
hybrid engine shares that group with engines of one group), in the same canonical block layout.

Which tokens a group needs for a prefix hit (:class:`GroupRule`): a full-attention group every block up to
the hit; a sliding-window group only the blocks the window still sees before the hit's end (vLLM nulls the
others). The scheduler offers a hit only when every group has what it needs, so a hit in one group never
pairs with a miss in another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .keys import KeyFormat
from .paged import PagedKv, Staged

__all__ = ["GROUP_SHIFT", "ref", "split_ref", "group_keys", "GroupRule", "GroupedKv"]

GROUP_SHIFT = 40
_MASK = (1 << GROUP_SHIFT) - 1


def ref(group: int, block_id: int) -> int:
    """The connector's name of block ``block_id`` of group ``group``."""
    if not 0 <= block_id <= _MASK:
        raise ValueError(f"block id {block_id} outside 0..{_MASK}")
    return (group << GROUP_SHIFT) | block_id


def split_ref(r: int) -> tuple[int, int]:
    """``(group, block_id)`` of a ref."""
    return r >> GROUP_SHIFT, r & _MASK


def group_keys(keys: KeyFormat, group: int, kind: str) -> KeyFormat:
    """The key format of group ``group``'s blocks: ``keys`` for group 0, else its prefix followed by
    ``g{group}-{kind}/``."""
    if group == 0:
        return keys
    fmt = KeyFormat(keys.model, keys.weights, keys.kv_dtype, tp_rank=keys.tp_rank, tp_size=keys.tp_size,
                    pp_rank=keys.pp_rank, pp_size=keys.pp_size)
    fmt.prefix = keys.prefix + f"g{group}-{kind}/"
    return fmt


@dataclass(frozen=True)
class GroupRule:
    """What group ``index`` needs of a prefix hit: every block (``window_blocks`` None) or the last
    ``window_blocks`` before the hit's end."""

    index: int
    kind: str
    window_blocks: Optional[int] = None

    def needed(self, start: int, end: int) -> range:
        """The block indices of ``[start, end)`` this group must load for a hit ending at block ``end``."""
        if self.window_blocks is None:
            return range(start, end)
        return range(max(start, end - self.window_blocks), end)


def hit_end(rules: Sequence[GroupRule], start: int, end: int, present: Callable[[int, Sequence[int]], list[bool]]) -> int:
    """The largest hit end ``e`` in ``[start, end]`` for which every group holds the blocks it needs
    (``present(group, indices)``: which of those blocks the pool holds); ``start`` when none. Linear in the
    blocks times the widest window: a full-attention group caps the end at its first missing block, and only
    the windows are checked per candidate end."""
    idx = list(range(max(start, 0), end))
    if not idx:
        return start
    have = {r.index: dict(zip(idx, present(r.index, idx))) for r in rules}
    limit = end
    for r in rules:
        if r.window_blocks is None:
            limit = min(limit, next((b for b in idx if not have[r.index][b]), end))
    windows = [r for r in rules if r.window_blocks is not None]
    for e in range(limit, start, -1):
        if all(all(have[r.index][b] for b in r.needed(start, e)) for r in windows):
            return e
    return start


class _GroupedStaged(Staged):
    def __init__(self, parts: list[tuple[list[int], Any]]) -> None:  # noqa: D107
        self._parts = parts

    def wait(self) -> None:
        for _, st in self._parts:
            st.wait()

    def sources(self) -> list[Any]:
        out: list[Any] = [None] * sum(len(pos) for pos, _ in self._parts)
        for pos, st in self._parts:
            for p, src in zip(pos, st.sources()):
                out[p] = src
        return out


class GroupedKv(PagedKv):
    """Several groups' caches (one :class:`PagedKv` each, by group index) as one, addressed by refs."""

    def __init__(self, groups: dict[int, PagedKv]) -> None:
        if not groups:
            raise ValueError("grouped KV: no groups")
        self.groups = dict(groups)
        first = self.groups[min(self.groups)]
        self.block_size = first.block_size
        self.num_layers = first.num_layers
        self.block_bytes = first.block_bytes

    @property
    def kv_dtype(self) -> str:
        return self.groups[min(self.groups)].kv_dtype

    def _kv(self, group: int) -> PagedKv:
        kv = self.groups.get(group)
        if kv is None:
            raise IndexError(f"grouped KV: no KV cache group {group}")
        return kv

    def object_bytes(self, block_id: int) -> int:
        return self._kv(split_ref(block_id)[0]).block_bytes

    def _by_group(self, refs: Sequence[int]) -> dict[int, tuple[list[int], list[int]]]:
        """group -> (positions in ``refs``, the group's block ids)."""
        out: dict[int, tuple[list[int], list[int]]] = {}
        for i, r in enumerate(refs):
            g, b = split_ref(int(r))
            pos, ids = out.setdefault(g, ([], []))
            pos.append(i)
            ids.append(b)
        return out

    def stage_save(self, block_ids: Sequence[int]) -> Staged:
        return _GroupedStaged([(pos, self._kv(g).stage_save(ids)) for g, (pos, ids) in self._by_group(block_ids).items()])

    def save_sources(self, block_ids: Sequence[int]) -> list[Any]:
        return self.stage_save(block_ids).sources()

    def load_targets(self, block_ids: Sequence[int]) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        targets: list[Any] = [None] * len(block_ids)
        commits: list[tuple[list[int], Callable[[Sequence[bool]], None]]] = []
        for g, (pos, ids) in self._by_group(block_ids).items():
            t, commit = self._kv(g).load_targets(ids)
            for p, x in zip(pos, t):
                targets[p] = x
            commits.append((pos, commit))

        def commit_all(ok: Sequence[bool]) -> None:
            for pos, commit in commits:
                commit([ok[p] for p in pos])
        return targets, commit_all

    def layer_targets(self, block_ids: Sequence[int], layer: int) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        raise ValueError("grouped KV: several KV cache groups move whole blocks, not layer by layer")

    def layer_sources(self, block_ids: Sequence[int], layer: int) -> list[Any]:
        raise ValueError("grouped KV: several KV cache groups move whole blocks, not layer by layer")

    def __repr__(self) -> str:
        return "GroupedKv(" + ", ".join(f"{g}: {kv!r}" for g, kv in sorted(self.groups.items())) + ")"

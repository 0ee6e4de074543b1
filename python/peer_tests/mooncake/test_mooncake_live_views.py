"""``TensorParallelism.axes`` and ``ReadTarget.parallelism`` on the wheel and on kvpool: the same edits, the
same observations.

The wheel binds both with pybind11's ``def_readwrite`` (a ``std::vector<ParallelAxis>`` and a
``std::optional<TensorParallelism>``): reading ``axes`` gives a new list of the stored axes themselves,
assigning copies (over the stored axes while the vector has room), and ``rt.parallelism`` is the stored
layout itself. One script of edits runs on each module's classes and records what each edit leaves behind;
the two records must be equal. The script avoids what is undefined in the wheel (an axis read before an
assignment that outgrew the vector points at freed memory there).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import mooncake.store as real  # the pinned wheel

import kvpool.mooncake as ours


def _axis(mod: ModuleType, kind: str, rank: int, size: int, **optional: int) -> Any:
    a = mod.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    for name, value in optional.items():
        setattr(a, name, value)
    return a


def _fields(a: Any) -> tuple[Any, ...]:
    return (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id)


def _layout(p: Any) -> list[tuple[Any, ...]]:
    return [_fields(a) for a in p.axes]


def _script(mod: ModuleType) -> list[tuple[str, Any]]:
    """Edits on ``mod``'s request classes; (step, what it left) for each."""
    out: list[tuple[str, Any]] = []

    def note(step: str, value: Any) -> None:
        out.append((step, value))

    def raises(fn: Callable[[], object]) -> str:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the exception's type is the observation
            return type(e).__name__
        return "no exception"

    ax: Callable[..., Any] = lambda *a, **kw: _axis(mod, *a, **kw)  # noqa: E731
    p = mod.TensorParallelism()
    note("default", (p.axes, type(p.axes).__name__))
    p.axes.append(ax("pp", 0, 2, stage_id=1))
    note("append to the list read", _layout(p))
    src = [ax("pp", 0, 2), ax("tp", 0, 4, split_dim=1)]
    p.axes = src
    note("a list read twice", (p.axes is p.axes, p.axes == p.axes))
    note("an axis read twice", p.axes[0] is p.axes[0])
    note("assigned axis is the source", p.axes[0] is src[0])
    src[0].stage_id = 9
    src.append(ax("dp", 0, 2))
    note("edit the source list after assigning", _layout(p))
    p.axes[0].stage_id = 3
    note("p.axes[0].stage_id = 3", _layout(p))
    h = p.axes[1]
    h.rank = 2
    note("edit an axis held", (_layout(p), p.axes[1] is h))
    lst = p.axes
    lst[0] = ax("dp", 1, 2)
    lst.append(ax("dp", 0, 2))
    del lst
    p.axes.clear()
    p.axes.pop()
    p.axes.reverse()
    p.axes.sort(key=lambda a: a.kind, reverse=True)
    note("list methods on lists read", _layout(p))
    for a in p.axes:
        a.size = 8
    note("edit every axis in a loop", _layout(p))
    p.axes = [ax("ep", 0, 2, expert_id=5), ax("dp", 1, 3)]
    note("same-length assignment: the axis held", (_fields(h), p.axes[1] is h))
    h.rank = 0
    note("edit the axis held after it", _layout(p))
    p.axes = [ax("tp", 1, 2, split_dim=0)]
    note("shorter assignment", _layout(p))
    p.axes = [ax("dp", 0, 2), ax("pp", 1, 2, stage_id=4)]
    note("longer again, within capacity: the axis held", (_fields(h), p.axes[1] is h))
    p.axes += [ax("ep", 0, 2, expert_id=1)]
    note("+=", _layout(p))
    p.axes = tuple([ax("dp", 0, 2)])
    note("assign a tuple", _layout(p))
    p.axes = p.axes + p.axes
    note("assign its own axes twice", _layout(p))
    p.axes = list(reversed([ax("tp", 0, 2, split_dim=0), ax("dp", 1, 2)]))
    p.axes = list(reversed(p.axes))
    note("assign its own axes reversed", _layout(p))
    for label, bad in (("[1]", [1]), ("str", "ab"), ("None", None), ("[None]", [None]),
                       ("set", {ax("dp", 0, 2)}), ("iterator", iter([ax("dp", 0, 2)]))):
        note(f"assign {label}", (raises(lambda: setattr(p, "axes", bad)), _layout(p)))

    r = mod.ReadTarget()
    note("target default", (r.mode, r.parallelism))
    q = mod.TensorParallelism()
    q.axes = [ax("tp", 0, 2, split_dim=0)]
    r.parallelism = q
    held = r.parallelism
    note("parallelism read twice, and the one assigned", (held is r.parallelism, held is q))
    q.axes[0].rank = 1
    note("edit the layout assigned", _layout(r.parallelism))
    r.parallelism.axes[0].rank = 1
    note("r.parallelism.axes[0].rank = 1", (_layout(r.parallelism), _layout(held)))
    r.parallelism.axes.append(ax("dp", 0, 2))
    note("r.parallelism.axes.append", _layout(r.parallelism))
    r.parallelism.axes = r.parallelism.axes + [ax("dp", 0, 2)]
    note("r.parallelism.axes = ...", _layout(held))
    held.axes = [ax("pp", 0, 2, stage_id=1)]
    note("assign through the layout held", _layout(r.parallelism))
    q2 = mod.TensorParallelism()
    q2.axes = [ax("ep", 0, 2, expert_id=1)]
    r.parallelism = q2
    note("assign another layout: the one held", (r.parallelism is held, _layout(held)))
    r.parallelism = None
    note("assign None", r.parallelism)
    r.parallelism = q
    note("assign again after None", (r.parallelism is held, _layout(r.parallelism)))
    for label, bad in (("a list", [ax("dp", 0, 2)]), ("an int", 1), ("a str", "x")):
        note(f"parallelism = {label}", (raises(lambda: setattr(r, "parallelism", bad)), _layout(r.parallelism)))
    return out


def test_the_same_edits_leave_the_same_layouts() -> None:
    theirs, mine = _script(real), _script(ours)
    differ = [(step, t, m) for (step, t), (_, m) in zip(theirs, mine) if t != m]
    assert not differ, "\n".join(f"{step}: wheel {t!r}, kvpool {m!r}" for step, t, m in differ)
    assert [step for step, _ in mine] == [step for step, _ in theirs]

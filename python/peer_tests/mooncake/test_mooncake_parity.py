"""Parity of ``kvpool.mooncake`` with the installed Mooncake wheel's ``mooncake.store``: every public name,
every class member, every signature.

The wheel's names are listed from the module itself and its signatures read from the pybind11 docstrings
(``name(self: T, key: str, config: ReplicateConfig = <...>) -> int``), so a new Mooncake release that adds,
renames or reorders anything fails here until kvpool follows. Where kvpool deliberately differs, the
difference is in one of the tables below, each naming why; an entry that no longer applies fails too, so
the tables cannot go stale.
"""

from __future__ import annotations

import enum
import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest

import mooncake.store as real  # the pinned wheel (peers/mooncake/requirements.txt)

import kvpool.mooncake as ours

# ------------------------------------------------------------------------------------------- tables

#: kvpool names the wheel lacks: (owner, name) -> why they exist.
EXTRAS: dict[tuple[str, str], str] = {
    ("MooncakeDistributedStore", "batch_upsert_from_multi_buffers"):
        "earlier Mooncake releases had it; kept so callers written against them work",
    ("ReplicateConfig", "with_soft_pin"):
        "the soft-pin flag of Mooncake releases before 0.3.13 (soft_pin_action replaced it)",
}

#: Parameters kvpool adds, all optional: (owner, method) -> (the extra parameters, why).
EXTRA_PARAMETERS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("MooncakeDistributedStore", "__init__"): (("client_factory",), "a test and embedding hook that builds the "
                                                                     "kvpool client"),
    ("ReplicateConfig", "__init__"): (("fields",), "fields may be set at construction (the binding takes none)"),
}

#: Overloaded binding functions: (owner, name) -> the kvpool methods that implement each overload, in order.
OVERLOADS: dict[tuple[str, str], tuple[str, ...]] = {
    ("MooncakeDistributedStore", "setup"): ("_setup_positional", "_setup_dict"),
}

#: A default the binding spells as an object repr and kvpool as ``None``, meaning the same thing.
EQUIVALENT_DEFAULTS = {
    "<mooncake.store.ReplicateConfig object>": "None",  # None: a fresh ReplicateConfig(), as the default is
}

#: pybind11 helper names on every bound class, not part of the API.
PYBIND_INTERNALS = {"_pybind11_conduit_v1_"}


# ------------------------------------------------------------------------------- the wheel's side

@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "positional" (pybind11's argN: position only), "named", "varargs", "varkw"
    default: Optional[str]  # the default's text, None when required


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    returns: str


def _split_top(text: str) -> list[str]:
    """Splits at commas outside brackets, quotes and ``<...>`` reprs."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


_OBJECT_REPR = re.compile(r"<([\w.]+) object at 0x[0-9a-f]+>")


def parse_signature(line: str) -> Signature:
    """One pybind11 signature line: ``name(params) -> returns``."""
    m = re.match(r"^\s*(?:\d+\.\s*)?[\w.]+\((.*)\)\s*->\s*(.+?)\s*$", line)
    assert m, f"not a pybind11 signature: {line!r}"
    params = []
    for i, part in enumerate(_split_top(m.group(1))):
        if part.startswith("**"):
            params.append(Param(part[2:], "varkw", None))
            continue
        if part.startswith("*"):
            params.append(Param(part[1:], "varargs", None))
            continue
        head, _, default = part.partition(" = ")
        name = head.split(":")[0].strip()
        if i == 0 and name == "self":
            continue
        kind = "positional" if re.fullmatch(r"arg\d+", name) else "named"
        params.append(Param(name, kind, _OBJECT_REPR.sub(r"<\1 object>", default) if default else None))
    return Signature(tuple(params), m.group(2))


def wheel_signatures(fn: Any) -> list[Signature]:
    """The binding's signatures of a function or method (several for an overloaded one)."""
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    if len(lines) > 1 and lines[1].strip() == "Overloaded function.":
        return [parse_signature(ln) for ln in lines if re.match(r"^\d+\. ", ln)]
    return [parse_signature(lines[0])]


def public(names: Any) -> list[str]:
    return sorted(n for n in names if not n.startswith("_"))


def wheel_members(cls: type) -> dict[str, Any]:
    """A bound class's own API: methods, properties, enum members, and the protocol dunders it defines."""
    out = {}
    for name, value in vars(cls).items():
        if name in PYBIND_INTERNALS or name in ("__doc__", "__module__", "__members__", "__entries"):
            continue
        if name.startswith("_") and not name.startswith("__"):
            continue  # the binding's internal helpers (_get_pyclient_capsule)
        if name.startswith("__") and name not in ("__init__", "__enter__", "__exit__", "__len__", "__getitem__",
                                                  "__int__", "__index__", "__eq__", "__hash__"):
            continue
        if name == "__hash__" and value is None:
            continue
        out[name] = value
    return out


def is_enum_class(cls: type) -> bool:
    return hasattr(cls, "__members__") and "__int__" in vars(cls)


# ---------------------------------------------------------------------------------------- the tests

def test_every_public_name_of_the_wheel_exists_in_kvpool() -> None:
    missing = [n for n in public(dir(real)) if not hasattr(ours, n)]
    assert not missing, f"kvpool.mooncake lacks these names of the installed mooncake.store: {missing}"


def test_kind_of_each_name_matches() -> None:
    """A class is a class, a function a function, a constant an enum member of the same enum and value."""
    wrong = []
    for name in public(dir(real)):
        r, o = getattr(real, name), getattr(ours, name, None)
        if o is None:
            continue
        if inspect.isclass(r):
            if not inspect.isclass(o):
                wrong.append(f"{name}: a class in the wheel, {type(o).__name__} in kvpool")
        elif callable(r):
            if not callable(o) or inspect.isclass(o):
                wrong.append(f"{name}: a function in the wheel, {type(o).__name__} in kvpool")
        elif hasattr(r, "__int__") and hasattr(type(r), "__members__"):
            rt, ot = type(r).__name__, type(o).__name__
            if rt != ot or int(r) != int(o) or r.name != getattr(o, "name", None):
                wrong.append(f"{name}: {rt}.{r.name} = {int(r)} in the wheel, {o!r} in kvpool")
        else:
            wrong.append(f"{name}: unexpected kind {type(r).__name__} in the wheel (teach this test about it)")
    assert not wrong, "\n".join(wrong)


def _classes() -> Iterator[str]:
    for name in public(dir(real)):
        if inspect.isclass(getattr(real, name)):
            yield name


@pytest.mark.parametrize("cls_name", list(_classes()))
def test_class_members_match(cls_name: str) -> None:
    r_cls, o_cls = getattr(real, cls_name), getattr(ours, cls_name)
    problems = []
    if is_enum_class(r_cls):
        r_members = {k: int(v) for k, v in r_cls.__members__.items()}
        o_members = {k: int(v) for k, v in getattr(o_cls, "__members__", {}).items()}
        if r_members != o_members:
            problems.append(f"enum members differ: wheel {r_members}, kvpool {o_members}")
        if not issubclass(o_cls, enum.Enum):
            problems.append("not an enum in kvpool")
        else:
            for k, v in r_members.items():
                member = o_cls(v)  # constructed from its value, as the binding's enums are
                if member.name != k or int(member) != v or member.value != v:
                    problems.append(f"{cls_name}({v}) is {member!r} in kvpool")
    sample = next(iter(o_cls), None) if is_enum_class(r_cls) and issubclass(o_cls, enum.Enum) else None
    for name, value in wheel_members(r_cls).items():
        if is_enum_class(r_cls) and name in r_cls.__members__:
            continue
        if sample is not None and name in ("name", "value"):
            if not hasattr(sample, name):
                problems.append(f"enum members lack .{name}")
            continue
        if not hasattr(o_cls, name):
            problems.append(f"missing member {name}")
            continue
        if isinstance(value, property):
            o_attr = inspect.getattr_static(o_cls, name)
            settable = hasattr(type(o_attr), "__set__") and not (isinstance(o_attr, property) and o_attr.fset is None)
            if (value.fset is not None) != settable:
                problems.append(f"property {name}: {'settable' if value.fset else 'read-only'} in the wheel, "
                                f"{'settable' if settable else 'read-only'} in kvpool")
    for name in public(vars(o_cls)):
        if (cls_name, name) in EXTRAS or is_enum_class(r_cls):
            continue
        if name not in vars(r_cls) and not name.startswith("_") and _is_api(o_cls, name):
            problems.append(f"kvpool has {name}, the wheel does not (add it to EXTRAS with the reason, or remove it)")
    assert not problems, f"{cls_name}:\n  " + "\n  ".join(problems)


def _is_api(cls: type, name: str) -> bool:
    """Public methods and properties count as API; class-level constants and helpers do not."""
    attr = inspect.getattr_static(cls, name)
    return callable(attr) or isinstance(attr, property) or hasattr(type(attr), "__get__")


def _callables() -> Iterator[tuple[str, str]]:
    """(owner, name): module functions (owner "") and the methods of every class, as the wheel has them."""
    for name in public(dir(real)):
        obj = getattr(real, name)
        if inspect.isclass(obj):
            for m, v in wheel_members(obj).items():
                if is_enum_class(obj) and (m in obj.__members__ or m.startswith("__")):
                    continue  # members, and the enum protocol: test_class_members_match checks those by behaviour
                if callable(v) and not isinstance(v, property):
                    if (inspect.getdoc(v) or "").startswith("Initialize self."):
                        continue  # a class the binding does not let Python construct
                    yield name, m
        elif callable(obj):
            yield "", name


def _kvpool_callable(owner: str, name: str) -> Any:
    return getattr(getattr(ours, owner), name) if owner else getattr(ours, name)


def _compare(owner: str, name: str, wheel: Signature, fn: Any) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        return [f"no signature for kvpool's {owner}.{name}: {e}"]
    params = [p for p in sig.parameters.values() if p.name != "self"]
    extra_names, _ = EXTRA_PARAMETERS.get((owner, name), ((), ""))
    ours_main = [p for p in params if p.name not in extra_names]
    out = []
    if len(ours_main) != len(wheel.params):
        out.append(f"{len(wheel.params)} parameters in the wheel {[p.name for p in wheel.params]}, "
                   f"{len(ours_main)} in kvpool {[p.name for p in ours_main]}")
        return out
    for w, o in zip(wheel.params, ours_main):
        if w.kind == "varargs":
            if o.kind != inspect.Parameter.VAR_POSITIONAL:
                out.append(f"*{w.name}: kvpool has {o}")
            continue
        if w.kind == "varkw":
            if o.kind != inspect.Parameter.VAR_KEYWORD:
                out.append(f"**{w.name}: kvpool has {o}")
            continue
        if o.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            out.append(f"{w.name}: kvpool has {o}")
            continue
        if w.kind == "named" and o.name != w.name:
            out.append(f"parameter {w.name!r} is {o.name!r} in kvpool")
        if w.kind == "named" and o.kind == inspect.Parameter.POSITIONAL_ONLY:
            out.append(f"parameter {w.name!r} is positional-only in kvpool, a keyword in the wheel")
        # kvpool.mooncake.args.REQUIRED: a parameter the binding requires after one with a default
        o_default = None if o.default is inspect.Parameter.empty or repr(o.default) == "<required>" else repr(o.default)
        w_default = EQUIVALENT_DEFAULTS.get(w.default, w.default) if w.default is not None else None
        if w_default != o_default:
            out.append(f"parameter {w.name!r}: {_default_text(w.default)} in the wheel, {_default_text(o_default)} "
                       "in kvpool")
    for p in params:
        if p.name in extra_names and p.default is inspect.Parameter.empty and p.kind not in (
                inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            out.append(f"kvpool's extra parameter {p.name!r} must be optional")
    return out


def _default_text(default: Optional[str]) -> str:
    return "required" if default is None else f"default {default}"


@pytest.mark.parametrize("owner, name", list(_callables()))
def test_signatures_match(owner: str, name: str) -> None:
    r = getattr(getattr(real, owner), name) if owner else getattr(real, name)
    signatures = wheel_signatures(r)
    implementations = OVERLOADS.get((owner, name))
    if implementations is None:
        assert len(signatures) == 1, f"{owner}.{name} is overloaded in the wheel: add it to OVERLOADS"
        problems = _compare(owner, name, signatures[0], _kvpool_callable(owner, name))
    else:
        assert len(signatures) == len(implementations), f"{owner}.{name}: the wheel now has {len(signatures)} overloads"
        problems = []
        for sig, impl in zip(signatures, implementations):
            problems += [f"(overload {impl}) {p}" for p in _compare(owner, name, sig, getattr(getattr(ours, owner), impl))]
    assert not problems, f"{owner + '.' if owner else ''}{name}:\n  " + "\n  ".join(problems)


def test_the_tables_of_differences_are_current() -> None:
    """An entry for something the wheel now has, or kvpool no longer has, must go."""
    stale = []
    for owner, name in EXTRAS:
        if hasattr(getattr(real, owner), name):
            stale.append(f"EXTRAS {owner}.{name}: the wheel has it now")
        if not hasattr(getattr(ours, owner), name):
            stale.append(f"EXTRAS {owner}.{name}: kvpool no longer has it")
    for (owner, name), (params, _) in EXTRA_PARAMETERS.items():
        have = inspect.signature(getattr(getattr(ours, owner), name)).parameters
        stale += [f"EXTRA_PARAMETERS {owner}.{name}({p}): kvpool no longer has it" for p in params if p not in have]
    for (owner, name), impls in OVERLOADS.items():
        stale += [f"OVERLOADS {owner}.{name}: kvpool has no {i}" for i in impls if not hasattr(getattr(ours, owner), i)]
    assert not stale, "\n".join(stale)


def test_the_signature_parser_reads_pybind11_lines() -> None:
    """The parser itself, on the shapes the wheel uses, so a parser bug cannot hide a difference."""
    s = parse_signature("put_parts(self: mooncake.store.MooncakeDistributedStore, key: str, *args, config: "
                        "mooncake.store.ReplicateConfig = <mooncake.store.ReplicateConfig object at 0x7f>) -> int")
    assert s == Signature((Param("key", "named", None), Param("args", "varargs", None),
                           Param("config", "named", "<mooncake.store.ReplicateConfig object>")), "int")
    s = parse_signature("get(self: mooncake.store.MooncakeDistributedStore, arg0: str) -> bytes")
    assert s.params == (Param("arg0", "positional", None),) and s.returns == "bytes"
    s = parse_signature("2. setup(self: X, config: dict) -> int")
    assert s.params == (Param("config", "named", None),)
    s = parse_signature("f(a: dict[str, list[int]] = {}, b: str = 'x, y') -> tuple[int, int]")
    assert [p.default for p in s.params] == ["{}", "'x, y'"] and s.returns == "tuple[int, int]"

"""``ReplicateConfig``: where and how many copies a put makes, with Mooncake's fields, defaults and types.

Mooncake's binding checks each field's type when it is assigned (pybind11's casters), so a wrong value
fails at the assignment, not at the put that uses it. This class does the same with one descriptor per
field: unsigned integers refuse negatives, floats and text; booleans take anything with a truth value
of its own (numbers, None as False) and refuse text and lists; strings take ``str`` or UTF-8 ``bytes``;
string lists take any list or tuple of those; the enum fields take only their enum. A refused value
raises ``TypeError`` naming the field, and the field keeps its value. List fields hand out copies, as
the binding does, so appending to what a getter returned changes nothing.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Generic, Optional, TypeVar, overload

from .args import _str_arg
from .codes import ObjectDataType, SoftPinAction

__all__ = ["ReplicateConfig"]  # config_arg is for the package's own modules

_U64_LIMIT = 1 << 64
T = TypeVar("T")


def _refuse(field: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"ReplicateConfig.{field}: incompatible value {value!r} ({type(value).__name__}); "
                     f"expected {expected}")


def _u64(field: str, value: Any) -> int:
    if isinstance(value, float) or not hasattr(type(value), "__index__"):
        raise _refuse(field, value, "an unsigned integer")
    n = operator.index(value)
    if not 0 <= n < _U64_LIMIT:
        raise _refuse(field, value, "an unsigned 64-bit integer")
    return n


def _opt_u64(field: str, value: Any) -> Optional[int]:
    return None if value is None else _u64(field, value)


def _bool(field: str, value: Any) -> bool:
    if value is None:
        return False
    if getattr(type(value), "__bool__", None) is None:
        raise _refuse(field, value, "a bool")
    return bool(value)


def _text(field: str, value: Any) -> str:
    try:
        return _str_arg(value, field)
    except TypeError:
        raise _refuse(field, value, "a str (or UTF-8 bytes)") from None


def _texts(field: str, value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise _refuse(field, value, "a list of str")
    try:
        return [_text(field, v) for v in value]
    except TypeError:
        raise _refuse(field, value, "a list of str") from None


def _opt_texts(field: str, value: Any) -> Optional[list[str]]:
    return None if value is None else _texts(field, value)


def _enum(kind: type) -> Callable[[str, Any], Any]:
    def check(field: str, value: Any) -> Any:
        if not isinstance(value, kind):
            raise _refuse(field, value, f"{kind.__name__}.<member>")
        return value
    return check


class _Field(Generic[T]):
    """One typed field: checked on assignment, stored in the instance's slot ``_<name>``."""

    def __init__(self, default: Callable[[], T], check: Callable[[str, Any], T], copy: bool = False) -> None:
        self.default = default
        self.check = check
        self.copy = copy
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> "_Field[T]": ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        value = getattr(obj, "_" + self.name)
        return list(value) if self.copy and value is not None else value

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, "_" + self.name, self.check(self.name, value))


class ReplicateConfig:
    """Where and how many copies a put makes (Mooncake's ``ReplicateConfig``: same fields, defaults and types).

    kvpool honours ``replica_num`` (copies on distinct segments, on distinct hosts while another host has
    room; the master makes copies it could not make at the put later, when there is room),
    ``preferred_segment`` / ``preferred_segments[0]`` (a kvpool segment name, ``host:port`` of a
    node; a preference, not a requirement) and the pins: ``with_hard_pin`` pins until the object is
    removed or replaced, a soft pin (``soft_pin_action = ENABLE``; ``with_soft_pin``, the field of earlier
    Mooncake releases, too) for ``soft_pin_ttl_ms`` or 30 minutes. A kvpool pin makes an object evicted
    only after unpinned ones, up to the master's ``--max-pinned`` share of the pool; it never makes a put
    fail for lack of room, and reads do not extend it. ``replica_num == 0``, a ``soft_pin_ttl_ms`` without a
    soft pin, and ``prefer_alloc_in_same_node=True`` are refused by puts, as in Mooncake. The NoF/DFS,
    data-type and group fields are accepted and ignored (a warning, once, when set).

    ``ReplicateConfig(replica_num=2, ...)`` sets fields at construction, a kvpool convenience (the
    binding's constructor takes no arguments).
    """

    replica_num = _Field(lambda: 1, _u64)
    nof_replica_num = _Field(lambda: 0, _u64)
    dfs_replica_num = _Field(lambda: 0, _u64)
    soft_pin_action = _Field(lambda: SoftPinAction.PRESERVE, _enum(SoftPinAction))
    soft_pin_ttl_ms = _Field(lambda: None, _opt_u64)
    with_hard_pin = _Field(lambda: False, _bool)
    #: Mooncake releases before 0.3.13 had this flag; ``soft_pin_action = ENABLE`` replaced it.
    with_soft_pin = _Field(lambda: False, _bool)
    preferred_segments: _Field[list[str]] = _Field(list, _texts, copy=True)
    preferred_segment = _Field(lambda: "", _text)
    preferred_nof_segments: _Field[list[str]] = _Field(list, _texts, copy=True)
    prefer_alloc_in_same_node = _Field(lambda: False, _bool)
    data_type = _Field(lambda: ObjectDataType.UNKNOWN, _enum(ObjectDataType))
    group_ids: _Field[Optional[list[str]]] = _Field(lambda: None, _opt_texts, copy=True)

    _FIELDS = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "soft_pin_ttl_ms",
               "with_hard_pin", "with_soft_pin", "preferred_segments", "preferred_segment",
               "preferred_nof_segments", "prefer_alloc_in_same_node", "data_type", "group_ids")
    __slots__ = tuple("_" + f for f in _FIELDS)

    def __init__(self, **fields: Any) -> None:
        for name in self._FIELDS:
            setattr(self, "_" + name, getattr(type(self), name).default())
        for name, value in fields.items():
            if name not in self._FIELDS:
                raise TypeError(f"ReplicateConfig has no field {name!r}")
            setattr(self, name, value)

    def __str__(self) -> str:
        """The binding's text form: booleans as 0/1, enum names, lists as ``[a, b]``, optional parts only when set."""
        def items(xs: list[str]) -> str:
            return "[" + ", ".join(xs) + "]"
        parts = [f"replica_num: {self.replica_num}", f"nof_replica_num: {self.nof_replica_num}",
                 f"dfs_replica_num: {self.dfs_replica_num}", f"soft_pin_action: {self.soft_pin_action.name}",
                 "soft_pin_ttl_ms: " + ("default" if self.soft_pin_ttl_ms is None else str(self.soft_pin_ttl_ms)),
                 f"with_hard_pin: {int(self.with_hard_pin)}", f"preferred_segments: {items(self.preferred_segments)}"]
        if self.preferred_segment:
            parts.append(f"preferred_segment (deprecated): {self.preferred_segment}")
        parts += [f"preferred_nof_segments: {items(self.preferred_nof_segments)}",
                  f"prefer_alloc_in_same_node: {int(self.prefer_alloc_in_same_node)}",
                  f"data_type: {self.data_type.name}"]
        if self.group_ids is not None:
            parts.append(f"group_ids: {items(self.group_ids)}")
        if self.with_soft_pin:
            parts.append("with_soft_pin: 1")
        return "ReplicateConfig: { " + ", ".join(parts) + " }"


def config_arg(config: Any, op: str) -> Optional[ReplicateConfig]:
    """A call's ``config`` argument: a ``ReplicateConfig`` or None (the defaults); anything else raises
    ``TypeError`` before the call does anything, as the binding's argument check does."""
    if config is None or isinstance(config, ReplicateConfig):
        return config
    raise TypeError(f"{op}(): config must be a kvpool.mooncake.ReplicateConfig, not {type(config).__name__} "
                    f"({config!r:.80})")

"""``ReplicateConfig``: where and how many copies a put makes, with Mooncake's fields and defaults."""

from __future__ import annotations

from typing import Any, Optional

from .codes import ObjectDataType, SoftPinAction

__all__ = ["ReplicateConfig"]


class ReplicateConfig:
    """Where and how many copies a put makes (Mooncake's ``ReplicateConfig``, same fields and defaults).

    kvpool honours ``replica_num`` (copies on distinct segments, on distinct hosts while another host has
    room; the master makes copies it could not make at the put later, when there is room),
    ``preferred_segment`` / ``preferred_segments[0]`` (a kvpool segment name, ``host:port`` of a
    node; a preference, not a requirement) and the pins: ``with_hard_pin`` pins until the object is
    removed or replaced, a soft pin (``with_soft_pin``, or ``soft_pin_action = ENABLE``) for
    ``soft_pin_ttl_ms`` or 30 minutes. A kvpool pin makes an object evicted only after unpinned ones,
    up to the master's ``--max-pinned`` share of the pool; it never makes a put fail for lack of room,
    and reads do not extend it. ``replica_num == 0``, a ``soft_pin_ttl_ms`` without a soft pin, and
    ``prefer_alloc_in_same_node=True`` are refused by puts, as in Mooncake. The NoF/DFS, data-type and
    group fields are accepted and ignored (a warning, once, when set).
    """

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "with_soft_pin", "soft_pin_action",
                 "soft_pin_ttl_ms",
                 "with_hard_pin", "preferred_segments", "preferred_nof_segments", "preferred_segment",
                 "prefer_alloc_in_same_node", "data_type", "group_ids")

    def __init__(self, **fields: Any) -> None:
        self.replica_num: int = 1
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.with_soft_pin: bool = False
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: Optional[int] = None
        self.with_hard_pin: bool = False
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.preferred_segment: str = ""
        self.prefer_alloc_in_same_node: bool = False
        self.data_type: ObjectDataType = ObjectDataType.UNKNOWN
        self.group_ids: Optional[list[str]] = None
        for name, value in fields.items():
            if name not in self.__slots__:
                raise TypeError(f"ReplicateConfig has no field {name!r}")
            setattr(self, name, value)

    def __str__(self) -> str:
        return ("ReplicateConfig: { " + ", ".join(f"{n}: {getattr(self, n)!r}" for n in self.__slots__) + " }")

    __repr__ = __str__

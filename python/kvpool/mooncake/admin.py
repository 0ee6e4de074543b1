"""Mooncake's replica, segment and task administration on the store: replica descriptors, replica clearing, segment mounting, copy and move tasks, and the counters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


class _AdminMethods:
    """The administration methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""


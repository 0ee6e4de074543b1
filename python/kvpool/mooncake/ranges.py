"""Mooncake's ranged reads and writes and its put and get sessions on the store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


class _RangeMethods:
    """The ranged and session methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""


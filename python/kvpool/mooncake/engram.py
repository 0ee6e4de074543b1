"""Mooncake's Engram store (embedding tables kept in the store) and its NoF registration helper."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


"""Mooncake's descriptor and status types: replica, memory and disk descriptors, replica and task states."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


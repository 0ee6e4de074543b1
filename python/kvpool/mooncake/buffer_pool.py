"""Mooncake's registered buffer pools (``BufferPool``, ``BufferLease``, ``BufferLeaseView`` and the ``Registered*`` names), its host-memory allocator and the process-level helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


"""Mooncake's tensor helpers on the store (``put_tensor``, ``get_tensor`` and their batch, upsert, ``pub``, tensor-parallel and parallelism forms, safetensors export and import)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # noqa: F401

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = []


class _TensorMethods:
    """The tensor methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""


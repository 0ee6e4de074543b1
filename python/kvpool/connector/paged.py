"""Paged KV caches as the connector reads and fills them.

The bytes of one pool object (one block) are the Java reference engine's block layout
(``kvpool-engine``'s ``KvBlocks``), which is also vLLM's cross-layer block layout for
FlashAttention-style backends with the NHD cache layout (``get_kv_cache_stride_order(
include_num_layers_dimension=True) == (2, 0, 1, 3, 4, 5)``)::

    block b:  [layer][K=0 / V=1][token in block][kv head][head dim]   of the KV dtype, little-endian
    block_bytes = num_layers * 2 * block_size * num_kv_heads * head_size * dtype size

:class:`PagedKvCache` holds ``num_blocks`` such blocks in one contiguous numpy array or torch CPU
tensor of shape ``(num_blocks, num_layers, 2, block_size, num_kv_heads, head_size)``, so a block is
one contiguous region and loads and saves go straight between the pool and the cache (no
intermediate bytes). Its per-layer views are strided views of the same memory, in vLLM's per-layer
logical shapes: :meth:`PagedKvCache.layer` ``(2, num_blocks, block_size, num_kv_heads, head_size)``
(FlashAttention, NHD) and :meth:`PagedKvCache.layer_hnd` ``(2, num_blocks, num_kv_heads, block_size,
head_size)`` (vLLM's CPU attention backend, ``CPUAttentionBackend.get_kv_cache_shape``).

:class:`LayeredPagedKv` adapts separately allocated per-layer caches (what vLLM hands a connector
through ``register_kv_caches``): a block is scattered over the layers there, and for the CPU backend
its heads come before its tokens, so loads and saves go through one staging copy per block.

Layer by layer (the connector's ``granularity="layer"``): layer ``l`` of a block is the byte range
``[l * layer_bytes, (l + 1) * layer_bytes)`` of its object, ``[K/V][token][head][dim]`` of that layer.
:meth:`PagedKv.layer_targets` and :meth:`PagedKv.layer_sources` give that range of each block: views of
the block for a contiguous cache, one staging copy per block and layer for :class:`LayeredPagedKv`
(which then touches only that layer's tensors).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..buffers import as_memoryview
from .keys import dtype_name

__all__ = ["PagedKv", "PagedKvCache", "LayeredPagedKv", "Staged", "NHD", "HND"]

#: vLLM per-layer logical layouts, as the dimension names of a layer's KV cache tensor.
NHD = ("kv", "blocks", "tokens", "heads", "dim")   # FlashAttention: (2, num_blocks, block_size, H, D)
HND = ("kv", "blocks", "heads", "tokens", "dim")   # CPU backend:    (2, num_blocks, H, block_size, D)
_CANON = ("kv", "blocks", "tokens", "heads", "dim")


class Staged:
    """Blocks a save took from the engine's memory: :meth:`wait` returns once they have left it (the engine may
    then overwrite them), :meth:`sources` gives their bytes in the pool's layout. Host caches read the blocks
    only when :meth:`sources` is called (on the connector's save thread); a device cache
    (``kvpool.device.DeviceKv``) starts copying them to host memory when the save is staged."""

    def __init__(self, kv: "PagedKv", block_ids: Sequence[int]) -> None:
        self._kv = kv
        self._block_ids = list(block_ids)

    def wait(self) -> None:
        return None

    def sources(self) -> list[Any]:
        return self._kv.save_sources(self._block_ids)


class PagedKv:
    """What a connector needs of an engine's paged KV memory. Subclasses give ``block_size``,
    ``num_layers``, ``block_bytes`` and either :meth:`block` (a block is contiguous: zero-copy) or
    both :meth:`load_targets` and :meth:`save_sources` (staged)."""

    block_size: int
    num_layers: int
    block_bytes: int

    @property
    def kv_dtype(self) -> str:
        """The KV dtype as keys spell it (``f32``, ``bf16``, ``f16``)."""
        raise NotImplementedError

    def block(self, block_id: int) -> Any:
        """Block ``block_id``'s memory: a writable contiguous buffer of ``block_bytes`` bytes."""
        raise NotImplementedError

    def load_targets(self, block_ids: Sequence[int]) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        """Buffers to read the blocks' objects into, and a function to call with which reads succeeded
        (it puts those in place; blocks whose read failed are left untouched)."""
        return [self.block(b) for b in block_ids], _nothing

    def save_sources(self, block_ids: Sequence[int]) -> list[Any]:
        """Buffers holding the blocks' bytes in the pool's layout."""
        return [self.block(b) for b in block_ids]

    def stage_save(self, block_ids: Sequence[int]) -> Any:
        """The blocks' save, started on the engine's thread once the step's layers are computed: a
        :class:`Staged` (or anything with its ``wait`` and ``sources``). Default: read on the save thread."""
        return Staged(self, block_ids)

    def object_bytes(self, block_id: int) -> int:
        """The bytes of block ``block_id``'s pool object: ``block_bytes`` (a cache of several KV cache groups,
        ``kvpool.connector.groups.GroupedKv``, answers per group)."""
        return self.block_bytes

    def layer_computed(self, layer: int) -> None:
        """The engine's thread says layer ``layer`` of the step was computed (before its layer-by-layer save
        reads it on the save thread): a device cache records where the engine's stream is. Default: nothing."""
        return None

    @property
    def layer_bytes(self) -> int:
        """The bytes of one layer of one block: ``block_bytes / num_layers``."""
        return self.block_bytes // self.num_layers

    def layer_targets(self, block_ids: Sequence[int], layer: int) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        """Buffers of ``layer_bytes`` to read layer ``layer`` of the blocks' objects into, and a function to
        call with which reads succeeded (it puts those in place; a failed read leaves its block's layer
        unspecified). Default: views of :meth:`block`."""
        lb = self.layer_bytes
        return [as_memoryview(self.block(b), writable=True)[layer * lb:(layer + 1) * lb] for b in block_ids], _nothing

    #: True if :meth:`layer_run_targets` takes runs of several layers; a cache that cannot (its layers are apart)
    #: is read a layer at a time
    layer_runs: bool = False

    def layer_run_targets(self, block_ids: Sequence[int], first: int, count: int) \
            -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        """:meth:`layer_targets` for layers ``first .. first + count - 1`` together: per block one buffer of
        ``count * layer_bytes``, the contiguous range of its object those layers are. Several layers only where
        :attr:`layer_runs`. Default: :meth:`layer_targets` for one layer, views of :meth:`block` for several."""
        if count == 1:
            return self.layer_targets(block_ids, first)
        lb = self.layer_bytes
        return ([as_memoryview(self.block(b), writable=True)[first * lb:(first + count) * lb] for b in block_ids],
                _nothing)

    def layer_sources(self, block_ids: Sequence[int], layer: int) -> list[Any]:
        """Buffers holding layer ``layer`` of the blocks in the pool's layout. Default: views of :meth:`block`."""
        lb = self.layer_bytes
        return [as_memoryview(self.block(b))[layer * lb:(layer + 1) * lb] for b in block_ids]


def _nothing(ok: Sequence[bool]) -> None:
    return None


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


class PagedKvCache(PagedKv):
    """``num_blocks`` KV blocks in one contiguous array, block-major in the pool's block layout.

    Args:
        num_blocks, num_layers, block_size, num_kv_heads, head_size: the cache's shape.
        dtype: element type (default float32: the reference engine's ``f32``); a numpy dtype for
            ``backend="numpy"``, a torch dtype (or its name, e.g. ``"bfloat16"``) for ``"torch"``.
        backend: ``"numpy"`` or ``"torch"`` (CPU tensors); imported only when used.
        data: an existing contiguous array or tensor of shape ``(num_blocks, num_layers, 2,
            block_size, num_kv_heads, head_size)`` to wrap instead of allocating (e.g. vLLM's
            cross-layer KV cache); the other arguments are then read from it.
    """

    layer_runs = True  # a block is contiguous: several layers are one range of it

    def __init__(self, num_blocks: int = 0, num_layers: int = 0, block_size: int = 16, num_kv_heads: int = 0,
                 head_size: int = 0, dtype: Any = "float32", backend: str = "numpy", data: Any = None) -> None:
        if data is None:
            for name, v in (("num_blocks", num_blocks), ("num_layers", num_layers), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_size", head_size)):
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"paged KV cache: {name} must be at least 1, got {v!r}")
            shape = (num_blocks, num_layers, 2, block_size, num_kv_heads, head_size)
            if backend == "numpy":
                import numpy as np
                data = np.zeros(shape, dtype=np.dtype(dtype))
            elif backend == "torch":
                import torch
                td = getattr(torch, dtype) if isinstance(dtype, str) else dtype
                data = torch.zeros(shape, dtype=td, device="cpu")
            else:
                raise ValueError(f"paged KV cache: backend must be numpy or torch, got {backend!r}")
        if len(data.shape) != 6 or data.shape[2] != 2:
            raise ValueError("paged KV cache: data must have shape (num_blocks, num_layers, 2, block_size, "
                             f"num_kv_heads, head_size), got {tuple(data.shape)}")
        self._torch = _is_torch(data)
        if self._torch:
            if data.device.type != "cpu" or not data.is_contiguous():
                raise ValueError("paged KV cache: the tensor must be a contiguous CPU tensor")
            itemsize = data.element_size()
        else:
            if not data.flags.c_contiguous:
                raise ValueError("paged KV cache: the array must be C-contiguous")
            itemsize = data.itemsize
        self.data = data
        (self.num_blocks, self.num_layers, _, self.block_size, self.num_kv_heads,
         self.head_size) = (int(d) for d in data.shape)
        self.dtype = data.dtype
        self.block_bytes = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_size * itemsize
        if not self._torch:
            import numpy as np
            self._bytes = data.reshape(-1).view(np.uint8).reshape(self.num_blocks, self.block_bytes)

    @property
    def kv_dtype(self) -> str:
        """The key's spelling of this cache's dtype (``f32``, ``bf16``, ...)."""
        return dtype_name(self.dtype)

    def block(self, block_id: int) -> Any:
        """Block ``block_id`` as a contiguous writable view (a uint8 array, or the block's tensor)."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"KV block {block_id} outside 0..{self.num_blocks - 1}")
        return self.data[block_id] if self._torch else self._bytes[block_id]

    def block_view(self, block_id: int) -> Any:
        """Block ``block_id`` shaped ``(num_layers, 2, block_size, num_kv_heads, head_size)``."""
        return self.data[block_id]

    def layer(self, layer: int) -> Any:
        """Layer ``layer``'s KV as vLLM's NHD per-layer view ``(2, num_blocks, block_size, H, D)`` (no copy)."""
        v = self.data[:, layer]
        return v.permute(1, 0, 2, 3, 4) if self._torch else v.transpose(1, 0, 2, 3, 4)

    def layer_hnd(self, layer: int) -> Any:
        """Layer ``layer``'s KV in vLLM's CPU backend shape ``(2, num_blocks, H, block_size, D)`` (no copy)."""
        v = self.data[:, layer]
        return v.permute(1, 0, 3, 2, 4) if self._torch else v.transpose(1, 0, 3, 2, 4)

    def __repr__(self) -> str:
        return (f"PagedKvCache({self.num_blocks} blocks x {self.num_layers} layers x {self.block_size} tokens x "
                f"{self.num_kv_heads} heads x {self.head_size}, {self.dtype}, {self.block_bytes} bytes a block)")


class LayeredPagedKv(PagedKv):
    """Per-layer torch CPU KV caches (vLLM's ``register_kv_caches``), moved to and from the pool's
    block layout through one staging copy per block.

    Args:
        layers: one entry per layer, in layer order: a tensor of the per-layer logical shape described
            by ``layout`` (``NHD``: ``(2, num_blocks, block_size, H, D)``; ``HND``: ``(2, num_blocks, H,
            block_size, D)``), or a ``(K, V)`` pair of ``(num_blocks, block_size, H, D)`` views (for
            caches whose K and V are laid out differently, as vLLM 0.32's CPU backend keeps them).
            Strided views are fine.
        block_size: tokens per block; must equal the tensors' token dimension.
        layout: the dimension names of a layer tensor (a permutation of ``NHD``); unused for pairs.
    """

    def __init__(self, layers: Sequence[Any], block_size: int, layout: Sequence[str] = NHD) -> None:
        import torch
        if not layers:
            raise ValueError("layered KV cache: no layers")
        layout = tuple(layout)
        if sorted(layout) != sorted(_CANON):
            raise ValueError(f"layered KV cache: layout must name the dimensions {_CANON}, got {layout}")
        perm = [layout.index(d) for d in _CANON]
        self._kv: list[tuple[Any, Any]] = []  # per layer: K and V, each (num_blocks, tokens, heads, dim)
        for i, t in enumerate(layers):
            if isinstance(t, (tuple, list)):
                if len(t) != 2:
                    raise ValueError(f"layered KV cache: layer {i} is a sequence of {len(t)} tensors, not (K, V)")
                self._kv.append((t[0], t[1]))
            else:
                c = t.permute(*perm)  # (2, num_blocks, tokens, heads, dim)
                if c.shape[0] != 2:
                    raise ValueError(f"layered KV cache: the K/V dimension has {c.shape[0]} entries, not 2")
                self._kv.append((c[0], c[1]))
        k0 = self._kv[0][0]
        for i, (k, v) in enumerate(self._kv):
            for t in (k, v):
                if t.dim() != 4 or tuple(t.shape) != tuple(k0.shape) or t.dtype != k0.dtype:
                    raise ValueError(f"layered KV cache: layer {i} has K/V of shape {tuple(t.shape)} / {t.dtype}, "
                                     f"layer 0 {tuple(k0.shape)} / {k0.dtype}")
                if t.device.type != "cpu":
                    raise ValueError(f"layered KV cache: layer {i} is on {t.device}; kvpool moves host memory only")
        if k0.shape[1] != block_size:
            raise ValueError(f"layered KV cache: the layers' blocks hold {k0.shape[1]} tokens but the block "
                             f"size is {block_size} (kernel blocks smaller than the cache block are not supported)")
        self._torch = torch
        self.num_layers = len(self._kv)
        self.num_blocks = int(k0.shape[0])
        self.block_size = block_size
        self.num_kv_heads = int(k0.shape[2])
        self.head_size = int(k0.shape[3])
        self.dtype = k0.dtype
        self._block_shape = (self.num_layers, 2, block_size, self.num_kv_heads, self.head_size)
        self.block_bytes = self.num_layers * 2 * block_size * self.num_kv_heads * self.head_size * k0.element_size()

    @property
    def kv_dtype(self) -> str:
        return dtype_name(self.dtype)

    def _check(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"KV block {block_id} outside 0..{self.num_blocks - 1}")

    def gather(self, block_id: int, out: Optional[Any] = None) -> Any:
        """Block ``block_id`` in the pool's layout, as a contiguous tensor (into ``out`` if given)."""
        self._check(block_id)
        if out is None:
            out = self._torch.empty(self._block_shape, dtype=self.dtype)
        for layer, (k, v) in enumerate(self._kv):
            out[layer, 0].copy_(k[block_id])
            out[layer, 1].copy_(v[block_id])
        return out

    def scatter(self, block_id: int, src: Any) -> None:
        """Puts ``src`` (one block in the pool's layout) into block ``block_id`` of every layer."""
        self._check(block_id)
        for layer, (k, v) in enumerate(self._kv):
            k[block_id].copy_(src[layer, 0])
            v[block_id].copy_(src[layer, 1])

    def load_targets(self, block_ids: Sequence[int]) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        for b in block_ids:
            self._check(b)
        staging = self._torch.empty((len(block_ids),) + self._block_shape, dtype=self.dtype)
        targets = [staging[i] for i in range(len(block_ids))]

        def commit(ok: Sequence[bool]) -> None:
            for i, b in enumerate(block_ids):
                if ok[i]:
                    self.scatter(b, targets[i])
        return targets, commit

    def save_sources(self, block_ids: Sequence[int]) -> list[Any]:
        return [self.gather(b) for b in block_ids]

    def layer_targets(self, block_ids: Sequence[int], layer: int) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        for b in block_ids:
            self._check(b)
        staging = self._torch.empty((len(block_ids),) + self._block_shape[1:], dtype=self.dtype)
        k, v = self._kv[layer]

        def commit(ok: Sequence[bool]) -> None:
            for i, b in enumerate(block_ids):
                if ok[i]:
                    k[b].copy_(staging[i, 0])
                    v[b].copy_(staging[i, 1])
        return [staging[i] for i in range(len(block_ids))], commit

    def layer_sources(self, block_ids: Sequence[int], layer: int) -> list[Any]:
        for b in block_ids:
            self._check(b)
        out = self._torch.empty((len(block_ids),) + self._block_shape[1:], dtype=self.dtype)
        k, v = self._kv[layer]
        for i, b in enumerate(block_ids):
            out[i, 0].copy_(k[b])
            out[i, 1].copy_(v[b])
        return [out[i] for i in range(len(block_ids))]

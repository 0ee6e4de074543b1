"""How ``kvpool.vllm`` reads the KV caches vLLM hands a worker connector (``register_kv_caches``,
``register_cross_layers_kv_cache``) into the connector's :class:`~kvpool.connector.PagedKv`:

* GPU backends' caches (CUDA tensors, or ``device_edge: cpu``): vLLM 0.32's ``[B, H, N, C]`` views in any
  ``KVCacheLayout``, through the ``KVCacheConfig`` (``kvpool.device.vllm_layout``), moved by the device edge;
* vLLM's CPU backend: its views, K read where its ``vec`` kernel packs it (:meth:`CacheReader.split_kv`);
* several KV cache groups (``kvpool.vllm_hybrid``): one cache per group behind a ``GroupedKv``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .connector.groups import GroupedKv
from .connector.keys import KeyFormat
from .connector.paged import HND, NHD, LayeredPagedKv, PagedKv, PagedKvCache
from .vllm_hybrid import Hybrid

__all__ = ["CacheReader", "model_order"]

log = logging.getLogger("kvpool.vllm")


def model_order(names: list[str]) -> list[str]:
    """Layer names in the model's order: by the one number in each name (``model.layers.3.self_attn.attn``:
    3, as vLLM's ``extract_layer_index``), or as given when a name has none or several."""
    numbers = [[int(p) for p in n.split(".") if p.isdigit()] for n in names]
    if any(len(x) != 1 for x in numbers):
        return names
    return [n for _, n in sorted(zip((x[0] for x in numbers), names), key=lambda e: e[0])]


_model_order = model_order


class CacheReader:
    """What a worker connector knows when vLLM hands it caches: the extra config, block size, key format (its
    dtype), the cache layout name of the CPU backend, vLLM's ``KVCacheConfig`` and the hybrid groups."""

    def __init__(self, extra: dict, block_size: int, keys: KeyFormat, kv_layout: tuple, kv_cache_config: Any,
                 hybrid: Optional[Hybrid], vllm_config: Any) -> None:
        self.extra = extra
        self.block_size = block_size
        self.keys = keys
        self.kv_layout = kv_layout
        self.kv_cache_config = kv_cache_config
        self.hybrid = hybrid
        self._vllm_config = vllm_config

    def read(self, kv_caches: dict) -> tuple[PagedKv, dict[str, int]]:
        """The layers' KV caches, as vLLM hands them: the connector's :class:`PagedKv` over them and each layer
        name's place in a block.

        On a GPU (CUDA tensors, or ``device_edge: cpu``): vLLM 0.32's ``[B, H, N, C]`` views in any
        ``KVCacheLayout``, read through the ``KVCacheConfig`` vLLM gave this connector
        (``kvpool.device.vllm_layout``) and moved by the device edge (``kvpool.device``).

        On vLLM's CPU backend: ``[B, H, N, C]`` views (``C`` is K then V as the ``kv_layout`` says) or, from
        older vLLM, ``(2, B, H, N, D)`` (HND) or ``(2, B, N, H, D)`` (NHD). Blocks move through one staging copy
        each (per layer when ``layerwise``).

        Layer ``i`` of a block in the pool is the ``i``-th layer in the model's order: the number in the
        layer's name (vLLM's ``extract_layer_index``), or the order vLLM hands them in when a name has no
        single number. That is also the order of the forward pass, which layerwise saves rely on. Layers
        sharing one cache (vLLM's KV sharing) are registered once, and their names stand for that layer."""
        edge = self._edge_choice(kv_caches)
        if self.hybrid is not None:
            return self._groups(kv_caches, edge)
        if edge is not None:
            return self._device_caches(kv_caches, edge)
        names: list[str] = []
        first: dict[tuple, str] = {}
        alias: dict[str, str] = {}
        for n in _model_order(list(kv_caches)):
            t = kv_caches[n]
            ident = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            if ident in first:  # a layer reusing another layer's KV cache: saved and loaded once
                alias[n] = first[ident]
                continue
            first[ident] = n
            names.append(n)
        index = {n: i for i, n in enumerate(names)}
        index.update({n: index[a] for n, a in alias.items()})
        layers = [kv_caches[n] for n in names]
        if layers and layers[0].dim() == 4:
            kv = LayeredPagedKv([self.split_kv(t) for t in layers], self.block_size, NHD)
        else:
            kv = LayeredPagedKv(layers, self.block_size, self.kv_layout)
        self._check_dtype(kv.kv_dtype)
        return kv, index

    def _groups(self, kv_caches: dict, edge_choice: Optional[str]) -> tuple[PagedKv, dict[str, int]]:
        """Several KV cache groups: one cache per group (through the device edge, or vLLM's CPU backend views)
        behind a :class:`GroupedKv`; a block of group ``n`` is ref ``n`` (``kvpool.connector.groups``)."""
        assert self.hybrid is not None
        from .device.vllm_layout import read_groups
        per_group: dict[int, PagedKv] = {}
        names: list[str] = []
        aliases: dict[str, str] = {}
        for g in read_groups(self.kv_cache_config, kv_caches):
            n = self.hybrid.order.index(g.index)
            # a state group (Mamba) has no K/V planes for the CPU backend's views: its bytes move through the edge
            choice = edge_choice if edge_choice is not None or g.kind != "mamba" else "cpu"
            if choice is not None:
                from .device import DeviceKv, edge_for
                per_group[n] = DeviceKv(g.views, g.fmt, self.block_size, edge_for(g.views[0], choice),
                                        self.keys.kv_dtype, num_blocks=g.num_blocks)
            else:
                per_group[n] = LayeredPagedKv([self.split_kv(t) for t in g.views], self.block_size, NHD)
                self._check_dtype(per_group[n].kv_dtype)
            names += g.names
            aliases.update(g.aliases)
        kv = GroupedKv(per_group)
        ordered = _model_order(names)
        kv.num_layers = len(ordered)  # the whole-block save starts after the model's last layer
        index = {n: i for i, n in enumerate(ordered)}
        index.update({n: index[a] for n, a in aliases.items()})
        log.info("kvpool connector: %d KV cache groups (%s): %s", len(per_group),
                 ", ".join(r.kind for r in self.hybrid.rules), kv)
        return kv, index

    def _edge_choice(self, kv_caches: dict) -> Optional[str]:
        """``cuda`` or ``cpu`` when the caches go through the device edge, None for vLLM's CPU backend."""
        choice = str(self.extra.get("device_edge", "auto")).lower()
        if choice not in ("auto", "cuda", "cpu"):
            raise ValueError(f"kv_connector_extra_config.device_edge must be auto, cuda or cpu, got {choice!r}")
        if choice != "auto":
            return choice
        on_gpu = any(getattr(getattr(t, "device", None), "type", "cpu") == "cuda" for t in kv_caches.values())
        return "cuda" if on_gpu else None

    def _device_caches(self, kv_caches: dict, choice: str) -> tuple[PagedKv, dict[str, int]]:
        """The GPU backends' caches: one :class:`kvpool.device.DeviceKv` over the group's views."""
        from .device import DeviceKv, edge_for
        from .device.vllm_layout import read_groups
        groups = read_groups(self.kv_cache_config, kv_caches)
        if len(groups) > 1:
            kinds = ", ".join(f"{g.index}: {g.kind}" for g in groups)
            raise ValueError(f"kvpool connector: this model has {len(groups)} KV cache groups ({kinds}); "
                             "models with several KV cache groups (hybrid attention) are not supported yet")
        group = groups[0]
        spec_block = int(self.kv_cache_config.kv_cache_groups[group.index].kv_cache_spec.block_size)
        if spec_block != self.block_size:
            raise ValueError(f"kvpool connector: KV cache group {group.index} holds {spec_block} tokens a block, "
                             f"the engine's block size is {self.block_size}")
        edge = edge_for(group.views[0], choice)
        kv = DeviceKv(group.views, group.fmt, self.block_size, edge, self.keys.kv_dtype, num_blocks=group.num_blocks)
        index = {n: i for i, n in enumerate(group.names)}
        index.update({n: index[a] for n, a in group.aliases.items()})
        log.info("kvpool connector: %s (%s, layout %s)", kv, group.kind, group.layout or "?")
        return kv, index

    def split_kv(self, t: Any) -> Any:
        """A ``[B, H, N, C]`` layer view as views (no copy) of its K and V, each ``(B, N, H, D)``.

        vLLM's CPU backend (HND) splits a block's head ``[N, 2D]`` into a K half and a V half
        (``view(B, H, 2N, D).chunk(2, dim=2)``) and its ``vec`` kernels (x86 without AMX, fp32/fp16/bf16)
        store the K half transposed, ``[D][N]``, and the V half as ``[N][D]``: K is read transposed here.
        Other CPU kernels (AMX, NEON, 16-wide) pack K differently and are refused. FlashAttention (NHD)
        keeps each token's ``C`` as K then V."""
        b, h, n, c = (int(d) for d in t.shape)
        if c % 2:
            raise ValueError(f"kvpool connector: a KV cache layer's content holds {c} values, not K and V of "
                             "one head size (MLA and quantized caches are not supported)")
        d = c // 2
        if self.kv_layout != HND:
            kv = t.unflatten(3, (2, d))  # (B, H, N, 2, D)
            return (kv[:, :, :, 0].permute(0, 2, 1, 3), kv[:, :, :, 1].permute(0, 2, 1, 3))
        isa = self._cpu_attention_isa(t.dtype, d)
        if isa != "vec":
            raise ValueError(f"kvpool connector: vLLM's CPU attention kernel {isa!r} packs K in a layout this "
                             "connector does not read (only the 'vec' kernel's, x86 without AMX)")
        try:
            halves = t.view(b, h, 2, n * d)  # the CPU kernel's own view: (B, H, 2N, D) split in K and V halves
        except RuntimeError as e:
            raise ValueError(f"kvpool connector: a [B, H, N, C] KV cache of strides {tuple(t.stride())} is "
                             "not laid out as vLLM's CPU backend lays it (kv_layout HND)") from e
        k = halves[:, :, 0].unflatten(2, (d, n)).permute(0, 3, 1, 2)  # [D][N] per head -> (B, N, H, D)
        v = halves[:, :, 1].unflatten(2, (n, d)).permute(0, 2, 1, 3)
        return (k, v)

    def _cpu_attention_isa(self, dtype: Any, head_size: int) -> str:
        """The kernel vLLM's CPU attention backend picks for this cache (``_get_attn_isa``), or ``vec``
        when it cannot be asked (``kv_cpu_isa`` in the extra config overrides)."""
        if "kv_cpu_isa" in self.extra:
            return str(self.extra["kv_cpu_isa"])
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # type: ignore[import-not-found]
            cache_dtype = getattr(self._vllm_config.cache_config, "cache_dtype", None)
            return str(_get_attn_isa(dtype, self.block_size, head_size, cache_dtype))
        except Exception:  # noqa: BLE001 - an older or newer vLLM without it
            return "vec"

    def cross_layer(self, kv_cache: Any, attn_backend: Any = None) -> PagedKv:
        """One cache for all layers (when ``prefer_cross_layer_blocks`` and the backend agree). When its
        physical layout is ``(num_blocks, num_layers, 2, block_size, H, D)`` (FlashAttention, NHD) a
        block is the pool's object as is: loads and saves are zero-copy. Otherwise per-layer views
        with staging."""
        labels = self._cross_layer_labels(kv_cache, attn_backend)
        physical = ("blocks", "layers", "kv", "tokens", "heads", "dim")
        kv: PagedKv
        if labels == physical and kv_cache.is_contiguous():
            kv = PagedKvCache(data=kv_cache)
            if kv.block_size != self.block_size:
                raise ValueError(f"cross-layer KV cache holds {kv.block_size} tokens a block; the block size "
                                 f"is {self.block_size}")
        else:
            perm = [labels.index(d) for d in ("layers", "kv", "blocks", "tokens", "heads", "dim")]
            logical = kv_cache.permute(*perm)
            kv = LayeredPagedKv([logical[i] for i in range(logical.shape[0])], self.block_size, NHD)
        self._check_dtype(kv.kv_dtype)
        return kv

    def _cross_layer_labels(self, kv_cache: Any, attn_backend: Any) -> tuple:
        """The dimension names of the cross-layer tensor's physical (allocated) order."""
        if attn_backend is None:  # assume the FlashAttention NHD cross-layer order
            return ("blocks", "layers", "kv", "tokens", "heads", "dim")
        test = tuple(attn_backend.get_kv_cache_shape(1234, 16, 1, 256))
        names = {1234: "blocks", 16: "tokens", 1: "heads", 256: "dim", 2: "kv"}
        logical = ("layers",) + tuple(names[d] for d in test)
        try:
            order = tuple(attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
        except (AttributeError, NotImplementedError, TypeError):
            order = tuple(range(len(logical)))
        return tuple(logical[i] for i in order)

    def _check_dtype(self, cache_dtype: str) -> None:
        if cache_dtype != self.keys.kv_dtype:
            raise ValueError(f"kvpool connector: the KV cache holds {cache_dtype} but keys say {self.keys.kv_dtype} "
                             "(set kv_connector_extra_config.kv_dtype)")

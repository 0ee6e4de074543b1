"""Reading the KV cache vLLM allocated, from vLLM's own layout model (vLLM 0.32, RFC #42082).

vLLM hands a connector its ``KVCacheConfig`` (the worker's third constructor argument) and, in
``register_kv_caches``, one logical ``[B, H, N, C]`` view per layer, made by
``vllm.v1.kv_cache_interface.create_kv_cache_views`` over flat buffers in the ``KVCacheLayout`` the engine
core resolved (``KVCacheConfig.kv_cache_layout``). The physical layout is in the views' strides; what the
content ``C`` of a cell holds comes from the group's ``KVCacheSpec``:

* ``AttentionSpec`` (full attention, sliding window, chunked local attention): ``H = spec.num_heads`` head
  slots, ``N = spec.num_states`` token states, ``C = spec.state_content_size_bytes``; when
  ``state_content_bytes`` is unset and ``head_size_v > 0`` the cell is dense ``[K: head_size][V:
  head_size_v]`` of ``spec.dtype`` (FlashAttention and Triton split it so); otherwise one plane (MLA's latent
  vector: ``head_size_v == 0``; a backend's packed quantized cell).
* ``MambaSpec`` (Mamba / linear-attention state, vLLM's ``align`` cache mode): ``H = spec.num_heads`` (1),
  ``N = spec.num_states`` (1: one state a block), ``C = spec.state_content_size_bytes``: the layer's state
  tensors (conv, SSM, ...) packed as the model lays them out, bytes to the pool; a padded page's padding is
  outside the view and never moved;
* anything else (HiSparse pools, specs without per-layer views) is refused at registration with a message
  naming the group and its spec.

Nothing here imports vLLM: the spec and config are read by attribute, so the same code reads the objects of
the pinned vLLM (the peer suite) and of a newer one, and refuses what it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .blocks import PageFormat

__all__ = ["GroupCaches", "page_format", "read_groups"]


@dataclass(frozen=True)
class GroupCaches:
    """One KV cache group as the connector moves it: its index in vLLM's config, spec kind, page format, its
    layers' names in the model's order (each layer's cache registered once: layers sharing a cache are
    aliases) and their ``[B, H, N, C]`` views."""

    index: int
    kind: str
    fmt: PageFormat
    names: list[str]
    views: list[Any]
    aliases: dict[str, str]
    num_blocks: int
    layout: Optional[str]


def _spec_name(spec: Any) -> str:
    return type(spec).__name__


def page_format(spec: Any, what: str = "KV cache group") -> PageFormat:
    """The page format of a vLLM ``KVCacheSpec``. Raises ValueError naming the spec when it is not one this
    module reads."""
    name = _spec_name(spec)
    if _is_state(spec):
        return PageFormat(int(spec.num_heads), int(spec.num_states), int(spec.state_content_size_bytes))
    if not hasattr(spec, "num_kv_heads") or not hasattr(spec, "head_size"):
        raise ValueError(f"kvpool connector: {what} has a {name}, not an attention spec kvpool reads")
    if getattr(spec, "has_layer_views", True) is False:
        raise ValueError(f"kvpool connector: {what} ({name}) lays out its own memory, without per-layer views")
    heads = int(spec.num_heads)
    tokens = int(spec.num_states)
    content = int(spec.state_content_size_bytes)
    k_bytes: Optional[int] = None
    head_size_v = int(getattr(spec, "head_size_v", 0) or 0)
    if getattr(spec, "state_content_bytes", None) is None and head_size_v > 0:
        item = content // (int(spec.head_size) + head_size_v)
        k_bytes = int(spec.head_size) * item
        if k_bytes * (int(spec.head_size) + head_size_v) != content * int(spec.head_size):
            raise ValueError(f"kvpool connector: {what} ({name}) has {content} content bytes, not K of "
                             f"{spec.head_size} and V of {head_size_v} elements")
    return PageFormat(heads, tokens, content, k_bytes)


def _is_state(spec: Any) -> bool:
    """A recurrent state spec (``MambaSpec``: its state tensors' ``shapes`` and ``dtypes``)."""
    return hasattr(spec, "shapes") and hasattr(spec, "dtypes")


def _kind(spec: Any) -> str:
    name = _spec_name(spec)
    if _is_state(spec):
        return "mamba"
    if "MLA" in name:
        return "mla_attention"
    if "SlidingWindow" in name or getattr(spec, "sliding_window", None):
        return "sliding_window"
    if "ChunkedLocal" in name:
        return "chunked_local_attention"
    return "full_attention"


def _model_order(names: Sequence[str]) -> list[str]:
    """Layer names in the model's order: by the one number in each name (``model.layers.3.self_attn.attn``),
    or as given when a name has none or several."""
    numbers = [[int(p) for p in n.split(".") if p.isdigit()] for n in names]
    if any(len(x) != 1 for x in numbers):
        return list(names)
    return [n for _, n in sorted(zip((x[0] for x in numbers), names), key=lambda e: e[0])]


def read_groups(kv_cache_config: Any, kv_caches: dict[str, Any]) -> list[GroupCaches]:
    """The transferable KV cache groups of ``kv_cache_config`` with their layers' views from ``kv_caches``
    (``register_kv_caches``' argument). Groups vLLM marks not transferable (``enable_kv_transfer`` false:
    replicas rebuilt on the device after a load) are left out.

    Raises ValueError naming what it cannot read: a spec kind, a layer without a cache, a view whose shape
    disagrees with its spec."""
    if kv_cache_config is None:
        raise ValueError("kvpool connector: vLLM gave the worker no KVCacheConfig (vLLM 0.32 or newer passes it "
                         "to the connector's constructor)")
    num_blocks = int(kv_cache_config.num_blocks)
    layout = getattr(kv_cache_config, "kv_cache_layout", None)
    groups: list[GroupCaches] = []
    for g, group in enumerate(kv_cache_config.kv_cache_groups):
        if getattr(group, "enable_kv_transfer", True) is False:
            continue
        spec = group.kv_cache_spec
        what = f"KV cache group {g} ({len(group.layer_names)} layers)"
        fmt = page_format(spec, what)
        names: list[str] = []
        views: list[Any] = []
        aliases: dict[str, str] = {}
        first: dict[tuple, str] = {}
        for n in _model_order(list(group.layer_names)):
            t = kv_caches.get(n)
            if t is None:
                raise ValueError(f"kvpool connector: {what}'s layer {n!r} has no KV cache among the "
                                 f"{len(kv_caches)} vLLM registered")
            ident = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            if ident in first:  # KV sharing: this layer reads another layer's cache
                aliases[n] = first[ident]
                continue
            first[ident] = n
            names.append(n)
            views.append(t)
        groups.append(GroupCaches(g, _kind(spec), fmt, names, views, aliases, num_blocks, layout))
    if not groups:
        raise ValueError("kvpool connector: no KV cache group of this model is transferable")
    return groups

"""Paged KV on a device, moved to and from the pool's canonical block layout through a :class:`DeviceEdge`.

What a layer's cache is. Every GPU attention backend of vLLM 0.32 sees a layer's cache as the logical
``[B, H, N, C]`` view (blocks, head slots, token states of a block, content), whatever the physical layout
(``KVCacheLayout``: LBNHC, LBHNC, BLNHC, BLHNC, ...: only the strides differ, and the content ``C`` is always
innermost and dense). ``C`` is, per head slot and token: ``[K: head_size][V: head_size_v]`` for dense
attention (FlashAttention, Triton, FlashInfer); one latent vector for MLA (``head_size_v == 0``); a backend's
own packing (quantized values with their scales) when the spec says ``state_content_bytes``. fp8 caches are
bytes like any other.

The canonical block (what the pool stores, whatever the device or layout)::

    for each layer l of the group, in the model's order:
        dense K/V:   [K: token][head][head_size bytes]   then   [V: token][head][head_size_v bytes]
        otherwise:   [token][head][C bytes]

which for dense attention is the Java reference engine's ``[layer][K/V][token][head][dim]``
(``kvpool.connector.paged``), so a GPU engine, vLLM on CPU and the reference engine share blocks. Layer
``l``'s bytes are the range ``[l * layer_bytes, (l + 1) * layer_bytes)`` of a block, as layer-by-layer loads
and saves expect.

How bytes move (the same code on every edge). A save gathers the blocks on the device, in canonical order,
into one device buffer (``index_select`` then one strided copy per plane and layer: device kernels, on the
edge's side stream, after the event the engine's stream recorded when the save was asked for); the engine may
overwrite the blocks once that gather is done. Each gathered block is then a pool value that writes itself
(:class:`DeviceBlock`, a ``kvpool.buffers.Filler``): on the same-machine path the client hands it its place in
the node's mapped segment under a write lease and the edge copies it there, one transfer (on a GPU a DMA into
the segment, registered with the device once), checksummed where it landed; over TCP it is copied once into the
edge's host memory (pinned on a GPU) and sent from there. A load reads the objects into one host buffer, copies
it to the device in one transfer, and scatters it into the blocks (``index_copy_`` per layer), the CPU waiting
for those copies before the layer is reported in. On a CPU edge the "device" buffers are host tensors and the
copies happen at once.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from ..buffers import Filler, as_memoryview
from ..connector.paged import PagedKv, Staged
from .edge import DeviceEdge, Event

__all__ = ["PageFormat", "DeviceKv", "StagedSave", "DeviceBlock"]


@dataclass(frozen=True)
class PageFormat:
    """One layer's page of one block: ``heads`` x ``tokens`` cells of ``content`` bytes; ``k_bytes``: the K
    part of a cell when it is dense K then V (``None``: one plane, e.g. MLA's latent vector or a packed
    quantized cell)."""

    heads: int
    tokens: int
    content: int
    k_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("heads", "tokens", "content"):
            if getattr(self, name) < 1:
                raise ValueError(f"page format: {name} must be at least 1, got {getattr(self, name)}")
        if self.k_bytes is not None and not 0 < self.k_bytes < self.content:
            raise ValueError(f"page format: K takes {self.k_bytes} of {self.content} content bytes")

    @property
    def page_bytes(self) -> int:
        return self.heads * self.tokens * self.content


class DeviceBlock(Filler):
    """One gathered block on the device, as a pool value (:class:`kvpool.buffers.Filler`): on the same-machine
    path it is copied straight into the node's segment (the segment registered with the device once, so the copy
    is one DMA into it), anywhere else once into host memory of the edge (pinned on a GPU)."""

    def __init__(self, edge: DeviceEdge, dev: Any) -> None:
        self._edge = edge
        self._dev = dev  # (nbytes,) uint8 on the device, written by the gather (ordered before on the side stream)
        self.nbytes = int(dev.numel())
        self._host: Optional[Any] = None

    def fill(self, address: int, mapping: Any) -> None:
        edge = self._edge
        edge.register_mapping(mapping)  # once per mapping; a refusal only makes the copy slower
        dst = torch.frombuffer((ctypes.c_char * self.nbytes).from_address(address), dtype=torch.uint8)
        edge.copy(dst, self._dev)
        edge.done().wait()

    def materialize(self) -> memoryview:
        if self._host is None:
            host = self._edge.host(self.nbytes)
            self._edge.copy(host, self._dev)
            self._edge.done().wait()
            self._host = host
        # through numpy, so that the view owns the tensor (a view of its address alone would outlive it)
        return memoryview(self._host.numpy()).cast("B")


class StagedSave(Staged):
    """Blocks gathered on the device in canonical order: :meth:`wait` returns once the gather is done (the engine
    may then overwrite the blocks; never waits for the network), :meth:`sources` gives each block as a
    :class:`DeviceBlock` the put moves from there."""

    def __init__(self, edge: DeviceEdge, dev: Any, count: int, block_bytes: int, done: Event) -> None:  # noqa: D107
        # (no super().__init__: the blocks are gathered already, nothing is read from the cache later)
        self._edge = edge
        self._dev = dev
        self._count = count
        self._block_bytes = block_bytes
        self.done = done

    def wait(self) -> None:
        self.done.wait()

    def sources(self) -> list[Any]:
        self.done.wait()
        if self._dev is None:
            return []
        return [DeviceBlock(self._edge, self._dev[i]) for i in range(self._count)]


def _as_bytes(t: Any, num_blocks: Optional[int], what: str) -> Any:
    """A ``[B, H, N, C]`` cache view as uint8 ``[B, R, H, n, C * itemsize]`` (no copy): ``R`` kernel blocks of
    ``n`` token states each per block (vLLM splits a block into kernel blocks when its attention kernel takes
    fewer tokens than the cache block holds; ``R`` is 1 otherwise)."""
    if t.dim() != 4:
        raise ValueError(f"{what}: a layer cache must be the 4-D [B, H, N, C] view vLLM hands connectors, got "
                         f"shape {tuple(t.shape)}")
    if t.stride(3) != 1:
        raise ValueError(f"{what}: the content dimension C is not dense (strides {tuple(t.stride())})")
    b = t if t.dtype == torch.uint8 else t.view(torch.uint8)
    rows = int(b.shape[0])
    blocks = rows if num_blocks is None else num_blocks
    if blocks < 1 or rows % blocks:
        raise ValueError(f"{what}: {rows} kernel blocks are not a whole number per each of {blocks} blocks")
    return b.unflatten(0, (blocks, rows // blocks))


_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _word_of(layers: Sequence[Any], fmt: PageFormat) -> tuple[Any, int]:
    """The widest integer type whose size divides every cell part, stride, offset and address of the byte views."""
    for size, dtype in _WORDS:
        parts = [fmt.content] + ([] if fmt.k_bytes is None else [fmt.k_bytes])
        if any(x % size for x in parts):
            continue
        if all(t.data_ptr() % size == 0 and all(st % size == 0 for st in t.stride()[:-1]) for t in layers):
            return dtype, size
    return torch.uint8, 1


class DeviceKv(PagedKv):
    """One KV cache group's layers on a device, as a :class:`PagedKv` in the pool's canonical layout.

    Args:
        layers: per layer, in the model's order, the ``[B, H, N, C]`` view of its cache (any dtype; strides
            of any ``KVCacheLayout``).
        fmt: the page format the group's spec gives (checked against every layer).
        block_size: tokens per block (the engine's; ``fmt.tokens`` states hold them).
        edge: the device edge that moves the bytes.
        kv_dtype: the KV dtype as keys spell it.
        num_blocks: the engine's blocks, when its kernels see each as several kernel blocks (the views then
            hold ``num_blocks * R`` kernel blocks of ``fmt.tokens / R`` states); default: as many as the views.
    """

    def __init__(self, layers: Sequence[Any], fmt: PageFormat, block_size: int, edge: DeviceEdge,
                 kv_dtype: str, num_blocks: Optional[int] = None) -> None:
        if not layers:
            raise ValueError("device KV: no layers")
        self._layers = [_as_bytes(t, num_blocks, f"layer {i}") for i, t in enumerate(layers)]
        b0, r0 = int(self._layers[0].shape[0]), int(self._layers[0].shape[1])
        for i, t in enumerate(self._layers):
            shape = (int(t.shape[0]), int(t.shape[2]), int(t.shape[1]) * int(t.shape[3]), int(t.shape[4]))
            if shape != (b0, fmt.heads, fmt.tokens, fmt.content) or int(t.shape[1]) != r0:
                raise ValueError(f"device KV: layer {i} is [B, H, N, C bytes] = {shape}, the spec says "
                                 f"[{b0}, {fmt.heads}, {fmt.tokens}, {fmt.content}]")
            if t.device != edge.device:
                raise ValueError(f"device KV: layer {i} is on {t.device}, the edge moves {edge.device}")
        self.fmt = fmt
        self.edge = edge
        self.num_blocks = b0
        self.num_layers = len(self._layers)
        self.block_size = block_size
        self.block_bytes = self.num_layers * fmt.page_bytes
        self._kv_dtype = kv_dtype
        # the widest word every cell part, stride and address divides: strided copies move words, not bytes
        self._word, self._unit = _word_of(self._layers, fmt)
        self._words = [t.view(self._word) for t in self._layers]
        w = self._unit
        self._wfmt = PageFormat(fmt.heads, fmt.tokens, fmt.content // w, None if fmt.k_bytes is None else fmt.k_bytes // w)
        self._computed: dict[int, Event] = {}  # layer -> where the engine's stream was when it was computed

    @property
    def kv_dtype(self) -> str:
        return self._kv_dtype

    # ----------------------------------------------------------------------------- the canonical planes

    def _planes(self, flat: Any) -> list[tuple[Any, slice]]:
        """A ``(n, page words)`` canonical layer buffer as its planes ``(n, N, H, words)`` and the content words of
        a cell each plane holds."""
        f, n = self._wfmt, int(flat.shape[0])
        if f.k_bytes is None:
            return [(flat.view(n, f.tokens, f.heads, f.content), slice(0, f.content))]
        kb, vb = f.k_bytes, f.content - f.k_bytes
        cells = f.tokens * f.heads
        return [(flat[:, :cells * kb].view(n, f.tokens, f.heads, kb), slice(0, kb)),
                (flat[:, cells * kb:].view(n, f.tokens, f.heads, vb), slice(kb, f.content))]

    def _check(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise IndexError(f"KV block {b} outside 0..{self.num_blocks - 1}")

    def _gather(self, block_ids: Sequence[int], layers: Sequence[int]) -> Any:
        """Device work on the side stream: the blocks' ``layers`` in canonical order, ``(n, len(layers) *
        page_bytes)`` uint8 on the device."""
        f, n = self._wfmt, len(block_ids)
        pb = f.page_bytes  # in words
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.edge.device)
        out = torch.empty((n, len(layers) * self.fmt.page_bytes), dtype=torch.uint8, device=self.edge.device)
        words = out.view(self._word)
        for j, layer in enumerate(layers):
            sel = self._words[layer].index_select(0, idx)  # (n, R, H, n', C)
            sel = sel.transpose(1, 2).reshape(n, f.heads, f.tokens, f.content)  # a view when R == 1
            for plane, cells in self._planes(words[:, j * pb:(j + 1) * pb]):
                plane.copy_(sel[:, :, :, cells].transpose(1, 2))
        return out

    def _scatter(self, block_ids: Sequence[int], layers: Sequence[int], dev: Any) -> None:
        """Device work on the side stream: ``dev`` ``(n, len(layers) * page_bytes)`` canonical into the blocks."""
        f, n = self._wfmt, len(block_ids)
        pb = f.page_bytes  # in words
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.edge.device)
        cell = torch.empty((n, f.heads, f.tokens, f.content), dtype=self._word, device=self.edge.device)
        words = dev.view(self._word)
        for j, layer in enumerate(layers):
            for plane, cells in self._planes(words[:, j * pb:(j + 1) * pb]):
                cell[:, :, :, cells].copy_(plane.transpose(1, 2))
            t = self._words[layer]
            r = int(t.shape[1])
            t.index_copy_(0, idx, cell.view(n, f.heads, r, f.tokens // r, f.content).transpose(1, 2))

    def _stage(self, block_ids: Sequence[int], layers: Sequence[int], ready: Event) -> StagedSave:
        n, nbytes = len(block_ids), len(layers) * self.fmt.page_bytes
        edge = self.edge
        dev = None
        if n:
            edge.after(ready)
            with edge.side():
                dev = self._gather(block_ids, layers)
        return StagedSave(edge, dev, n, nbytes, edge.done())

    # ----------------------------------------------------------------------------- PagedKv

    def stage_save(self, block_ids: Sequence[int]) -> StagedSave:
        """Starts the blocks' trip to host memory now, ordered after the engine's work so far (call it on the
        engine's thread when the step's layers are computed); the save thread takes the bytes later."""
        self._check(block_ids)
        return self._stage(block_ids, range(self.num_layers), self.edge.mark())

    def save_sources(self, block_ids: Sequence[int]) -> list[Any]:
        return self.stage_save(block_ids).sources()

    def layer_computed(self, layer: int) -> None:
        """Engine thread: layer ``layer`` was computed; its layer-by-layer save (on the save thread) reads it after
        this point of the engine's stream, even though the engine's kernels have moved on by then. Layers before it
        are covered too (a later point is as good, and the connector may report several at once)."""
        ev = self.edge.mark()
        for i in range(layer + 1):
            self._computed[i] = ev

    def layer_sources(self, block_ids: Sequence[int], layer: int) -> list[Any]:
        self._check(block_ids)
        ready = self._computed.pop(layer, None) or self.edge.mark()
        return self._stage(block_ids, [layer], ready).sources()

    def _targets(self, block_ids: Sequence[int], layers: Sequence[int], views: bool = False) \
            -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        self._check(block_ids)
        nbytes = len(layers) * self.fmt.page_bytes
        host = self.edge.host(len(block_ids) * nbytes)
        if views and block_ids:
            # slices of one view of the host buffer: a read turns each target into a memoryview, which costs
            # microseconds a tensor and next to nothing a memoryview, and layer by layer reads one for every
            # block and layer (8,192 a step at Llama-3-8B's 32 layers and 256 blocks)
            whole = as_memoryview(host, writable=True)
            targets: list[Any] = [whole[i * nbytes:(i + 1) * nbytes] for i in range(len(block_ids))]
        else:
            targets = [host[i * nbytes:(i + 1) * nbytes] for i in range(len(block_ids))]

        def commit(ok: Sequence[bool]) -> None:
            good = [i for i, g in enumerate(ok) if g]
            if not good:
                return
            edge = self.edge
            rows = host.view(len(block_ids), nbytes)
            src = rows if len(good) == len(block_ids) else rows[torch.tensor(good, dtype=torch.long)]
            with edge.side():
                dev = torch.empty((len(good), nbytes), dtype=torch.uint8, device=edge.device)
            edge.copy(dev, src)
            with edge.side():
                self._scatter([block_ids[i] for i in good], layers, dev)
            edge.done().wait()  # the layer is in before the connector says so
        return targets, commit

    def load_targets(self, block_ids: Sequence[int]) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        return self._targets(block_ids, range(self.num_layers))

    def layer_targets(self, block_ids: Sequence[int], layer: int) -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        return self._targets(block_ids, [layer], views=True)

    layer_runs = True

    def layer_run_targets(self, block_ids: Sequence[int], first: int, count: int) \
            -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        return self._targets(block_ids, range(first, first + count), views=True)

    def __repr__(self) -> str:
        f = self.fmt
        return (f"DeviceKv({self.num_blocks} blocks x {self.num_layers} layers, pages [H={f.heads}, N={f.tokens}, "
                f"C={f.content} B{'' if f.k_bytes is None else f', K={f.k_bytes} B'}], {self.edge.name}, "
                f"{self.block_bytes} bytes a block)")

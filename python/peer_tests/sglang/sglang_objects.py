"""SGLang's real memory pools, built on CPU for the peer tests.

The device pools are SGLang's own (``MHATokenToKVPool``, ``MLATokenToKVPool`` with ``device="cpu"``: their
buffers are plain CPU tensors), and the host pools are built from the buffer descriptions those device
pools give (``_mha_buffer_info`` / ``_mla_buffer_info``), as SGLang's host-pool assembler does. The Mamba
state buffers are given as SGLang's ``MambaStateBufferInfo`` over CPU tensors. ``pin_memory=False``:
pinning (cudaHostRegister) is the one CUDA call on this path, and there is no GPU here.
"""

from __future__ import annotations

import warnings
from typing import Any

warnings.filterwarnings("ignore", message=".*support.*currently.*")  # sglang's quantization import warnings

import torch  # noqa: E402

from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def mha_host_pool(layout: str, *, layers: int = 3, heads: int = 2, head_dim: int = 8, page_size: int = 4,
                  device_tokens: int = 64, dtype: torch.dtype = torch.bfloat16, ratio: float = 2.0) -> Any:
    dev = MHATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype, head_num=heads, head_dim=head_dim,
                           layer_num=layers, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), ratio, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers)


def mla_host_pool(layout: str, *, layers: int = 3, kv_lora_rank: int = 16, rope_dim: int = 8, page_size: int = 4,
                  device_tokens: int = 64, dtype: torch.dtype = torch.bfloat16, ratio: float = 2.0) -> Any:
    dev = MLATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype, kv_lora_rank=kv_lora_rank,
                           qk_rope_head_dim=rope_dim, layer_num=layers, device="cpu", enable_memory_saver=False)
    return MLATokenToKVPoolHost(dev._mla_buffer_info(), ratio, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers,
                                target_layer_num=layers)


def mamba_host_pool(*, layers: int = 2, slots: int = 8, conv_shapes: tuple[tuple[int, ...], ...] = ((4, 3), (2, 3)),
                    temporal_shape: tuple[int, ...] = (2, 4, 4), ratio: float = 2.0) -> Any:
    info = MambaStateBufferInfo(
        temporal=torch.zeros((layers, slots) + temporal_shape, dtype=torch.float32),
        conv=tuple(torch.zeros((layers, slots) + s, dtype=torch.bfloat16) for s in conv_shapes))
    return MambaPoolHost(info, ratio, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first")


def fill_random(host_pool: Any, seed: int) -> None:
    """Random bytes in every buffer of a host pool (KV, or Mamba's temporal and conv states)."""
    g = torch.Generator().manual_seed(seed)
    buffers = host_pool.get_hybrid_pool_buffer() if hasattr(host_pool, "get_hybrid_pool_buffer") else []
    if not isinstance(host_pool, (MambaPoolHost, MHATokenToKVPoolHost)):
        buffers = [host_pool.kv_buffer]
    seen = set()
    for b in buffers:
        if b.data_ptr() in seen or b.numel() == 0:
            continue
        seen.add(b.data_ptr())
        raw = b.view(-1).view(torch.uint8) if b.is_contiguous() else None
        assert raw is not None, "host buffers are contiguous"
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))


def page_bytes(host_pool: Any, index: int) -> bytes:
    """The bytes of the page at host slot ``index`` (SGLang's own flat page)."""
    return host_pool.get_data_page(index, flat=True).contiguous().view(torch.uint8).numpy().tobytes()

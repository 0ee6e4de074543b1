"""SGLang's HiCacheController itself (the L3 half of hierarchical caching: its backup and prefetch threads)
with a kvpool storage backend attached the way ``--hicache-storage-backend`` attaches one: a writer
controller backs pages up from its host pool, a second controller (another SGLang instance) finds them
(``_storage_hit_query``: ``batch_exists``), and its prefetch I/O thread loads them into its own host pool.
Device pools, host pools and the token allocator are SGLang's own, on CPU. Nothing waits on time: each
step blocks on the controller's own queues (the timeout only bounds a hang)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pytest
import torch

import kvpool.mooncake
import sglang_objects as so
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

PAGE = 4
HANG = 120.0  # seconds: only a bound on a hung thread, never a pace


def controller(kind: str, layout: str, backend: str, extra: dict[str, Any]) -> HiCacheController:
    if kind == "mla":
        dev: Any = MLATokenToKVPool(size=64, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=16,
                                    qk_rope_head_dim=8, layer_num=3, device="cpu", enable_memory_saver=False)
        host: Any = MLATokenToKVPoolHost(dev._mla_buffer_info(), 2.0, 0, PAGE, layout, pin_memory=False,
                                         device="cpu", device_capacity_tokens=64, start_layer=0, end_layer=3,
                                         target_layer_num=3)
    else:
        dev = MHATokenToKVPool(size=64, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3,
                               device="cpu", enable_memory_saver=False, enable_alt_stream=False)
        host = MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                    device_capacity_tokens=64, start_layer=0, end_layer=3)
    alloc = PagedTokenToKVPoolAllocator(64, PAGE, torch.bfloat16, "cpu", dev, need_sort=False)
    return HiCacheController(alloc, host, PAGE, None, threading.Event(), io_backend="direct",
                             storage_backend=backend, model_name="test-org/tiny-model",
                             storage_backend_extra_config=dict(extra))


@pytest.fixture
def make_controller() -> Iterator[Callable[..., HiCacheController]]:
    made: list[HiCacheController] = []
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        def make(*args: Any) -> HiCacheController:
            c = controller(*args)
            made.append(c)
            return c
        yield make
        for c in made:
            c.detach_storage_backend()


def configs(master: str) -> dict[str, tuple[str, dict[str, Any]]]:
    dynamic = {"backend_name": "kvpool", "module_path": "kvpool.sglang", "class_name": "KvPoolStore",
               "master": master}
    return {
        "kvpool-v1": ("dynamic", {**dynamic, "interface_v1": 1}),
        "kvpool-tensors": ("dynamic", dynamic),
        "mooncake": ("mooncake", {"master_server_address": master, "protocol": "tcp", "device_name": "",
                                  "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                                  "check_server": False, "local_hostname": "127.0.0.1"}),
    }


@pytest.mark.parametrize("name,kind,layout", [
    ("kvpool-v1", "mha", "layer_first"), ("kvpool-v1", "mla", "page_first"),
    ("kvpool-tensors", "mha", "page_first"), ("mooncake", "mha", "page_first_direct")])
def test_backup_then_prefetch_through_sglangs_controller(name, kind, layout, make_controller, kvpool_pool,
                                                         pool_client) -> None:
    kvpool.mooncake.install()
    backend, extra = configs(kvpool_pool.master)[name]
    writer = make_controller(kind, layout, backend, extra)
    reader = make_controller(kind, layout, backend, extra)
    want_fn = "_page_get_zero_copy" if name != "kvpool-tensors" else "_generic_page_get"
    assert reader.page_get_func.__name__ == want_fn
    so.fill_random(writer.mem_pool_host, 31)
    so.fill_random(reader.mem_pool_host, 32)
    pages = 5
    tokens = list(range(1000, 1000 + pages * PAGE))
    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    assert len(hashes) == pages

    # backup: the writer's backup thread stores the pages of these host slots
    widx = writer.mem_pool_host.alloc(pages * PAGE)
    writer.write_storage(widx, tokens, hash_value=hashes)
    done = writer.ack_backup_queue.get(timeout=HANG)
    assert done.completed_tokens == pages * PAGE

    # prefetch: the reader's query thread finds every page, then (as the radix cache does) host slots are
    # allocated and its I/O thread loads them
    op = reader.prefetch("req-1", tokens + [7, 7])  # a partial page at the end is never queried
    hit = reader.prefetch_hit_queue.get(timeout=HANG)
    assert hit is op and op.storage_hit_count == pages * PAGE and op.hash_value == hashes
    reader.mem_pool_host.alloc(PAGE)  # other slots than the writer's
    op.host_indices = reader.mem_pool_host.alloc(pages * PAGE)
    reader.prefetch_buffer.put(op)
    while True:
        ack = reader.ack_prefetch_queue.get(timeout=HANG)
        if ack.completed_req:
            break
        last = ack.completed_tokens
    assert last == pages * PAGE
    for p in range(pages):
        assert so.page_bytes(writer.mem_pool_host, int(widx[p * PAGE])) == \
            so.page_bytes(reader.mem_pool_host, int(op.host_indices[p * PAGE]))

    # a prompt whose second page was never stored hits one page only
    other = tokens[:PAGE] + [5] * PAGE
    reader.prefetch("req-2", other)
    assert reader.prefetch_hit_queue.get(timeout=HANG).storage_hit_count == PAGE

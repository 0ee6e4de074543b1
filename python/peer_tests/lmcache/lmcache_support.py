"""Helpers of the LMCache peer tests (the fixtures are in conftest.py): LMCache's metadata for a small
model, random KV chunks in LMCache memory objects, and LMCache's own store and retrieve paths.

Importing this module runs ``kvpool.mooncake.install()`` before LMCache's Mooncake connector imports
``mooncake.store`` (as the ``.pth`` file of docs/python.md does for a user), so that connector runs over
kvpool's drop-in.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import kvpool.mooncake  # noqa: E402

if kvpool.mooncake.install() is not kvpool.mooncake:
    raise ImportError("the real mooncake package is installed in this venv: LMCache's Mooncake connector would not run "
                      "over kvpool.mooncake")

try:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend
    from lmcache.v1.storage_backend.storage_manager import StorageManager  # noqa: F401
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the LMCache peer tests need LMCache ({e}); run them with the interpreter "
                      "`scripts/peers.sh python lmcache` prints (./kvpool test-peers installs it)") from e

LMCACHE_VERSION = "0.5.6"

# A small model's KV geometry: 2 layers, 2 KV heads of 8 dims (hidden 16), bf16, 16-token chunks.
LAYERS, HEADS, HEAD_SIZE, CHUNK = 2, 2, 8, 16
HIDDEN = HEADS * HEAD_SIZE
DTYPE = torch.bfloat16
#: Bytes of one token of KV in LMCache's KV_2LTD layout ([2, layers, tokens, hidden]).
TOKEN_BYTES = 2 * LAYERS * HIDDEN * DTYPE.itemsize

#: How long a test waits for LMCache's asynchronous puts to land before it fails (a bound, not a pace).
STORE_DEADLINE = 30.0

def metadata(model: str) -> Any:
    """LMCache's metadata for the small model (kv_shape is vLLM's (layers, 2, chunk, heads, head size))."""
    return LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=DTYPE, kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_SIZE), chunk_size=CHUNK)


def remote_backend(sm: Any) -> Any:
    """The manager's one RemoteBackend; fails if LMCache could not connect it (it only logs that)."""
    found = [b for b in sm.storage_backends.values() if isinstance(b, RemoteBackend)]
    assert len(found) == 1, f"expected one RemoteBackend, got {list(sm.storage_backends)}"
    assert found[0].connection is not None, "LMCache's RemoteBackend has no connection: its connector failed to start"
    return found[0]


def connector(sm: Any) -> Any:
    """The remote backend's connector, unwrapped from LMCache's InstrumentedRemoteConnector."""
    return remote_backend(sm).connection._connector


class Chunks:
    """``n`` chunks of random KV in memory objects from the manager's allocator: full chunks, and the last
    one ``last_tokens`` long (a partial chunk) when given. ``keys`` are LMCache's keys (chained hashes
    stand-ins: random 64-bit ints), ``expected`` the bytes each chunk must read back as."""

    def __init__(self, sm: Any, model: str, n: int, last_tokens: Optional[int] = None, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.keys = [CacheEngineKey(model, 1, 0, int(torch.randint(1, 2**62, (1,), generator=g)), DTYPE)
                     for _ in range(n)]
        self.objs: list[Any] = []
        self.expected: list[bytes] = []
        self.tokens: list[int] = []
        for i in range(n):
            t = last_tokens if (last_tokens is not None and i == n - 1) else CHUNK
            obj = sm.allocate(torch.Size([2, LAYERS, t, HIDDEN]), DTYPE, fmt=MemoryFormat.KV_2LTD)
            assert obj is not None, "LMCache's allocator gave no memory object"
            obj.tensor.copy_(torch.randn(2, LAYERS, t, HIDDEN, generator=g).to(DTYPE))
            self.objs.append(obj)
            self.expected.append(bytes(obj.byte_array))
            self.tokens.append(t)

    def put(self, sm: Any) -> None:
        """LMCache's store path: ``StorageManager.batched_put`` (it releases the objects)."""
        sm.batched_put(self.keys, self.objs)
        self.objs = []


def wait_stored(rb: Any, keys: list[Any]) -> None:
    """Waits until the remote backend reports every key (puts are asynchronous in LMCache)."""
    deadline = time.monotonic() + STORE_DEADLINE
    while not all(rb.contains(k) for k in keys):
        assert time.monotonic() < deadline, f"LMCache's remote puts did not land in {STORE_DEADLINE}s"
        time.sleep(0.01)


def retrieve(sm: Any, keys: list[Any]) -> tuple[int, list[Optional[Any]]]:
    """LMCache's retrieve path (LMCacheEngine.retrieve): the block mapping from ``batched_contains``, then
    ``batched_get`` per location. Returns the hit count and the memory objects (None past the hits)."""
    hits, mapping = sm.batched_contains(keys)
    out: list[Optional[Any]] = []
    for location, ks in mapping.items():
        out += sm.batched_get(ks, location=location)
    return hits, out + [None] * (len(keys) - len(out))


def object_bytes(obj: MemoryObj) -> bytes:
    return bytes(obj.byte_array)


def assert_reads_back(sm: Any, chunks: "Chunks") -> None:
    """Retrieves ``chunks`` through ``sm``: every chunk hits, with the bytes that were stored."""
    hits, got = retrieve(sm, chunks.keys)
    try:
        assert hits == len(chunks.keys)
        assert [object_bytes(o) for o in got] == chunks.expected
    finally:
        release(got)


def release(objs: list[Optional[Any]]) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()


def on_loop(sm: Any, coro: Any) -> Any:
    """Runs a coroutine on the StorageManager's event loop (where LMCache runs its connectors)."""
    return asyncio.run_coroutine_threadsafe(coro, sm.loop).result(STORE_DEADLINE)

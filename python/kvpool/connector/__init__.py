"""Engine-side logic over a kvpool, shared with the Java side byte for byte.

* :mod:`~kvpool.connector.hashing`: vLLM's ``sha256_cbor`` chained block hashes (``BlockHasher``),
  over :mod:`~kvpool.connector.cbor`, a canonical CBOR encoder of the needed types;
* :mod:`~kvpool.connector.keys`: pool keys (``KeyFormat``), versioned by weights, identical to Java's;
* :mod:`~kvpool.connector.paged`: paged KV caches in numpy or torch CPU memory whose blocks are the
  pool's (and the Java reference engine's) block layout;
* :mod:`~kvpool.connector.pool_connector`: ``PoolConnector``, lookups, loads, background saves and
  fenced resets, in vLLM's v1 connector shape; its scheduler side is
  :mod:`~kvpool.connector.planner`, its values :mod:`~kvpool.connector.values`, its fences
  :mod:`~kvpool.connector.fence`, its layer-by-layer loads and saves (``granularity="layer"``)
  :mod:`~kvpool.connector.layers`. The contract it shares with the Java connectors is the table of
  scenarios in ``kvpool-connector/src/test/resources/connector-contract-vectors.json``.

Standard library only; numpy and torch are imported when a paged cache uses them.
"""

from .cbor import encode as cbor_encode
from .hashing import DEFAULT_BLOCK_SIZE, BlockHasher, extra_keys_for, sha256_cbor
from .keys import MAX_KEY_BYTES, VERSION, KeyFormat, dtype_name, escape
from .paged import HND, NHD, LayeredPagedKv, PagedKv, PagedKvCache
from .pool_connector import (
    EMPTY_META, NO_MATCH, ConnectorMeta, ConnectorRequest, ConnectorStats, Fence, FileFence, Load, LocalFence,
    Match, PoolConnector, ResetResult, Save, ScheduledRequest,
)

__all__ = [
    "cbor_encode", "sha256_cbor", "BlockHasher", "extra_keys_for", "DEFAULT_BLOCK_SIZE",
    "KeyFormat", "escape", "dtype_name", "VERSION", "MAX_KEY_BYTES",
    "PagedKv", "PagedKvCache", "LayeredPagedKv", "NHD", "HND",
    "PoolConnector", "ConnectorRequest", "ScheduledRequest", "ConnectorMeta", "Load", "Save", "Match",
    "ResetResult", "ConnectorStats", "Fence", "LocalFence", "FileFence", "EMPTY_META", "NO_MATCH",
]

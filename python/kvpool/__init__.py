"""kvpool for Python: a client for the kvpool KV-cache pool, a Mooncake-Store-compatible store
(``kvpool.mooncake``), the engine-side connector logic (``kvpool.connector``) and a vLLM v1 connector
(``kvpool.vllm``). The core is standard library only; see docs/python.md.
"""

from . import etcd
from .auth import Secrets
from .buffers import RawBuffer, as_memoryview
from .client import Client, PutResult, PutStatus
from .results import MISS, TOO_SMALL
from .errors import AuthenticationError, KvPoolError, MasterTimeout, MasterUnreachable
from .protocol import PIN_FOREVER
from .protocol import VERSION as PROTOCOL_VERSION
from .protocol import PoolStats, ProtocolError, SegmentStats
from .parts import PutInParts
from .ranged import Located
from .tiers import TierCounts
from .block_info import BlockInfo, router_block_hash

__all__ = [
    "Client", "PutStatus", "PutResult", "PIN_FOREVER", "MISS", "TOO_SMALL", "RawBuffer", "as_memoryview", "KvPoolError", "MasterUnreachable", "MasterTimeout",
    "ProtocolError", "PoolStats", "SegmentStats", "PROTOCOL_VERSION", "etcd", "Secrets", "AuthenticationError",
    "Located", "PutInParts", "TierCounts", "BlockInfo", "router_block_hash",
]
__version__ = "0.1.0"

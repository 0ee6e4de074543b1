"""Mooncake's error numbers and enums, how kvpool failures map onto them, and the package's logger."""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any

from ..errors import KvPoolError, MasterTimeout, MasterUnreachable

log = logging.getLogger("kvpool.mooncake")

HC_HEALTHY = 0
HC_NOT_INITIALIZED = 1
HC_MASTER_UNREACHABLE = 2


class ErrorCode(enum.IntEnum):
    """Mooncake's error numbers (mooncake-store/include/types.h), the ones this module returns and more."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    NOT_SUPPORTED = -1012


_OK = 0
_INTERNAL = int(ErrorCode.INTERNAL_ERROR)
_NO_SPACE = int(ErrorCode.NO_AVAILABLE_HANDLE)
_INVALID = int(ErrorCode.INVALID_PARAMS)
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_TRANSFER = int(ErrorCode.TRANSFER_FAIL)
_RPC = int(ErrorCode.RPC_FAIL)
_RPC_TIMEOUT = int(ErrorCode.RPC_TIMEOUT)
_NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


class SoftPinAction(enum.IntEnum):
    """Mooncake's ``SoftPinAction``: ENABLE asks for a soft pin (a kvpool pin of ``soft_pin_ttl_ms``, else
    30 minutes); PRESERVE and DISABLE ask for none (a kvpool pin belongs to the object it was put with, so
    an upsert without one leaves the new value unpinned)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    """Mooncake's ``ObjectDataType`` (accepted, ignored)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


def _code_for(exc: BaseException, data: bool) -> int:
    """A Mooncake error number for an exception from the kvpool client."""
    if isinstance(exc, ValueError):
        return _INVALID
    if isinstance(exc, (MasterTimeout, TimeoutError)):
        return _RPC_TIMEOUT
    if isinstance(exc, MasterUnreachable):
        return _RPC
    if isinstance(exc, KvPoolError):
        return _TRANSFER if data else _RPC
    return _INTERNAL


def _put_code(status: Any, upsert: bool) -> int:
    """A Mooncake code for a kvpool ``PutStatus`` (compared by name)."""
    name = getattr(status, "name", str(status))
    if name == "OK":
        return _OK
    if name == "ALREADY_EXISTS":
        return _EXISTS if upsert else _OK  # put: Mooncake's Put treats an existing object as success
    if name in ("POOL_FULL", "NO_SEGMENT", "QUOTA_EXCEEDED"):
        return _NO_SPACE  # Mooncake's allocator answers NO_AVAILABLE_HANDLE with no room (a tenant's too) or no segment
    if name in ("FENCED", "FAILED"):
        return _TRANSFER
    return _INTERNAL


#: Topics already warned about (``kvpool.mooncake.codes._warned``; replacing it resets the warnings).
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(topic: str, message: str, *args: Any) -> None:
    with _warned_lock:
        if topic in _warned:
            return
        _warned.add(topic)
    log.warning(message, *args)

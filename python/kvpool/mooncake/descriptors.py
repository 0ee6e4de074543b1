"""Mooncake's descriptor and status types: replica, memory and disk descriptors, replica and task states.

What kvpool fills in (``get_replica_desc``, ``batch_get_replica_desc`` in :mod:`.admin`):

* A memory copy is a ``ReplicaDescriptor`` whose ``get_memory_descriptor().buffer_descriptor`` is a
  ``Descriptor`` with ``transport_endpoint`` = the kvpool node's ``host:port`` (the segment's name,
  also what ``ReplicateConfig.preferred_segment`` and ``batch_replica_clear`` take), ``size`` = the
  value's length and ``buffer_address`` = the byte offset of the value inside that node's segment.
  Mooncake gives the value's virtual address in the process that mounted the segment; a kvpool
  segment is a file (or shared memory) addressed by offset, so the offset is the same fact in
  kvpool's terms. Neither is usable as a pointer in the caller's process.
* A copy on a node's SSD tier is node-local, read through that node: Mooncake's LOCAL_DISK kind
  (``is_local_disk_replica()``). Mooncake's binding has no accessor for that kind, and neither has
  this one (``get_memory_descriptor`` and ``get_disk_descriptor`` raise ``RuntimeError`` as there).
* kvpool lists complete objects only, so ``status`` is always ``ReplicaStatus.COMPLETE``.

As in the binding, ``MemoryDescriptor``, ``DiskDescriptor`` and ``ReplicaDescriptor`` cannot be
constructed from Python (``TypeError``); ``Descriptor()`` and ``QueryTaskResponse()`` can.
"""

from __future__ import annotations

import enum
import operator
from typing import Any, NoReturn

from .args import _str_arg, _uint
from .codes import ObjectDataType

__all__ = [
    "ReplicaStatus", "TaskStatus", "TaskType", "Descriptor", "MemoryDescriptor", "DiskDescriptor",
    "ReplicaDescriptor", "QueryTaskResponse",
    "UNDEFINED", "INITIALIZED", "PROCESSING", "COMPLETE", "REMOVED", "FAILED", "PENDING", "SUCCESS",
    "REPLICA_COPY", "REPLICA_MOVE", "UNKNOWN", "KVCACHE", "TENSOR", "WEIGHT", "SAMPLE", "ACTIVATION",
    "GRADIENT", "OPTIMIZER_STATE", "METADATA", "GENERAL",
]


class ReplicaStatus(enum.IntEnum):
    """Mooncake's ``ReplicaStatus`` (replica.h). kvpool reports only COMPLETE copies."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskStatus(enum.IntEnum):
    """Mooncake's ``TaskStatus`` of a copy or move task (kvpool creates no tasks)."""

    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(enum.IntEnum):
    """Mooncake's ``TaskType`` (kvpool creates no tasks)."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1


# The module-level names the binding exports (py::enum_::export_values). Where two enums share a
# name the one bound later wins, as in the wheel: FAILED and PROCESSING are TaskStatus members.
UNKNOWN = ObjectDataType.UNKNOWN
KVCACHE = ObjectDataType.KVCACHE
TENSOR = ObjectDataType.TENSOR
WEIGHT = ObjectDataType.WEIGHT
SAMPLE = ObjectDataType.SAMPLE
ACTIVATION = ObjectDataType.ACTIVATION
GRADIENT = ObjectDataType.GRADIENT
OPTIMIZER_STATE = ObjectDataType.OPTIMIZER_STATE
METADATA = ObjectDataType.METADATA
GENERAL = ObjectDataType.GENERAL
UNDEFINED = ReplicaStatus.UNDEFINED
INITIALIZED = ReplicaStatus.INITIALIZED
COMPLETE = ReplicaStatus.COMPLETE
REMOVED = ReplicaStatus.REMOVED
REPLICA_COPY = TaskType.REPLICA_COPY
REPLICA_MOVE = TaskType.REPLICA_MOVE
PENDING = TaskStatus.PENDING
PROCESSING = TaskStatus.PROCESSING
SUCCESS = TaskStatus.SUCCESS
FAILED = TaskStatus.FAILED


def _no_constructor(cls: type) -> NoReturn:
    raise TypeError(f"{cls.__module__}.{cls.__qualname__}: No constructor defined!")


class Descriptor:
    """Mooncake's ``Descriptor`` of an allocated buffer: ``size``, ``buffer_address`` and
    ``transport_endpoint``, each settable (an unsigned int, an unsigned int, a str)."""

    __slots__ = ("_size", "_buffer_address", "_transport_endpoint")

    def __init__(self) -> None:
        self._size = 0
        self._buffer_address = 0
        self._transport_endpoint = ""

    @property
    def size(self) -> int:
        """The buffer's length in bytes (kvpool: the value's length)."""
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = _uint(value, "Descriptor.size")

    @property
    def buffer_address(self) -> int:
        """Where the buffer starts (kvpool: the value's byte offset inside its node's segment)."""
        return self._buffer_address

    @buffer_address.setter
    def buffer_address(self, value: int) -> None:
        self._buffer_address = _uint(value, "Descriptor.buffer_address")

    @property
    def transport_endpoint(self) -> str:
        """Who serves the buffer (kvpool: the node's ``host:port``, the segment's name)."""
        return self._transport_endpoint

    @transport_endpoint.setter
    def transport_endpoint(self, value: str) -> None:
        self._transport_endpoint = _str_arg(value, "Descriptor.transport_endpoint")

    def __repr__(self) -> str:
        return (f"<Descriptor size={self._size} buffer_address={self._buffer_address} "
                f"transport_endpoint={self._transport_endpoint}>")


class MemoryDescriptor:
    """Mooncake's ``MemoryDescriptor``: a memory copy's ``buffer_descriptor`` (a settable ``Descriptor``)."""

    __slots__ = ("_buffer_descriptor",)
    _buffer_descriptor: Descriptor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_constructor(type(self))

    @classmethod
    def _of(cls, descriptor: Descriptor) -> MemoryDescriptor:
        md = cls.__new__(cls)
        md._buffer_descriptor = descriptor
        return md

    @property
    def buffer_descriptor(self) -> Descriptor:
        """Where the copy's bytes are: endpoint, address (kvpool: offset) and size."""
        return self._buffer_descriptor

    @buffer_descriptor.setter
    def buffer_descriptor(self, value: Descriptor) -> None:
        if not isinstance(value, Descriptor):
            raise TypeError(f"MemoryDescriptor.buffer_descriptor must be a Descriptor, got {type(value).__name__}")
        self._buffer_descriptor = value


class DiskDescriptor:
    """Mooncake's ``DiskDescriptor`` of a copy in a shared file system: ``file_path`` and ``object_size``
    (settable). kvpool has no such copies (its SSD tier is node-local), so it never hands one out."""

    __slots__ = ("_file_path", "_object_size")
    _file_path: str
    _object_size: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_constructor(type(self))

    @classmethod
    def _of(cls, file_path: str, object_size: int) -> DiskDescriptor:
        dd = cls.__new__(cls)
        dd._file_path = file_path
        dd._object_size = object_size
        return dd

    @property
    def file_path(self) -> str:
        """The file holding the copy."""
        return self._file_path

    @file_path.setter
    def file_path(self, value: str) -> None:
        self._file_path = _str_arg(value, "DiskDescriptor.file_path")

    @property
    def object_size(self) -> int:
        """The object's length in bytes."""
        return self._object_size

    @object_size.setter
    def object_size(self, value: int) -> None:
        self._object_size = _uint(value, "DiskDescriptor.object_size")


_MEMORY, _DISK, _LOCAL_DISK = "memory", "disk", "local_disk"


class ReplicaDescriptor:
    """Mooncake's ``ReplicaDescriptor``: one copy of an object, its kind and its (read-only) ``status``."""

    __slots__ = ("_kind", "_status", "_memory", "_disk")
    _kind: str
    _status: ReplicaStatus
    _memory: MemoryDescriptor | None
    _disk: DiskDescriptor | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_constructor(type(self))

    @classmethod
    def _memory_copy(cls, endpoint: str, address: int, size: int,
                     status: ReplicaStatus = ReplicaStatus.COMPLETE) -> ReplicaDescriptor:
        d = Descriptor()
        d.transport_endpoint, d.buffer_address, d.size = endpoint, address, size
        return cls._make(_MEMORY, status, memory=MemoryDescriptor._of(d))

    @classmethod
    def _local_disk_copy(cls, status: ReplicaStatus = ReplicaStatus.COMPLETE) -> ReplicaDescriptor:
        return cls._make(_LOCAL_DISK, status)

    @classmethod
    def _make(cls, kind: str, status: ReplicaStatus, memory: MemoryDescriptor | None = None,
              disk: DiskDescriptor | None = None) -> ReplicaDescriptor:
        r = cls.__new__(cls)
        r._kind, r._status, r._memory, r._disk = kind, ReplicaStatus(operator.index(status)), memory, disk
        return r

    @property
    def status(self) -> ReplicaStatus:
        """The copy's state (kvpool: always COMPLETE, the only copies its master lists)."""
        return self._status

    def is_memory_replica(self) -> bool:
        """True for a copy in a segment's memory."""
        return self._kind == _MEMORY

    def is_disk_replica(self) -> bool:
        """True for a copy in a shared file system (never, in kvpool)."""
        return self._kind == _DISK

    def is_local_disk_replica(self) -> bool:
        """True for a copy on a node's own SSD (kvpool's disk tier)."""
        return self._kind == _LOCAL_DISK

    def get_memory_descriptor(self) -> MemoryDescriptor:
        """The memory copy's descriptor (the same object each call); RuntimeError for other kinds."""
        if self._memory is None:
            raise RuntimeError("Expected MemoryDescriptor")
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        """The shared-file-system copy's descriptor; RuntimeError for other kinds (every kvpool copy)."""
        if self._disk is None:
            raise RuntimeError("Expected DiskDescriptor")
        return self._disk


def _uuid_text(pair: tuple[int, int]) -> str:
    return f"{pair[0]}-{pair[1]}"


class QueryTaskResponse:
    """Mooncake's ``QueryTaskResponse`` (what ``query_task`` answers for a known task; kvpool has none).
    ``QueryTaskResponse()`` holds the binding's defaults; every field is read-only."""

    __slots__ = ("_id", "_type", "_status", "_created", "_updated", "_assigned", "_message")

    def __init__(self) -> None:
        self._id = (0, 0)
        self._type = TaskType.REPLICA_COPY
        self._status = TaskStatus.PENDING
        self._created = 0
        self._updated = 0
        self._assigned = (0, 0)
        self._message = ""

    @property
    def id(self) -> tuple[int, int]:
        """The task's UUID as two unsigned 64-bit halves."""
        return self._id

    @property
    def type(self) -> TaskType:
        """REPLICA_COPY or REPLICA_MOVE."""
        return self._type

    @property
    def status(self) -> TaskStatus:
        """PENDING, PROCESSING, SUCCESS or FAILED."""
        return self._status

    @property
    def created_at_ms_epoch(self) -> int:
        """When the task was created, in ms since the epoch."""
        return self._created

    @property
    def last_updated_at_ms_epoch(self) -> int:
        """When the task last changed, in ms since the epoch."""
        return self._updated

    @property
    def assigned_client(self) -> tuple[int, int]:
        """The UUID of the client carrying the task out."""
        return self._assigned

    @property
    def message(self) -> str:
        """The task's last message."""
        return self._message

    def __repr__(self) -> str:
        return (f"QueryTaskResponse(id={_uuid_text(self._id)}, type={int(self._type)}, status={int(self._status)}, "
                f"created_at={self._created}, last_updated_at={self._updated}, "
                f"assigned_client={_uuid_text(self._assigned)}, message=\"{self._message}\")")

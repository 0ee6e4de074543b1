"""The device edge: the one place where KV bytes cross between an engine's device memory and host memory.

Design note. Everything above this module (which bytes of which block go where, in which order, the
canonical layout, the pool's puts and gets) is the same code whatever the device; only the calls below
differ between :class:`CpuEdge` (CI, and engines whose caches are CPU tensors laid out as a GPU backend
lays them) and :class:`CudaEdge`:

======================  ==========================================  =======================================
call                    CpuEdge                                     CudaEdge
======================  ==========================================  =======================================
``device``              ``cpu``                                     ``cuda:N`` of the engine's caches
``host(nbytes)``        a plain CPU tensor                          a page-locked (pinned) CPU tensor, from
                                                                    torch's caching host allocator
``copy(dst, src)``      ``dst.copy_(src)``, done on return          ``dst.copy_(src, non_blocking=True)`` on
                                                                    the edge's side stream
``mark()``              an event that has happened                  an event recorded on the engine's
                                                                    current (compute) stream
``after(event)``        nothing                                     the side stream waits for the event
``done()`` / ``wait``   an event that has happened; nothing         an event on the side stream; a CPU
                                                                    wait for it (``Event.synchronize``)
``register_host``       nothing (host memory is host memory)        ``cudaHostRegister``: an existing
                                                                    mapping (the pool's shared segment)
                                                                    becomes a DMA target
======================  ==========================================  =======================================

Ordering on a GPU: a save first waits (on the side stream, not the CPU) for the event the engine's thread
recorded when it asked for the save, so it reads a layer only after the forward pass wrote it, while the
engine's next kernels run beside it; a load's copies are waited for by the CPU (one event per layer, or per
step) before the connector reports the layer in, so the engine's compute stream never sees half a layer.

``torch`` is imported here and only here (and by the modules of ``kvpool.device`` that use an edge):
importing ``kvpool`` itself never needs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any, Iterator, Optional

import torch

__all__ = ["DeviceEdge", "CpuEdge", "CudaEdge", "Event", "edge_for"]


class Event:
    """A point in a stream's work: :meth:`wait` blocks the calling thread until it has happened."""

    def __init__(self, cuda_event: Any = None) -> None:
        self._e = cuda_event

    def wait(self) -> None:
        if self._e is not None:
            self._e.synchronize()

    def query(self) -> bool:
        """True if the event has happened (never blocks)."""
        return self._e is None or bool(self._e.query())


class DeviceEdge:
    """Copies between device tensors and host memory (see the module docstring for what differs per device)."""

    name: str = "?"
    device: Any
    #: bytes this edge has copied (both directions): a gauge of the device traffic, and proof in tests that a
    #: path went through the edge
    bytes_copied: int = 0

    def host(self, nbytes: int) -> Any:
        """A host uint8 tensor of ``nbytes`` that this edge can copy to and from at full speed."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any) -> None:
        """``dst <- src`` (same shape; either side may be device or host, views and strides allowed), on the
        edge's side stream: ordered after :meth:`after` events, complete when a later :meth:`done` event is."""
        raise NotImplementedError

    def mark(self) -> Event:
        """An event at the current point of the engine's (compute) stream, for :meth:`after`."""
        raise NotImplementedError

    def after(self, event: Event) -> None:
        """The side stream's later copies wait for ``event`` (the CPU does not)."""
        raise NotImplementedError

    def done(self) -> Event:
        """An event after every copy issued so far on the side stream."""
        raise NotImplementedError

    def side(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which device work (the gathers beside the copies) runs on the side stream."""
        return contextlib.nullcontext()

    def register_host(self, address: int, nbytes: int) -> bool:
        """Makes the host range ``[address, address + nbytes)`` a DMA target; True if it was registered now
        (False: registered before, refused, or nothing to register, as on the CPU)."""
        return False

    def owns(self, address: int, nbytes: int) -> bool:
        """True if ``[address, address + nbytes)`` is device memory of this edge."""
        raise NotImplementedError

    def wrap(self, address: int, nbytes: int) -> Any:
        """Device memory at ``address`` as a uint8 tensor of ``nbytes`` (no copy), for :meth:`copy`."""
        raise NotImplementedError

    def unregister_host(self, address: int) -> None:
        return None

    def register_mapping(self, mapping: Any) -> None:
        """Registers a shared segment's mapping (``kvpool.shm.Mapping``) as a DMA target once, and unregisters it
        when the mapping closes (before it is unmapped: a registration must never outlive its pages)."""
        base = mapping.pin()
        if base is None:
            return
        address = ctypes.addressof(base)
        if self.register_host(address, mapping.size):
            mapping.on_close(lambda: self.unregister_host(address))


class CpuEdge(DeviceEdge):
    """The CPU implementation: the "device" is host memory, copies happen on return. CI runs every device
    path with it on tensors of the exact shapes and strides GPU backends allocate. Its device memory, where an
    API takes raw addresses (``kvpool.mooncake``), is what :meth:`alloc` handed out: those addresses are
    device addresses to :func:`kvpool.device.pointers.device_memory`, as a CUDA allocation's are."""

    name = "cpu"

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self._lock = threading.Lock()
        self._allocations: dict[int, Any] = {}  # address -> uint8 tensor

    def alloc(self, nbytes: int) -> Any:
        """``nbytes`` of this edge's device memory (a uint8 tensor), until :meth:`free`."""
        t = torch.zeros(nbytes, dtype=torch.uint8)
        with self._lock:
            self._allocations[t.data_ptr()] = t
        return t

    def free(self, tensor: Any) -> None:
        with self._lock:
            self._allocations.pop(tensor.data_ptr(), None)

    def _find(self, address: int, nbytes: int) -> Optional[tuple[int, Any]]:
        with self._lock:
            for base, t in self._allocations.items():
                if base <= address and address + nbytes <= base + t.numel():
                    return base, t
        return None

    def owns(self, address: int, nbytes: int) -> bool:
        return self._find(address, nbytes) is not None

    def wrap(self, address: int, nbytes: int) -> Any:
        found = self._find(address, nbytes)
        if found is None:
            raise ValueError(f"kvpool device edge: [0x{address:x}, +{nbytes}) is not device memory of this edge")
        base, t = found
        return t[address - base:address - base + nbytes]

    def host(self, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, dst: Any, src: Any) -> None:
        dst.copy_(src)
        self.bytes_copied += dst.numel() * dst.element_size()

    def mark(self) -> Event:
        return Event()

    def after(self, event: Event) -> None:
        return None

    def done(self) -> Event:
        return Event()


class CudaEdge(DeviceEdge):
    """The CUDA implementation: pinned host memory, one side stream per edge for both directions (so that a
    save never waits behind the engine's kernels and a load's copies run in issue order), events for order.

    Args:
        device: the engine's CUDA device (a ``torch.device`` or its index).
    """

    name = "cuda"

    def __init__(self, device: Any = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("kvpool device edge: CUDA is not available in this torch build or machine")
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else
                                   (device.index if isinstance(device, torch.device) else int(device)))
        self._stream = torch.cuda.Stream(device=self.device)
        self._lock = threading.Lock()
        self._registered: dict[int, int] = {}

    def host(self, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy(self, dst: Any, src: Any) -> None:
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            # the caching allocator must not hand the device side's memory to another stream's kernels
            # before this copy is done
            for t in (dst, src):
                if t.is_cuda:
                    t.record_stream(self._stream)
        self.bytes_copied += dst.numel() * dst.element_size()

    @contextlib.contextmanager
    def side(self) -> Iterator[Any]:
        with torch.cuda.stream(self._stream):
            yield self._stream

    def mark(self) -> Event:
        e = torch.cuda.Event()
        e.record(torch.cuda.current_stream(self.device))
        return Event(e)

    def after(self, event: Event) -> None:
        if event._e is not None:
            self._stream.wait_event(event._e)

    def done(self) -> Event:
        e = torch.cuda.Event()
        e.record(self._stream)
        return Event(e)

    def register_host(self, address: int, nbytes: int) -> bool:
        """True if the range was registered now (False: it was already, or the runtime refused)."""
        with self._lock:
            if address in self._registered:
                return False
            # cudaHostRegisterPortable (1): the range is pinned for every CUDA context
            rc = torch.cuda.cudart().cudaHostRegister(address, nbytes, 1)
            code = int(getattr(rc, "value", rc))
            if code != 0:
                return False
            self._registered[address] = nbytes
            return True

    def unregister_host(self, address: int) -> None:
        with self._lock:
            if self._registered.pop(address, None) is not None:
                torch.cuda.cudart().cudaHostUnregister(address)

    def owns(self, address: int, nbytes: int) -> bool:
        from .cudart import device_of
        return device_of(address) == self.device.index

    def wrap(self, address: int, nbytes: int) -> Any:
        return torch.as_tensor(_CudaRange(address, nbytes), device=self.device)


class _CudaRange:
    """Raw device memory as torch takes it without a copy (``__cuda_array_interface__``, version 3)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


def edge_for(tensor: Any, choice: Optional[str] = None) -> DeviceEdge:
    """The edge for an engine's cache tensor: ``choice`` ``"cuda"`` or ``"cpu"`` when given, else from the
    tensor's device (CUDA tensors get a :class:`CudaEdge`, CPU tensors a :class:`CpuEdge`).

    Raises ValueError for a device this edge has no implementation of (naming it)."""
    kind = choice or tensor.device.type
    if kind == "cuda":
        return CudaEdge(tensor.device)
    if kind == "cpu":
        return CpuEdge()
    raise ValueError(f"kvpool device edge: no implementation for device {kind!r} (cuda and cpu are)")

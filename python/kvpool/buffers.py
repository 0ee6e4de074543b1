"""Turning what callers pass into flat byte views without copying.

Callers hand the client bytes, bytearrays, memoryviews, mmaps, numpy arrays, CPU torch tensors, or
raw addresses (ints, what engines pass to Mooncake-style APIs). Everything becomes a one-dimensional
``memoryview`` of format ``B`` over the caller's memory, so values are sent from and read into that
memory directly.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from typing import Any, Iterator, Union


class RawBuffer:
    """``size`` bytes of this process's memory at ``address`` (for example a tensor's ``data_ptr()``).

    The caller keeps the memory alive and mapped for as long as a call uses it. Nothing checks the
    address: a wrong one crashes the process, exactly as it would in C. Device (GPU) memory is not
    host memory and must be staged through a host buffer first.
    """

    __slots__ = ("address", "size")

    def __init__(self, address: int, size: int) -> None:
        if not isinstance(address, int) or address <= 0:
            raise ValueError(f"raw buffer address must be a positive int, got {address!r}")
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"raw buffer size must be a non-negative int, got {size!r}")
        self.address = address
        self.size = size

    def view(self) -> memoryview:
        if self.size == 0:
            return memoryview(bytearray(0))
        return memoryview((ctypes.c_char * self.size).from_address(self.address)).cast("B")

    def __repr__(self) -> str:
        return f"RawBuffer(0x{self.address:x}, {self.size})"


class Filler:
    """A value whose bytes are not in host memory yet (an engine's device KV): it writes itself where the pool
    wants it. On the same-machine path under a write lease the client hands :meth:`fill` the destination in the
    node's mapped segment, so the bytes land there in one transfer (a GPU's DMA) and are checksummed there;
    every other path takes :meth:`materialize` (host memory the value is copied into once).

    Subclasses give ``nbytes``, :meth:`fill` and :meth:`materialize` (``kvpool.device.blocks`` has the device
    edge's)."""

    nbytes: int = 0

    def fill(self, address: int, mapping: Any) -> None:
        """Writes the value's ``nbytes`` to host address ``address``, inside ``mapping`` (a ``kvpool.shm.Mapping``,
        which a device may register once, and unregister from its ``on_close``), and returns when they are
        there."""
        raise NotImplementedError

    def materialize(self) -> memoryview:
        """The value's bytes in host memory (made once; later calls give the same view)."""
        raise NotImplementedError


Buffer = Union[bytes, bytearray, memoryview, RawBuffer, Any]


def materialize(views: list[Any], start: int = 0, end: int | None = None) -> None:
    """Replaces every :class:`Filler` in ``views[start:end]`` by its bytes in host memory."""
    for i in range(start, len(views) if end is None else end):
        if isinstance(views[i], Filler):
            views[i] = views[i].materialize()


def as_memoryview(buf: Buffer, *, writable: bool = False, what: str = "buffer") -> memoryview:
    """A flat byte view of ``buf`` without copying.

    Raises ValueError for a non-contiguous buffer, a read-only one where ``writable`` is asked, or a
    tensor that is not on the CPU; TypeError for objects that expose no memory at all.
    """
    if isinstance(buf, memoryview):
        mv = buf
    elif isinstance(buf, RawBuffer):
        return buf.view()
    elif isinstance(buf, Filler):
        return buf.materialize()
    elif isinstance(buf, (bytes, bytearray)):
        mv = memoryview(buf)
    elif hasattr(buf, "data_ptr") and hasattr(buf, "element_size") and hasattr(buf, "is_contiguous"):
        # a torch tensor: CPU and contiguous only, viewed through its data pointer
        tensor: Any = buf
        device = str(getattr(buf, "device", "cpu"))
        if not device.startswith("cpu"):
            raise ValueError(f"{what} is a tensor on {device}; kvpool reads and writes host memory only "
                             "(stage it through a CPU tensor)")
        if not tensor.is_contiguous():
            raise ValueError(f"{what} is a non-contiguous tensor; pass .contiguous() or a view of whole blocks")
        n = tensor.numel() * tensor.element_size()
        return RawBuffer(tensor.data_ptr(), n).view() if n else memoryview(bytearray(0))
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError(f"{what} of type {type(buf).__name__} exposes no memory (pass bytes, bytearray, "
                            "memoryview, mmap, a numpy array, a CPU torch tensor or kvpool.RawBuffer)") from None
    if writable and mv.readonly:
        raise ValueError(f"{what} is read-only; a read needs writable memory")
    if not mv.c_contiguous:
        raise ValueError(f"{what} is not contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B") if mv.ndim <= 1 else mv.cast("B", (mv.nbytes,))
    return mv


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable since 3.3), to get the address of a read-only buffer."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class Pins:
    """Addresses of many buffers' first bytes, each buffer pinned (its memory kept where it is) until
    ``release``: writable ones through ctypes' ``from_buffer``, read-only ones (bytes) through the buffer
    protocol itself. No byte is copied. For handing memory to foreign calls (``kvpool.lanes``)."""

    __slots__ = ("_arrays", "_views")

    def __init__(self) -> None:
        self._arrays: list[Any] = []
        self._views: list[_PyBuffer] = []

    def address(self, mv: memoryview) -> int:
        """The address of ``mv``'s first byte (a contiguous buffer), valid until ``release``; 0 when empty."""
        if not mv.nbytes:
            return 0
        if not mv.readonly:
            c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
            self._arrays.append(c)
            return ctypes.addressof(c)
        view = _PyBuffer()
        if _get_buffer(mv, ctypes.byref(view), 0) != 0:  # PyBUF_SIMPLE; raises on failure
            raise ValueError("cannot take the address of a read-only buffer")
        self._views.append(view)
        return int(view.buf or 0)

    def release(self) -> None:
        self._arrays.clear()
        views, self._views = self._views, []
        for v in views:
            _release_buffer(ctypes.byref(v))

    def __enter__(self) -> Pins:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def address_of(mv: memoryview) -> Iterator[int]:
    """The address of a contiguous buffer's first byte, valid inside the ``with`` block (``Pins``)."""
    with Pins() as pins:
        yield pins.address(mv)

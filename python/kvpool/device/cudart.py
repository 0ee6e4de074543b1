"""What kind of memory an address is, from the CUDA runtime the process has loaded (``cudaPointerGetAttributes``).

The runtime is the one torch loaded (found in ``/proc/self/maps``), called through ``ctypes``: no new
dependency, and nothing is loaded into a process that has no CUDA. Before torch has initialised CUDA, or
without a runtime, every address is host memory to this module.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

__all__ = ["device_of"]

_CUDA_MEMORY_DEVICE = 2
_CUDA_MEMORY_MANAGED = 3


class _Attributes(ctypes.Structure):
    # cudaPointerAttributes since CUDA 11 begins with type, device, devicePointer, hostPointer. Later runtimes
    # append fields (CUDA 13: a union and reserved longs, 88 bytes in all) and write all of them: a struct of
    # only the four fields let the runtime write past it, and the process crashed later, elsewhere (seen on an
    # H200 with torch 2.11 and CUDA 13, scripts/gpu-check.sh). The tail leaves room for what a runtime adds.
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p), ("_tail", ctypes.c_byte * 232)]


_lock = threading.Lock()
_runtime: Any = None
_looked = False


def _loaded_runtime() -> Any:
    """The CUDA runtime library mapped into this process, or None."""
    global _runtime, _looked
    with _lock:
        if _looked and _runtime is not None:
            return _runtime
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "libcudart.so" in line}
        except OSError:
            paths = set()
        _looked = True
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
                lib.cudaPointerGetAttributes.argtypes = [ctypes.POINTER(_Attributes), ctypes.c_void_p]
                lib.cudaPointerGetAttributes.restype = ctypes.c_int
                _runtime = lib
                break
            except (OSError, AttributeError):
                continue
        return _runtime


def device_of(address: int) -> Optional[int]:
    """The CUDA device index whose memory ``address`` is (device or managed memory), or None for host memory,
    an unknown address, or a process without a CUDA runtime."""
    lib = _loaded_runtime()
    if lib is None:
        return None
    attrs = _Attributes()
    if lib.cudaPointerGetAttributes(ctypes.byref(attrs), ctypes.c_void_p(address)) != 0:
        try:
            lib.cudaGetLastError()  # clear the sticky-free error an unknown pointer leaves
        except AttributeError:
            pass
        return None
    if attrs.type in (_CUDA_MEMORY_DEVICE, _CUDA_MEMORY_MANAGED):
        return int(attrs.device)
    return None

"""A drop-in for Mooncake Store's Python API, backed by kvpool.

``from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig`` replaces
``from mooncake.store import MooncakeDistributedStore, ReplicateConfig``; or call
:func:`install` once (for example from a ``.pth`` file) so that unchanged engines importing
``mooncake.store`` get this module.

The API matched is the binding ``mooncake.store`` of the wheel ``mooncake-transfer-engine-non-cuda``
0.3.13.post1 (PyPI): every public name, signature and class member, checked against the installed wheel
by ``python/peer_tests/test_mooncake_parity.py``; behaviour read from Mooncake's sources
(``store_py.cpp``, ``real_client.cpp``, ``types.h``) and compared call by call with the real Mooncake by
``test_mooncake_differential.py`` (docs/python.md lists what differs and why). Conventions kept:

* Every call returns a value, never raises for a failed operation: ``0`` or a byte count on
  success, a negative Mooncake ``ErrorCode`` on failure. Wrong argument *types* (a str where an int
  address belongs, a negative size) raise ``TypeError`` as pybind11 does.
* ``put`` of a key that exists returns 0 (Mooncake treats OBJECT_ALREADY_EXISTS as success); the
  stored value is unchanged. ``upsert*`` replaces it.
* ``is_exist``: 1 present, 0 absent, negative error. ``get``: ``b""`` on a miss or error.
  ``get_into``: bytes read, or negative (-704 missing, -600 buffer too small).
* ``health_check``: 0 healthy, 1 not set up or closed, 2 master unreachable.
* Buffers passed by address are read and written in place. Mooncake over TCP does not require
  ``register_buffer`` before ``put_from``/``get_into`` and neither does this module; registration is
  recorded (overlaps refused, as the transfer engine does) and checked to be host memory.

kvpool moves bytes over TCP or through shared memory on the same host: there is no RDMA, no GPU
direct path, no transfer engine and no segment contributed by clients. Addresses must be host memory;
each address range is checked against the process's mappings as they are at the time of the call
(``PROCMAP_QUERY`` on ``/proc/self/maps`` on Linux 6.11 and later; on older kernels a populate probe, or
``/proc/self/maps`` read afresh) so that a device (GPU) pointer or a stray address, also one that was
fine before and has since been mapped again without access, yields -600 (INVALID_PARAMS) instead of a
crash.

The package's modules, each importing only those before it: ``codes`` (error numbers, enums, the
logger), ``args`` (argument checks, sizes, addresses, host memory, the regex plan), ``config``
(``MooncakeConfig``), ``replicate`` (``ReplicateConfig``), ``transfer`` (staged writes and scattered
reads), ``descriptors`` (replica descriptors, replica and task states), ``tensor_layout`` (the bytes of
Mooncake's tensor objects and manifests, the safetensors codec), ``parallelism`` (``ParallelAxis``,
``TensorParallelism``, ``ReadTarget``, shard keys, reconstruction from shards), ``tensors`` and
``tensors_parallel`` (the store's tensor methods), ``ranges`` (ranged calls and sessions), ``admin``
(replicas, segments, tasks; the dummy client's memory pool takes from ``host_memory``'s allocator), ``store``
(the store class), then ``buffer_pool`` (``BufferPool`` and its leases), ``host_memory`` (the host
allocator, allocator hooks, NUMA binding), ``engram``, and ``structured_codecs`` and
``structured_object_store`` (Mooncake's structured object store, ``mooncake.structured_object_store``
after :func:`install`; not imported by this package until install or first use).
Everything is used through this package, which is also what :func:`install` registers.
"""

from __future__ import annotations

import sys
import types

from . import codes, transfer
from .args import (DEFAULT_CLIENT_HTTP_PORT, DEFAULT_MASTER_PORT, DEFAULT_MASTER_SERVER_ADDR, _master_address,
                   parse_byte_size, regex_removal_plan)
from .codes import (HC_HEALTHY, HC_MASTER_UNREACHABLE, HC_NOT_INITIALIZED, ErrorCode, ObjectDataType,
                    SoftPinAction, log)
from .config import DEFAULT_GLOBAL_SEGMENT_SIZE, DEFAULT_LOCAL_BUFFER_SIZE, MooncakeConfig, load_config
from .store import BufferHandle, MooncakeDistributedStore
from .transfer import STAGING_BATCH_BYTES
from . import (admin, buffer_pool, descriptors, engram, host_memory, parallelism, ranges, replicate, tensors,
               tensors_parallel)
from .admin import *  # noqa: F401,F403 - each module lists its public names in __all__
from .buffer_pool import *  # noqa: F401,F403
from .host_memory import *  # noqa: F401,F403
from .descriptors import *  # noqa: F401,F403
from .engram import *  # noqa: F401,F403
from .parallelism import *  # noqa: F401,F403
from .ranges import *  # noqa: F401,F403
from .replicate import *  # noqa: F401,F403
from .tensors import *  # noqa: F401,F403
from .tensors_parallel import *  # noqa: F401,F403

__all__ = [
    "MooncakeDistributedStore", "ErrorCode", "SoftPinAction", "ObjectDataType",
    "BufferHandle", "MooncakeConfig", "load_config", "install", "parse_byte_size",
    "HC_HEALTHY", "HC_NOT_INITIALIZED", "HC_MASTER_UNREACHABLE", "DEFAULT_MASTER_PORT",
    *admin.__all__, *buffer_pool.__all__, *host_memory.__all__, *descriptors.__all__, *engram.__all__, *parallelism.__all__,
    *ranges.__all__, *replicate.__all__, *tensors.__all__, *tensors_parallel.__all__,
]



# ------------------------------------------------------------------------------------ import alias

def install(force: bool = False) -> types.ModuleType:
    """Makes ``import mooncake.store`` (and ``from mooncake.store import ...``) give this module, so engines
    that import Mooncake run over kvpool unchanged; with it the wheel's pure-Python modules others import
    beside the store: ``mooncake.mooncake_config``, ``mooncake.buffer_pool`` and
    ``mooncake.structured_object_store`` (kvpool's own, each with the wheel's names). Call it before the
    engine imports Mooncake, in every process (a ``.pth`` file or ``sitecustomize`` does that). If the real
    ``mooncake`` package is installed, its ``store`` is replaced only with ``force=True``. Returns the
    ``mooncake.store`` module.
    """
    me = sys.modules[__name__]
    current = sys.modules.get("mooncake.store")
    if current is me:
        return me
    parent = sys.modules.get("mooncake")
    if parent is None and not force:
        try:
            import importlib.util
            real = importlib.util.find_spec("mooncake")
        except (ImportError, ValueError):
            real = None
        if real is not None and real.origin in (None, "namespace"):
            real = None  # a bare folder named mooncake on sys.path (a namespace package), not Mooncake's wheel
        if real is not None:
            log.warning("kvpool.mooncake.install: the real 'mooncake' package is installed; leaving it alone "
                        "(install(force=True) replaces mooncake.store)")
            import mooncake.store as real_store  # type: ignore[import-not-found]
            return real_store
    if parent is None:
        parent = types.ModuleType("mooncake")
        parent.__path__ = []  # a package, so "mooncake.store" imports resolve through sys.modules
        parent.__doc__ = "kvpool's stand-in for the mooncake package (kvpool.mooncake.install)"
        parent.__file__ = me.__file__  # programs look at mooncake.__file__ to find the package's directory
        sys.modules["mooncake"] = parent
        from . import buffer_pool as buffer_pool_module, config as config_module
        from . import structured_object_store as structured_module
        for name, module in (("mooncake_config", config_module), ("buffer_pool", buffer_pool_module),
                             ("structured_object_store", structured_module)):
            sys.modules[f"mooncake.{name}"] = module  # the real package's modules engines import beside the store
            setattr(parent, name, module)
    elif current is not None and not force:
        log.warning("kvpool.mooncake.install: mooncake.store is already imported; leaving it alone "
                    "(install(force=True) replaces it)")
        return current
    sys.modules["mooncake.store"] = me
    setattr(parent, "store", me)
    return me

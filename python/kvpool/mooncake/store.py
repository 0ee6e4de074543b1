"""``MooncakeDistributedStore`` and its argument types: Mooncake's API, each call checked and answered
with Mooncake's codes; the bytes move through :mod:`.transfer`."""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, Optional, Sequence

from ..buffers import as_memoryview
from ..errors import MasterUnreachable
from .args import (DEFAULT_CLIENT_HTTP_PORT, DEFAULT_MASTER_SERVER_ADDR, Pieces, _buffer_address, _flat_pieces,
                   _has_explicit_port, _host_memory, _key_ok, _keys_arg, _master_address, _nested_pieces,
                   _parse_bool, _str_arg, _uint, parse_byte_size, regex_removal_plan)
from .codes import (HC_HEALTHY, HC_MASTER_UNREACHABLE, HC_NOT_INITIALIZED, _INTERNAL, _INVALID, _NOT_FOUND,
                    _NOT_SUPPORTED, _OK, _code_for, _warn_once, log)
from . import device_buffers
from .admin import _AdminMethods
from .ranges import _RangeMethods
from .replicate import ReplicateConfig, config_arg
from .tensors import _TensorMethods
from .tensors_parallel import _ParallelTensorMethods
from .transfer import _Item, get_values, read_pieces, write_items

#: setup()'s defaults (types.h DEFAULT_GLOBAL_SEGMENT_SIZE / DEFAULT_LOCAL_BUFFER_SIZE, MIN/MAX_SEGMENT_SIZE).
_SETUP_DEFAULT_SIZE = 16 * 1024 * 1024
_MIN_SEGMENT_SIZE = 1024
_MAX_SEGMENT_SIZE = 1 << 40


class BufferHandle(bytearray):
    """What ``get_buffer`` returns: the value's bytes (a writable buffer) with Mooncake's
    ``ptr()`` / ``size()`` accessors. ``len()``, ``memoryview()``, ``bytes()`` and
    ``torch.frombuffer`` work on it as on Mooncake's ``BufferHandle``."""

    def ptr(self) -> int:
        """The address of the first byte (valid while the handle lives)."""
        if not len(self):
            return 0
        return _buffer_address(self)

    def size(self) -> int:
        """The number of bytes."""
        return len(self)


class MooncakeDistributedStore(_ParallelTensorMethods, _TensorMethods, _RangeMethods, _AdminMethods):
    """Mooncake's ``MooncakeDistributedStore`` over a kvpool pool.

    ``MooncakeDistributedStore()`` then ``setup(...)`` connects to the kvpool master named by
    ``master_server_addr``. ``client_factory`` (a kvpool extension) builds the client from the
    master address; by default ``kvpool.Client(master)``.
    """

    def __init__(self, client_factory: Optional[Callable[[str], Any]] = None) -> None:
        self._client_factory = client_factory
        self._client: Any = None
        self._lock = threading.Lock()
        self._hostname = ""
        self._port_holder: Optional[socket.socket] = None  # the port in get_hostname() when no node is local
        self._local_buffer_size = 0
        self._registered: dict[int, int] = {}  # base address -> size
        self._dummy = False  # set up with setup_dummy: alloc_from_mem_pool maps memory (admin.py)

    # ---------------------------------------------------------------------------- lifecycle

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Connects to the kvpool master; 0 on success, a negative Mooncake error code otherwise.

        Two forms, as in Mooncake: ``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None,
        enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
        enable_client_http_server=False, client_http_port=9300)`` and ``setup(config: dict)``.
        ``master_server_addr`` is the kvpool master's ``host:port`` (port 50051 when omitted).
        Fields without meaning for kvpool are accepted with a warning, once; a non-default
        ``tenant_id`` is refused (-600) because kvpool has no tenants.
        """
        if (len(args) == 1 and not kwargs and isinstance(args[0], dict)) or \
                (not args and set(kwargs) == {"config"} and isinstance(kwargs["config"], dict)):
            config = args[0] if args else kwargs["config"]
            return self._setup_dict(config)
        return self._setup_positional(*args, **kwargs)

    def _setup_positional(self, local_hostname: str, metadata_server: str, global_segment_size: int,
                          local_buffer_size: int, protocol: str, rdma_devices: str, master_server_addr: str,
                          engine: Any = None, enable_ssd_offload: bool = False, ssd_offload_path: str = "",
                          tenant_id: str = "default", enable_client_http_server: bool = False,
                          client_http_port: int = DEFAULT_CLIENT_HTTP_PORT) -> int:
        local_hostname = _str_arg(local_hostname, "local_hostname")
        metadata_server = _str_arg(metadata_server, "metadata_server")
        gss = _uint(global_segment_size, "global_segment_size")
        lbs = _uint(local_buffer_size, "local_buffer_size")
        protocol = _str_arg(protocol, "protocol")
        rdma_devices = _str_arg(rdma_devices, "rdma_devices")
        master_server_addr = _str_arg(master_server_addr, "master_server_addr")
        return self._connect(local_hostname=local_hostname, metadata_server=metadata_server, global_segment_size=gss,
                             local_buffer_size=lbs, protocol=protocol, rdma_devices=rdma_devices,
                             master_server_addr=master_server_addr, engine=engine,
                             enable_ssd_offload=bool(enable_ssd_offload), ssd_offload_path=str(ssd_offload_path or ""),
                             tenant_id=str(tenant_id), enable_client_http_server=bool(enable_client_http_server),
                             ipc_socket_path="", check_sizes=False)

    def _setup_dict(self, config: dict) -> int:
        # Mooncake converts every value with str() and parses it again (real_client.cpp setup_internal(ConfigDict))
        cfg = {str(k): str(v) for k, v in config.items()}
        local_hostname = cfg.get("local_hostname", "")
        metadata_server = cfg.get("metadata_server", "")
        if not local_hostname:
            log.error("kvpool.mooncake setup: missing required config: local_hostname")
            return _INVALID
        if not metadata_server:
            log.error("kvpool.mooncake setup: missing required config: metadata_server")
            return _INVALID
        sizes = {}
        for name in ("global_segment_size", "local_buffer_size"):
            if name in cfg:
                n = parse_byte_size(cfg[name])
                if n is None:
                    log.error("kvpool.mooncake setup: invalid size value for config key %r: %s", name, cfg[name])
                    return _INVALID
                sizes[name] = n
            else:
                sizes[name] = _SETUP_DEFAULT_SIZE
        master = cfg.get("master_server_addr")
        if master is None and "master_server_address" in cfg:
            master = cfg["master_server_address"]  # a kvpool courtesy: Mooncake itself only reads master_server_addr
            log.info("kvpool.mooncake setup: using master_server_address %s (Mooncake's setup(dict) key is "
                     "master_server_addr)", master)
        enable_ssd = _parse_bool(cfg.get("enable_ssd_offload", "false"))
        http = _parse_bool(cfg.get("enable_client_http_server", "false"))
        return self._connect(local_hostname=local_hostname, metadata_server=metadata_server,
                             global_segment_size=sizes["global_segment_size"],
                             local_buffer_size=sizes["local_buffer_size"],
                             protocol=cfg.get("protocol", "tcp"),
                             rdma_devices=cfg.get("rdma_devices", cfg.get("device_name", "")),
                             master_server_addr=master if master is not None else DEFAULT_MASTER_SERVER_ADDR,
                             engine=None, enable_ssd_offload=bool(enable_ssd),
                             ssd_offload_path=cfg.get("ssd_offload_path", ""),
                             tenant_id=cfg.get("tenant_id", "default") or "default",
                             enable_client_http_server=bool(http), ipc_socket_path=cfg.get("ipc_socket_path", ""),
                             check_sizes=True)

    def _connect(self, *, local_hostname: str, metadata_server: str, global_segment_size: int,
                 local_buffer_size: int, protocol: str, rdma_devices: str, master_server_addr: str, engine: Any,
                 enable_ssd_offload: bool, ssd_offload_path: str, tenant_id: str, enable_client_http_server: bool,
                 ipc_socket_path: str, check_sizes: bool) -> int:
        if not local_hostname:
            log.error("kvpool.mooncake setup: local_hostname is empty")
            return _INVALID
        if check_sizes:
            if global_segment_size and global_segment_size < _MIN_SEGMENT_SIZE:
                log.error("kvpool.mooncake setup: invalid global_segment_size %d, must be 0 or at least %d",
                          global_segment_size, _MIN_SEGMENT_SIZE)
                return _INVALID
            if (local_buffer_size and local_buffer_size < _MIN_SEGMENT_SIZE) or local_buffer_size > _MAX_SEGMENT_SIZE:
                log.error("kvpool.mooncake setup: invalid local_buffer_size %d, must be 0 or between %d and %d",
                          local_buffer_size, _MIN_SEGMENT_SIZE, _MAX_SEGMENT_SIZE)
                return _INVALID
        if tenant_id != "default":
            log.error("kvpool.mooncake setup: tenant_id %r is not supported: kvpool has no tenants and would mix "
                      "their keys; run a separate pool per tenant", tenant_id)
            return _INVALID
        try:
            master = _master_address(master_server_addr)
        except ValueError as e:
            log.error("kvpool.mooncake setup: %s", e)
            return _INVALID
        self._explain_ignored(metadata_server=metadata_server, global_segment_size=global_segment_size,
                              local_buffer_size=local_buffer_size, protocol=protocol, rdma_devices=rdma_devices,
                              engine=engine, enable_ssd_offload=enable_ssd_offload, ssd_offload_path=ssd_offload_path,
                              enable_client_http_server=enable_client_http_server, ipc_socket_path=ipc_socket_path)
        try:
            client = self._client_factory(master) if self._client_factory is not None else _new_client(master)
        except MasterUnreachable as e:
            log.error("kvpool.mooncake setup: cannot reach the kvpool master: %s", e)
            # Mooncake: INVALID_PARAMS when the hostname names its port, INTERNAL_ERROR after its port retries
            return _INVALID if _has_explicit_port(local_hostname) else _INTERNAL
        except ValueError as e:
            log.error("kvpool.mooncake setup: %s", e)
            return _INVALID
        except Exception as e:  # noqa: BLE001 - a setup failure is a code, never an exception
            log.error("kvpool.mooncake setup failed: %s", e)
            return _INTERNAL
        name, port_holder = _segment_name(local_hostname, client)
        self._install(client, name, port_holder, local_buffer_size, dummy=False)
        log.info("kvpool.mooncake: connected to the kvpool master at %s as %s", master, name)
        return _OK

    def _install(self, client: Any, hostname: str, port_holder: Optional[socket.socket],
                 local_buffer_size: int, *, dummy: bool) -> None:
        """Makes ``client`` this store's client, closing the one before it (and ending its sessions)."""
        self._drop_sessions()
        with self._lock:
            old, self._client = self._client, client
            old_holder, self._port_holder = self._port_holder, port_holder
            self._hostname = hostname
            self._local_buffer_size = local_buffer_size  # the capacity of a BufferPool's local buffer
            self._dummy = dummy
            self._registered.clear()
        for thing in (old, old_holder):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001
                    pass

    @staticmethod
    def _explain_ignored(*, metadata_server: str, global_segment_size: int, local_buffer_size: int, protocol: str,
                         rdma_devices: str, engine: Any, enable_ssd_offload: bool, ssd_offload_path: str,
                         enable_client_http_server: bool, ipc_socket_path: str) -> None:
        proto = (protocol or "tcp").strip().lower()
        if proto != "tcp":
            _warn_once("protocol", "kvpool.mooncake: protocol %r ignored: kvpool moves bytes over TCP, or through "
                       "shared memory on the same host; there is no RDMA or device transport", protocol)
        if rdma_devices:
            _warn_once("rdma_devices", "kvpool.mooncake: device(s) %r ignored: kvpool uses no RDMA devices",
                       rdma_devices)
        if engine is not None:
            _warn_once("engine", "kvpool.mooncake: the transfer engine passed to setup() is ignored: kvpool has none")
        ignored = []
        if global_segment_size:
            ignored.append(f"global_segment_size={global_segment_size} (clients contribute no memory; capacity "
                           "comes from kvpool nodes)")
        if local_buffer_size:
            ignored.append(f"local_buffer_size={local_buffer_size} (no staging buffer is needed)")
        if metadata_server and metadata_server != "P2PHANDSHAKE":
            ignored.append(f"metadata_server={metadata_server!r} (the kvpool master is the only metadata service)")
        if ignored:
            _warn_once("sizes", "kvpool.mooncake: setup fields without meaning for kvpool are ignored: %s",
                       "; ".join(ignored))
        if enable_ssd_offload or ssd_offload_path:
            _warn_once("ssd", "kvpool.mooncake: SSD offload settings ignored: kvpool's disk tier is configured on "
                       "its nodes")
        if enable_client_http_server:
            _warn_once("http", "kvpool.mooncake: the client HTTP server is not provided; the kvpool master serves "
                       "metrics")
        if ipc_socket_path:
            _warn_once("ipc", "kvpool.mooncake: ipc_socket_path ignored")

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's dummy client: a client that owns no memory and reaches the pool through a server, which
        is what every kvpool client is. ``server_address`` is the kvpool master's ``host:port`` (in Mooncake,
        the standalone store process's); the sizes are checked and ignored (kvpool needs no client-side
        shared-memory buffer). 0 on success; -1 when the master cannot be reached, as Mooncake answers a
        server it cannot connect to. ``get_hostname()`` is then ``""``, as for Mooncake's dummy client.
        As in the wheel, the store then has a memory pool: ``alloc_from_mem_pool`` maps shared memory, which
        ``register_buffer`` takes only whole (see there)."""
        _uint(mem_pool_size, "mem_pool_size")
        _uint(local_buffer_size, "local_buffer_size")
        server_address = _str_arg(server_address, "server_address")
        try:
            master = _master_address(server_address)
        except ValueError as e:
            log.error("kvpool.mooncake setup_dummy: %s", e)
            return _INTERNAL
        try:
            client = self._client_factory(master) if self._client_factory is not None else _new_client(master)
        except Exception as e:  # noqa: BLE001 - a setup failure is a code, never an exception
            log.error("kvpool.mooncake setup_dummy: cannot connect to the kvpool master at %s: %s", master, e)
            return _INTERNAL
        self._install(client, "", None, _uint(local_buffer_size, "local_buffer_size"), dummy=True)
        log.info("kvpool.mooncake: dummy client connected to the kvpool master at %s", master)
        return _OK

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake starts its transfer engine and mounts a segment of this client's memory: a kvpool client has
        neither (memory comes from kvpool nodes), so -1012 (NOT_SUPPORTED)."""
        _str_arg(protocol, "protocol")
        _str_arg(device_name, "device_name")
        _uint(mount_segment_size, "mount_segment_size")
        log.error("kvpool.mooncake init_all: not supported: kvpool clients contribute no memory and have no transfer "
                  "engine; memory comes from kvpool nodes (kvpool node --segment-size ...)")
        return _NOT_SUPPORTED

    def close(self) -> int:
        """Disconnects; 0. Later calls answer as before setup (health_check 1, others -600)."""
        self._drop_sessions()  # staged put sessions and fetched get sessions (ranges.py) end with the client
        with self._lock:
            client, self._client = self._client, None
            holder, self._port_holder = self._port_holder, None
            self._registered.clear()
        for thing in (client, holder):
            if thing is not None:
                try:
                    thing.close()
                except Exception as e:  # noqa: BLE001
                    log.warning("kvpool.mooncake: close: %s", e)
        return _OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable (pings the master)."""
        client = self._client
        if client is None:
            return HC_NOT_INITIALIZED
        try:
            client.ping()
            return HC_HEALTHY
        except Exception as e:  # noqa: BLE001
            log.debug("kvpool.mooncake health_check: %s", e)
            return HC_MASTER_UNREACHABLE

    def get_hostname(self) -> str:
        """This client's segment name, ``host:port`` ("" before setup and for a dummy client), which callers use
        as ``ReplicateConfig.preferred_segment`` to place puts locally and compare with a replica's
        ``transport_endpoint`` to tell local copies from remote ones. A ``local_hostname`` with a port is
        returned as given, as Mooncake does. Without one, Mooncake binds a port; kvpool clients own no segment,
        so the name is the segment of the kvpool node on this host (as seen at setup), and where there is none,
        ``local_hostname`` with a port this store keeps bound until ``close()``."""
        return self._hostname if self._client is not None else ""

    def _get_pyclient_capsule(self) -> Optional["MooncakeDistributedStore"]:
        """The binding's handle to the client behind a set-up store (None before setup): Mooncake's Python
        helpers (``BufferPool``) ask a store wrapper for it; kvpool's handle is the store itself."""
        return self if self._client is not None else None

    def _require(self, what: str) -> Any:
        client = self._client
        if client is None:
            log.error("kvpool.mooncake %s: the store is not set up (call setup first)", what)
        return client

    # ------------------------------------------------------------------------- registration

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Records ``[buffer_ptr, buffer_ptr + size)`` as registered; 0, or -600 for a null pointer, a zero
        size, an overlap with a registered range, or memory that is not readable and writable host memory.
        After ``setup_dummy``, memory of the pool (``alloc_from_mem_pool``, ``MooncakeHostMemAllocator``)
        follows the wheel's dummy client: only a whole allocation (its address and the size asked, rounded up
        to hugepages with them) is taken, again as often as asked (0); any part of one gives -1."""
        ptr = _uint(buffer_ptr, "buffer_ptr")
        n = _uint(size, "size")
        if self._require("register_buffer") is None:
            return _INVALID
        if self._dummy:
            pool_rc = self._register_pool_memory(ptr, n)
            if pool_rc is not None:
                return pool_rc
        if ptr == 0 or n == 0:
            log.error("kvpool.mooncake register_buffer: %s", "addr is nullptr" if ptr == 0 else "length is 0")
            return _INVALID
        if device_buffers.device_range(ptr, n) is None and not _host_memory.check(ptr, n, writable=True):
            log.error("kvpool.mooncake register_buffer: [0x%x, +%d) is neither readable and writable host memory nor "
                      "device memory of a device kvpool moves (CUDA, through torch)", ptr, n)
            return _INVALID
        with self._lock:
            for base, length in self._registered.items():
                if base < ptr + n and ptr < base + length:
                    log.error("kvpool.mooncake register_buffer: [0x%x, +%d) overlaps the registered [0x%x, +%d)",
                              ptr, n, base, length)
                    return _INVALID
            self._registered[ptr] = n
        return _OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Forgets a registration by its base address; 0, or -600 if that address was not registered (-1 for
        memory of the dummy client's pool, as the wheel's dummy client answers)."""
        ptr = _uint(buffer_ptr, "buffer_ptr")
        if self._require("unregister_buffer") is None:
            return _INVALID
        if self._dummy:
            pool_rc = self._unregister_pool_memory(ptr)
            if pool_rc is not None:
                return pool_rc
        with self._lock:
            if self._registered.pop(ptr, None) is None:
                log.error("kvpool.mooncake unregister_buffer: 0x%x is not a registered buffer", ptr)
                return _INVALID
        return _OK

    # ------------------------------------------------------------------------------ writes

    def _write(self, op: str, items: Sequence[Optional[_Item]], config: Any, upsert: bool) -> list[int]:
        """Writes items (None = already failed); a code per item."""
        config_arg(config, op)
        client = self._require(op)
        if client is None:
            return [_INVALID] * len(items)
        return write_items(client, op, items, config, upsert)

    def _one(self, op: str, key: Any, item_of: Callable[[str], Optional[_Item]], config: Any, upsert: bool,
             empty_ok: bool) -> int:
        k = _str_arg(key, "key")
        config_arg(config, op)
        item = item_of(k)
        _keep: list[Any] = []
        if item is not None and item.pieces is not None:
            (pieces,), _keep = device_buffers.stage_writes([item.pieces])
            item = _Item(k, pieces=pieces)
        if item is not None and item.size == 0 and empty_ok and self._client is not None:
            log.warning("kvpool.mooncake %s: attempting to put empty data for key %r", op, k[:80])
            return _OK  # Mooncake's put_from/put_parts return success without storing anything
        return self._write(op, [item], config, upsert)[0]

    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores a bytes-like value; 0 (also when the key exists: the value is then unchanged) or negative."""
        view = as_memoryview(value, what="value")
        return self._one("put", key, lambda k: _Item(k, view=view), config, False, False)

    def upsert(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores a bytes-like value, replacing any existing one; 0 or negative."""
        view = as_memoryview(value, what="value")
        return self._one("upsert", key, lambda k: _Item(k, view=view), config, True, False)

    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the concatenation of ``parts`` as one object; 0 or negative (0 for no bytes, storing nothing)."""
        views = [as_memoryview(pt, what="part") for pt in parts]
        return self._one("put_parts", key, lambda k: _Item(k, view=memoryview(b"".join(views))), config, False,
                         True)

    def upsert_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """``put_parts`` that replaces an existing object."""
        views = [as_memoryview(pt, what="part") for pt in parts]
        return self._one("upsert_parts", key, lambda k: _Item(k, view=memoryview(b"".join(views))), config, True,
                         True)

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: Optional[ReplicateConfig] = None) -> int:
        """Stores many bytes-like values; one code for the batch: 0, or the first key's failure."""
        return self._batch_bytes("put_batch", keys, values, config, False)

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any],
                     config: Optional[ReplicateConfig] = None) -> int:
        """``put_batch`` that replaces existing objects; one code for the batch."""
        return self._batch_bytes("upsert_batch", keys, values, config, True)

    def _batch_bytes(self, op: str, keys: Any, values: Any, config: Any, upsert: bool) -> int:
        ks = _keys_arg(keys)
        views = [as_memoryview(v, what="value") for v in values]
        if self._require(op) is None:
            return _INVALID
        if len(ks) != len(views):
            log.error("kvpool.mooncake %s: %d keys but %d values", op, len(ks), len(views))
            return _INVALID
        codes = self._write(op, [_Item(k, view=v) for k, v in zip(ks, views)], config, upsert)
        return next((c for c in codes if c != _OK), _OK)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``size`` bytes at address ``buffer_ptr``; 0 (also for size 0 and an existing key) or negative."""
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        return self._one("put_from", key, lambda k: _Item(k, pieces=[(ptr, n)]), config, False, True)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """``put_from`` that replaces an existing object."""
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        return self._one("upsert_from", key, lambda k: _Item(k, pieces=[(ptr, n)]), config, True, True)

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the metadata bytes followed by the data bytes as one object; 0 or negative."""
        ptr, mptr = _uint(buffer_ptr, "buffer_ptr"), _uint(metadata_buffer_ptr, "metadata_buffer_ptr")
        n, mn = _uint(size, "size"), _uint(metadata_size, "metadata_size")
        if n == 0 and self._client is not None:
            return _OK
        pieces = [(mptr, mn), (ptr, n)] if mn else [(ptr, n)]
        return self._one("put_from_with_metadata", key, lambda k: _Item(k, pieces=pieces), config, False, True)

    def _write_each(self, op: str, ks: list[str], pieces: Optional[list[Pieces]], config: Any,
                    upsert: bool) -> list[int]:
        """Writes each key's pieces; a code per key, -600 each before setup or when the argument lists did not
        match (pieces None). Mooncake answers [] for the multi-buffer calls before setup; a code per key is
        safer for callers that zip."""
        if pieces is None:
            return [_INVALID] * len(ks)
        staged, _keep = device_buffers.stage_writes(list(pieces))
        return self._write(op, [_Item(k, pieces=pc) for k, pc in zip(ks, staged)], config, upsert)

    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                       config: Optional[ReplicateConfig] = None) -> list[int]:
        """Stores each ``sizes[i]`` bytes at ``buffer_ptrs[i]`` under ``keys[i]``; a code per key (0 success,
        also for an existing key)."""
        return self._write_each("batch_put_from", *_flat_pieces("batch_put_from", keys, buffer_ptrs, sizes),
                                config, False)

    def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                          config: Optional[ReplicateConfig] = None) -> list[int]:
        """``batch_put_from`` that replaces existing objects."""
        return self._write_each("batch_upsert_from", *_flat_pieces("batch_upsert_from", keys, buffer_ptrs, sizes),
                                config, True)

    def batch_put_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     config: Optional[ReplicateConfig] = None) -> list[int]:
        """Stores, under each key, the concatenation of its buffers (gather); a code per key."""
        op = "batch_put_from_multi_buffers"
        return self._write_each(op, *_nested_pieces(op, keys, all_buffer_ptrs, all_sizes), config, False)

    def batch_upsert_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                        all_sizes: Sequence[Sequence[int]],
                                        config: Optional[ReplicateConfig] = None) -> list[int]:
        """``batch_put_from_multi_buffers`` that replaces existing objects."""
        op = "batch_upsert_from_multi_buffers"
        return self._write_each(op, *_nested_pieces(op, keys, all_buffer_ptrs, all_sizes), config, True)

    # ------------------------------------------------------------------------------- reads

    def get(self, key: str) -> bytes:
        """The value's bytes; ``b""`` on a miss or an error."""
        k = _str_arg(key, "key")
        client = self._require("get")
        if client is None or not _key_ok(k):
            return b""
        try:
            data = client.get(k)
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake get %r failed: %s", k[:80], e)
            return b""
        return bytes(data) if data is not None else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """Values for many keys, ``b""`` for a miss; ``[b""]`` when not set up or for no keys (as Mooncake)."""
        ks = _keys_arg(keys)
        client = self._require("get_batch")
        if client is None or not ks:
            return [b""]
        got = get_values(client, ks, "get_batch")
        return [bytes(v) if v is not None else b"" for v in got]

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The value in a ``BufferHandle`` (buffer protocol, ``ptr()``, ``size()``), or None on a miss."""
        k = _str_arg(key, "key")
        client = self._require("get_buffer")
        if client is None:
            return None
        v = get_values(client, [k], "get_buffer")[0]
        return BufferHandle(v) if v else None

    def batch_get_buffer(self, keys: Sequence[str]) -> list[Optional[BufferHandle]]:
        """``get_buffer`` for many keys: a ``BufferHandle`` or None per key."""
        ks = _keys_arg(keys)
        client = self._require("batch_get_buffer")
        if client is None:
            return [None] * len(ks)
        return [BufferHandle(v) if v else None for v in get_values(client, ks, "batch_get_buffer")]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads the value into ``size`` bytes at ``buffer_ptr``: bytes read, -704 missing, -600 buffer too
        small (or not writable host memory), other negative codes for failures."""
        k = _str_arg(key, "key")
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        return self._read("get_into", [k], [[(ptr, n)]])[0]

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """``get_into`` for many keys: bytes read or a negative code per key."""
        return self._read("batch_get_into", *_flat_pieces("batch_get_into", keys, buffer_ptrs, sizes))

    def batch_get_into_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Reads each value and scatters it over that key's buffers in order: the value's length or a negative
        code per key (-600 when the buffers together are smaller than the value)."""
        op = "batch_get_into_multi_buffers"
        return self._read(op, *_nested_pieces(op, keys, all_buffer_ptrs, all_sizes))

    def _read(self, op: str, ks: list[str], pieces: Optional[list[Pieces]]) -> list[int]:
        """Reads ks[i] into pieces[i] (scattering over several pieces); a length or code per key, -600 each when
        the argument lists did not match (pieces None)."""
        client = self._require(op)
        if client is None or pieces is None:
            return [_INVALID] * len(ks)
        staged, finish = device_buffers.stage_reads(list(pieces))
        got = read_pieces(client, op, ks, staged)
        finish(got)
        return got

    # ------------------------------------------------------------------------------ probes

    def _key_call(self, op: str, key: Any, absent: int, call: Callable[[Any, str], Any],
                  answer: Callable[[Any], int]) -> int:
        """One client call for one key: ``answer(call(client, key))``, ``absent`` for a key kvpool cannot hold,
        -600 before setup, a negative code if the call fails."""
        k = _str_arg(key, "key")
        client = self._require(op)
        if client is None:
            return _INVALID
        if not _key_ok(k):
            return absent
        try:
            result = call(client, k)
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake %s %r failed: %s", op, k[:80], e)
            return _code_for(e, data=False)
        return answer(result)

    def _keys_call(self, op: str, keys: Any, absent: int, call: Callable[[Any, list[str]], Sequence[Any]],
                   answer: Callable[[Any], int]) -> list[int]:
        """One batch client call for the keys kvpool can hold: ``answer(result)`` per key, ``absent`` for the
        others; -600 each before setup, the failure's code each if the call fails."""
        ks = _keys_arg(keys)
        client = self._require(op)
        if client is None:
            return [_INVALID] * len(ks)
        out = [absent] * len(ks)
        idx = [i for i, k in enumerate(ks) if _key_ok(k)]
        if not idx:
            return out
        try:
            results = call(client, [ks[i] for i in idx])
        except Exception as e:  # noqa: BLE001
            c = _code_for(e, data=False)
            log.error("kvpool.mooncake %s of %d key(s) failed (%d): %s", op, len(idx), c, e)
            return [c] * len(ks)
        for i, r in zip(idx, results):
            out[i] = answer(r)
        return out

    def is_exist(self, key: str) -> int:
        """1 if the key is present, 0 if not, a negative code on error."""
        return self._key_call("is_exist", key, 0, lambda c, k: c.exists(k), _present)

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """``is_exist`` per key: 1, 0 or a negative code."""
        return self._keys_call("batch_is_exist", keys, 0, lambda c, ks: c.batch_exists(ks), _present)

    def get_size(self, key: str) -> int:
        """The value's length, -704 if absent, another negative code on error."""
        return self._key_call("get_size", key, _NOT_FOUND, lambda c, k: c.size(k),
                              lambda n: _NOT_FOUND if n is None else int(n))

    # ----------------------------------------------------------------------------- removal

    def remove(self, key: str, force: bool = False) -> int:
        """Removes the object; 0, -704 if absent, another negative code on error. ``force`` has no effect
        (kvpool grants no leases that could hold a removal back)."""
        return self._key_call("remove", key, _NOT_FOUND, lambda c, k: c.remove(k), _removed)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """``remove`` per key: 0, -704 or another negative code."""
        return self._keys_call("batch_remove", keys, _NOT_FOUND, lambda c, ks: c.remove_batch(ks), _removed)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object; the count removed, or a negative code. ``force=True`` also discards puts in
        flight (kvpool fences them)."""
        client = self._require("remove_all")
        if client is None:
            return _INVALID
        try:
            return int(client.remove_all(force=bool(force)))
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake remove_all failed: %s", e)
            return _code_for(e, data=False)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes the objects whose keys the pattern matches (ECMAScript, searched anywhere in the key, as
        Mooncake's master does with std::regex_search); the count removed, or a negative code.

        kvpool cannot list keys, so only patterns that select a key prefix are carried out: ``^lit``,
        ``^lit.*`` (``.*?`` too), ``^lit$`` (one key), and the match-everything ``""``, ``^``, ``.*``,
        ``^.*``, where ``lit`` is literal text (metacharacters escaped with a backslash). Any other
        pattern (unanchored text matches anywhere in a key, classes, alternations, ``.*$``...) returns -600
        and removes nothing.
        """
        pattern = _str_arg(regex_pattern, "regex_pattern")
        client = self._require("remove_by_regex")
        if client is None:
            return _INVALID
        plan = regex_removal_plan(pattern)
        if plan is None:
            log.error("kvpool.mooncake remove_by_regex: pattern %r is not supported: kvpool cannot list keys, so it "
                      "removes only a literal key prefix ('^prefix' or '^prefix.*'), one key ('^key$') or "
                      "everything; nothing was removed", pattern)
            return _INVALID
        kind, lit = plan
        try:
            if kind == "all":
                return int(client.remove_all(force=bool(force)))
            if not _key_ok(lit):
                return 0  # no kvpool key can start with (or equal) a prefix longer than any key
            if kind == "exact":
                return 1 if client.remove(lit) else 0
            return int(client.remove_prefix(lit))
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake remove_by_regex %r failed: %s", pattern, e)
            return _code_for(e, data=False)


def _present(found: Any) -> int:
    """``is_exist``'s answer for a client's existence flag."""
    return 1 if found else 0


def _removed(removed: Any) -> int:
    """``remove``'s answer for a client's removal flag."""
    return _OK if removed else _NOT_FOUND


def _new_client(master: str) -> Any:
    from ..client import Client
    return Client(master)


def _segment_name(local_hostname: str, client: Any) -> tuple[str, Optional[socket.socket]]:
    """``get_hostname()``'s answer for a store set up with ``local_hostname``, and the socket that holds its
    port when the port is this store's own (see ``get_hostname``)."""
    host = local_hostname.strip()
    if _has_explicit_port(host):
        return host, None
    try:
        segments = client.status().segments
    except Exception as e:  # noqa: BLE001 - the name falls back to a port of our own
        log.debug("kvpool.mooncake setup: no segment table for get_hostname (%s)", e)
        segments = []
    from ..shm import is_local_host
    for seg in segments:
        if getattr(seg, "active", False) and is_local_host(seg.host):
            return seg.name, None
    holder = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("", 0))
    except OSError:
        holder.close()
        return host, None
    port = holder.getsockname()[1]
    bracketed = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    return f"{bracketed}:{port}", holder

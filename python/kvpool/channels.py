"""What every operation below ``kvpool.Client`` works with: the master channel, the segment directory, the
client's settings, its counters and its I/O threads.

The Python client is laid out as the Java one (docs/architecture.md, "The clients' layers"):

    Client (kvpool.client)                          the facade: arguments, results, nothing else
      reads, two_phase, leased_puts, ranged, parts  the operations
        read_lease, write_leases, locations         what puts and reads keep between calls
          Channels (here)                           settings, counters, threads
            SegmentDirectory, MasterChannel         where segments are; the way to the master
              _net (Connection, ConnectionPool)     frames on sockets

Each layer imports only layers below it: nothing imports the facade, and nothing below calls back up.
"""

from __future__ import annotations

import os
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from . import lanes
from . import protocol as p
from .auth import Secrets
from .master_channel import MasterChannel
from .protocol import Opcode
from .segment_directory import SegmentDirectory

#: A node frame carrying fewer value bytes than this goes over TCP (NODE_WRITE) even to a segment this
#: process has mapped: the same-machine write takes two exchanges with the node (SHM_WRITE_BEGIN and END)
#: where NODE_WRITE takes one, and below this size sending the bytes costs less than that exchange
#: (single puts measured on loopback, 2026-11-26: TCP 109 us and shared memory 149 us at 4 KiB, equal at
#: 512 KiB, shared memory 336 us and TCP 521 us at 1 MiB). ``Client.shm_write_min_bytes`` overrides it.
SHM_WRITE_MIN_BYTES = 512 << 10

#: The client's counters (``Client.counters``): bytes moved per path, reads the shared-memory check sent to TCP
#: because the object changed under the copy, write leases granted and objects committed under them.
COUNTERS = ("bytes_written_shm", "bytes_written_tcp", "bytes_read_shm", "bytes_read_tcp", "shm_read_retries",
            "write_leases", "objects_leased", "tcp_read_stripes")


class Channels:
    """The master channel and segment directory of one client, with its settings, counters and threads."""

    def __init__(self, master: str, *, timeout: float, connect_timeout: float, shared_memory: bool,
                 max_connections: int, secrets: Secrets, tls: ssl.SSLContext | None, write_leases: bool,
                 location_cache: int, busy_poll: float = 0.0) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.secrets = secrets
        self.tls = tls
        #: Node frames with fewer value bytes go over TCP even to a mapped segment (``SHM_WRITE_MIN_BYTES``).
        self.shm_write_min_bytes = SHM_WRITE_MIN_BYTES
        #: Single-copy puts go under write leases while a read lease is held (else two-phase).
        self.write_leases = write_leases
        #: Threads a large same-machine copy is spread over (``kvpool.lanes``), and connections a TCP read of large
        #: values is (``kvpool.tcp_reads``); 1: the caller's thread and one connection.
        self.copy_lanes = lanes.default_lanes()
        #: Keys whose locations reads remember (``kvpool.locations``); 0: every read asks the master.
        self.location_cache = location_cache
        self.master = MasterChannel(master, timeout=timeout, connect_timeout=connect_timeout,
                                    max_connections=max_connections, secrets=secrets, tls=tls, busy_poll=busy_poll)
        self.segments = SegmentDirectory(self.master, shared_memory=shared_memory)
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = 0

    def count(self, name: str, n: int) -> None:
        """Adds ``n`` to counter ``name`` (one of ``COUNTERS``)."""
        with self._lock:
            self.counters[name] += n

    def run_tasks(self, tasks: list[Callable[[], None]]) -> None:
        """Runs independent per-segment tasks, in parallel when there are several."""
        if len(tasks) == 1:
            tasks[0]()
            return
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kvpool-io")
                self._executor_pid = os.getpid()
            ex = self._executor
        for f in [ex.submit(t) for t in tasks]:
            f.result()

    def lookup(self, kb: list[bytes], batch: bool, runs: list[int] | None = None) -> list[p.ReplicaList]:
        """Where each key is, by the master (GET_REPLICA_LIST, a round trip per 16,384 keys); ``runs`` gets the
        master run of each answer."""
        where: list[p.ReplicaList] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            part = kb[start:start + p.MAX_KEYS_PER_FRAME]
            got, run = self.master.call_in_run(Opcode.BATCH_GET_REPLICA_LIST if batch or len(part) > 1
                                               else Opcode.GET_REPLICA_LIST, p.encode_keys(part),
                                               p.decode_replica_lists)
            if len(got) != len(part):
                raise p.ProtocolError(f"GET_REPLICA_LIST reply has {len(got)} results for {len(part)} keys")
            where += got
            if runs is not None:
                runs += [run] * len(part)
        return where

    def close(self) -> None:
        self.master.close()
        self.segments.close()
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=False)

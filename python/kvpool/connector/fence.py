"""The cache generation and the lock that orders resets against loads and saves: one process
(:class:`LocalFence`) or the processes of one machine (:class:`FileFence`, vLLM's scheduler and
worker processes)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
from typing import Iterator

__all__ = ["Fence", "LocalFence", "FileFence"]


class Fence:
    """The cache generation and the lock that orders resets against loads and saves."""

    def generation(self) -> int:
        """The current generation."""
        raise NotImplementedError

    def shared(self) -> "contextlib.AbstractContextManager[int]":
        """Held while a load or save runs; yields the generation, which cannot change meanwhile."""
        raise NotImplementedError

    def bump(self) -> "contextlib.AbstractContextManager[int]":
        """Exclusive: waits for running loads and saves, moves the generation on and yields the new
        one; no load or save starts until the block exits."""
        raise NotImplementedError


class LocalFence(Fence):
    """A fence for one process: a writer-preferring read-write lock around a counter (Java's
    ``ReentrantReadWriteLock`` plus ``generation``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gen = 1
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def generation(self) -> int:
        return self._gen

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
            gen = self._gen
        try:
            yield gen
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def bump(self) -> Iterator[int]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            self._gen += 1
            gen = self._gen
        try:
            yield gen
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class FileFence(Fence):
    """A fence shared by processes on one machine (vLLM's scheduler and worker processes): the
    generation is 8 bytes in ``path`` and the lock is ``flock`` on it (shared for loads and saves,
    exclusive for resets). Each acquisition opens its own descriptor, so threads of one process
    exclude each other as processes do. Processes on other machines are not covered."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)

    def _read(self, fd: int) -> int:
        b = os.pread(fd, 8, 0)
        return struct.unpack("<q", b)[0] if len(b) == 8 else 1

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[int]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, how)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def generation(self) -> int:
        with self._locked(fcntl.LOCK_SH) as fd:
            return self._read(fd)

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        with self._locked(fcntl.LOCK_SH) as fd:
            yield self._read(fd)

    @contextlib.contextmanager
    def bump(self) -> Iterator[int]:
        with self._locked(fcntl.LOCK_EX) as fd:
            gen = self._read(fd) + 1
            os.pwrite(fd, struct.pack("<q", gen), 0)
            os.fsync(fd)
            yield gen

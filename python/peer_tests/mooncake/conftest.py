"""Fixtures of the mooncake peer's suite: the real Mooncake (the pinned wheel's mooncake_master,
mooncake_client and Python binding mooncake.store) beside a real kvpool pool, so that a test can run one
call on both. The pool and the no-skip hooks come from ``python/peer_tests/conftest.py``.

Run with the interpreter of the mooncake peer's venv, which ``scripts/peers.sh install mooncake``
builds (``./kvpool test-peers mooncake`` does both).

``start_mooncake_cluster(**options)`` (kvpool_peers.mooncake) starts a master and one store process (``mooncake_client``, the
standalone store that contributes the memory) on free loopback ports, logs under a temp dir of its
own, waits until a store set up against the master can put and get a probe key, and stops both by
process group. Mooncake's glog output goes to those log files (``KVPOOL_PEER_KEEP_LOGS=1`` keeps them
after the run; an error while starting shows their last lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

import kvpool
import kvpool.mooncake
from kvpool_peers.mooncake import (MOONCAKE_DIST, MOONCAKE_VERSION, MooncakeCluster,  # noqa: F401
                                   mooncake_binary, start_mooncake_cluster)

REPO = Path(__file__).resolve().parents[3]

try:
    import mooncake
    import mooncake.store
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the peer suite needs the real Mooncake wheel ({e}); run it with ./kvpool test-peers, "
                      f"or with the interpreter `scripts/peers.sh python mooncake` prints") from e

MIB = 1 << 20
STORE_LOCAL_BUFFER = 256 * MIB


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def mooncake_cluster() -> Iterator[MooncakeCluster]:
    c = start_mooncake_cluster()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def _mooncake_session_store(mooncake_cluster: MooncakeCluster) -> Iterator[Any]:
    """One real store for the session: the binding's close() takes about a second (it joins its threads)."""
    s = mooncake.store.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, STORE_LOCAL_BUFFER, "tcp", "", mooncake_cluster.master)
    assert rc == 0, f"mooncake.store setup against {mooncake_cluster.master} returned {rc}"
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def mooncake_store(_mooncake_session_store: Any) -> Any:
    """The real binding's store, set up against the session's Mooncake (it contributes no memory), emptied."""
    _mooncake_session_store.remove_all(True)
    return _mooncake_session_store


@pytest.fixture
def kvpool_store(kvpool_pool: Any) -> Iterator[kvpool.mooncake.MooncakeDistributedStore]:
    """kvpool's drop-in, set up the same way against the session's kvpool pool."""
    s = kvpool.mooncake.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, STORE_LOCAL_BUFFER, "tcp", "", kvpool_pool.master)
    assert rc == 0, f"kvpool.mooncake setup against {kvpool_pool.master} returned {rc}"
    s.remove_all(True)
    try:
        yield s
    finally:
        s.close()

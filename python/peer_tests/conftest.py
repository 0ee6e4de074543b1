"""Fixtures of the peer suite: the real Mooncake (the pinned wheel's mooncake_master, mooncake_client
and Python binding mooncake.store) beside a real kvpool pool, so that a test can run one call on both.

Run with the interpreter of the mooncake peer's venv, which ``scripts/peers.sh install mooncake``
builds (``./kvpool test-peers`` does both). A peer test is never skipped: a skip, wherever it comes
from, is turned into a failure that shows its reason (a peer that cannot run is a failure).

``start_mooncake_cluster(**options)`` (kvpool_peers.mooncake) starts a master and one store process (``mooncake_client``, the
standalone store that contributes the memory) on free loopback ports, logs under a temp dir of its
own, waits until a store set up against the master can put and get a probe key, and stops both by
process group. Mooncake's glog output goes to those log files (``KVPOOL_PEER_KEEP_LOGS=1`` keeps them
after the run; an error while starting shows their last lines).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))


def _load_pools() -> ModuleType:
    """python/tests/conftest.py (kvpool's Pool), under a name of its own: both suites call theirs conftest."""
    spec = importlib.util.spec_from_file_location("kvpool_pools", REPO / "python" / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpool_pools"] = module
    spec.loader.exec_module(module)
    return module


kvpool_pools = _load_pools()
Pool = kvpool_pools.Pool

import kvpool  # noqa: E402
import kvpool.mooncake  # noqa: E402

try:
    import mooncake  # noqa: E402
    import mooncake.store  # noqa: E402
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the peer suite needs the real Mooncake wheel ({e}); run it with ./kvpool test-peers, "
                      f"or with the interpreter `scripts/peers.sh python mooncake` prints") from e

# The version the peer is pinned to (peers/mooncake/requirements.txt).
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"
MOONCAKE_VERSION = "0.3.13.post1"

MIB = 1 << 20
STORE_LOCAL_BUFFER = 256 * MIB

from kvpool_peers.mooncake import MooncakeCluster, mooncake_binary, start_mooncake_cluster  # noqa: E402,F401


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


@pytest.fixture(scope="session")
def kvpool_pool() -> Iterator[Any]:
    p = Pool()
    try:
        yield p
    finally:
        p.stop()


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


# ------------------------------------------------------------------------------ no skipped peer test

_NO_SKIP = "a peer test may not be skipped (a peer that cannot run is a failure)"


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return f"{longrepr[2]} ({longrepr[0]}:{longrepr[1]})"
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"{_NO_SKIP}: {_skip_reason(rep.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = f"{_NO_SKIP}: {_skip_reason(rep.longrepr)}"

"""What every peer's suite shares: kvpool's own pool beside the peer, and no skipped test.

The peer suite has one folder per peer, ``python/peer_tests/NAME/``, run with the interpreter of that
peer's venv (``scripts/peers.sh install NAME`` builds it from ``peers/NAME/``; ``./kvpool test-peers``
installs and runs every one, ``./kvpool test-peers NAME`` one). A folder's own ``conftest.py`` starts
the peer or builds its objects; this one gives:

* ``REPO`` and the repository's ``python/`` folder on ``sys.path`` (``kvpool``, ``kvpool_peers``);
* ``kvpool_pools``: ``python/tests/conftest.py`` loaded under a name of its own (``Pool``, ``Cluster``,
  ``free_port``), since both suites call theirs conftest;
* the session fixture ``kvpool_pool``: one real kvpool pool (master and node by PID);
* hooks that turn any skip, wherever it comes from, into a failure that shows its reason: a peer that
  cannot run is a failure, never a quiet pass.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))


def _load_pools() -> ModuleType:
    """python/tests/conftest.py (kvpool's Pool), under a name of its own: both suites call theirs conftest."""
    if "kvpool_pools" in sys.modules:
        return sys.modules["kvpool_pools"]
    spec = importlib.util.spec_from_file_location("kvpool_pools", REPO / "python" / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpool_pools"] = module
    spec.loader.exec_module(module)
    return module


# The engines' own names must not resolve to this suite's folders of the same names (python/peer_tests/vllm
# and so on, empty namespace packages) in a venv without that engine: __init__.py keeps this folder off
# sys.path. An engine that probes for another (find_spec("lmcache")) must see it absent.
assert str(Path(__file__).resolve().parent) not in [str(Path(p).resolve()) for p in sys.path if p], \
    "python/peer_tests is on sys.path: its engine-named folders would shadow missing engines"

kvpool_pools = _load_pools()
Pool = kvpool_pools.Pool


@pytest.fixture(scope="session")
def kvpool_pool() -> Iterator[Any]:
    p = Pool()
    try:
        yield p
    finally:
        p.stop()


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

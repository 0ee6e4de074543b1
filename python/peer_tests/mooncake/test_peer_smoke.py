"""The mooncake peer is there and runs: the pinned wheel, its programs, a Mooncake started by the
fixtures, and the same put/get/is_exist/remove round trip on the real store and on kvpool's drop-in."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import mooncake

from kvpool_peers.mooncake import MOONCAKE_DIST, MOONCAKE_VERSION, MooncakeCluster, mooncake_binary

REPO = Path(__file__).resolve().parents[3]

PIN = f"{MOONCAKE_DIST}=={MOONCAKE_VERSION}"


def test_the_installed_wheel_is_the_pinned_one() -> None:
    assert importlib.metadata.version(MOONCAKE_DIST) == MOONCAKE_VERSION
    pins = (REPO / "peers" / "mooncake" / "requirements.txt").read_text().split()
    assert PIN in pins, f"peers/mooncake/requirements.txt does not pin {PIN}"
    # from the peer's venv, not from some other site
    assert Path(mooncake.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())


@pytest.mark.parametrize("program", ["mooncake_master", "mooncake_client"])
def test_the_wheels_programs_run(program: str) -> None:
    out = subprocess.run([str(mooncake_binary(program)), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr[-2000:]
    assert program in out.stdout + out.stderr
    if program == "mooncake_master":
        assert MOONCAKE_VERSION in out.stdout + out.stderr


def test_the_cluster_fixture(mooncake_cluster: MooncakeCluster) -> None:
    assert mooncake_cluster.master.startswith("127.0.0.1:")
    assert mooncake_cluster.store_address.startswith("127.0.0.1:")
    assert mooncake_cluster.lease_ttl_ms == 100
    assert mooncake_cluster.log("master").exists() and mooncake_cluster.log("client").exists()
    assert all(p.poll() is None for p in mooncake_cluster.procs.values())


@pytest.mark.parametrize("which", ["mooncake_store", "kvpool_store"])
def test_round_trip(which: str, request: pytest.FixtureRequest, mooncake_cluster: MooncakeCluster) -> None:
    store: Any = request.getfixturevalue(which)
    key = f"smoke-{uuid.uuid4().hex}"
    value = bytes(range(256)) * 64
    assert store.is_exist(key) == 0
    assert store.put(key, value) == 0
    assert store.is_exist(key) == 1
    assert store.get_size(key) == len(value)
    assert store.get(key) == value
    # Mooncake refuses a remove while the lease a read took is running (100 ms here)
    time.sleep(mooncake_cluster.lease_ttl_ms / 1000 + 0.1)
    assert store.remove(key) == 0
    assert store.is_exist(key) == 0
    assert store.get(key) == b""

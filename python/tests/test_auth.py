"""The Python client against a secured pool (protocol version 8, docs/security.md): secrets proven at
connect, the admin secret for emptying the pool, clear errors for a missing, wrong or short secret,
and a client holding a secret refusing an open pool."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

import kvpool
from conftest import Pool, start_pool
from kvpool import AuthenticationError, KvPoolError, PutStatus, Secrets

CLUSTER = "cluster-secret-of-the-python-auth-test"
ADMIN = "admin-secret-of-the-python-auth-test!"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    d = tmp_path_factory.mktemp("secrets")
    data, admin = d / "cluster.secret", d / "admin.secret"
    for f, v in ((data, CLUSTER), (admin, ADMIN)):
        f.write_text(v + "\n")
        f.chmod(0o600)
    p = start_pool(segment_size="64MiB", extra=["--secret-file", str(data), "--admin-secret-file", str(admin)],
                   secrets=Secrets.of(CLUSTER, ADMIN))
    p.secret_files = (data, admin)  # type: ignore[attr-defined]
    yield p
    p.stop()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_the_cluster_secret_reads_and_writes_and_the_admin_secret_empties(secured: Pool, shm: bool) -> None:
    with kvpool.Client(secured.master, shared_memory=shm, secrets=Secrets.of(CLUSTER)) as c:
        c.shm_write_min_bytes = 0  # a small value too takes the same-machine write (SHM_WRITE_BEGIN/END) here
        v = os.urandom(50_000)
        assert c.upsert(f"a/{shm}", v) is PutStatus.OK
        assert c.get(f"a/{shm}") == v
        buf = bytearray(len(v))
        assert c.get_into(f"a/{shm}", buf) == len(v) and buf == v
        assert c.remove(f"a/{shm}")
        # the node accepted this client's authenticated connections on the path asked for
        path = "shm" if shm else "tcp"
        assert c.counters[f"bytes_written_{path}"] >= len(v) and c.counters[f"bytes_read_{path}"] >= 2 * len(v)
        with pytest.raises(KvPoolError, match="remove_all needs the admin secret"):
            c.remove_all(force=True)
        with pytest.raises(KvPoolError, match="needs the admin secret"):
            c.remove_prefix("a/")
    with kvpool.Client(secured.master, shared_memory=shm, secrets=Secrets.of(CLUSTER, ADMIN)) as c:
        assert c.put("b", b"x") in (PutStatus.OK, PutStatus.ALREADY_EXISTS)
        assert c.remove_all(force=True) >= 1
        assert c.get("b") is None


def test_no_secret_is_refused_naming_what_to_set(secured: Pool) -> None:
    with pytest.raises(KvPoolError, match="needs the cluster secret.*KVPOOL_SECRET_FILE"):
        kvpool.Client(secured.master, timeout=5, connect_timeout=1, secrets=Secrets())


def test_a_wrong_secret_is_refused_without_showing_either(secured: Pool) -> None:
    with pytest.raises(AuthenticationError) as e:
        kvpool.Client(secured.master, timeout=5, connect_timeout=1, secrets=Secrets.of("a-wrong-cluster-secret-here"))
    msg = str(e.value)
    assert secured.master in msg and "did not prove it knows the cluster secret" in msg
    assert "a-wrong-cluster" not in msg and CLUSTER not in msg
    with pytest.raises(AuthenticationError, match="refused this connection.*admin secret does not match"):
        kvpool.Client(secured.master, timeout=5, connect_timeout=1, secrets=Secrets.of(CLUSTER, "not-the-admin-secret-x"))


def test_secrets_from_the_environment(secured: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    data, admin = secured.secret_files  # type: ignore[attr-defined]
    monkeypatch.setenv("KVPOOL_SECRET_FILE", str(data))
    monkeypatch.setenv("KVPOOL_ADMIN_SECRET_FILE", str(admin))
    with kvpool.Client(secured.master) as c:
        assert c.secrets == Secrets.of(CLUSTER, ADMIN)
        assert c.put("env", b"v") in (PutStatus.OK, PutStatus.ALREADY_EXISTS)
        assert c.remove_all() >= 1  # the admin secret from its file empties the pool: "env" at least
        assert not c.exists("env")
    monkeypatch.setenv("KVPOOL_SECRET", CLUSTER)
    with pytest.raises(ValueError, match="both KVPOOL_SECRET_FILE and KVPOOL_SECRET"):
        Secrets.from_environment()


def test_short_or_lonely_secrets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has 5 characters; it needs at least 16") as e:
        Secrets.of("short")
    assert "short" not in str(e.value).replace("has 5", "")
    with pytest.raises(ValueError, match="needs the cluster secret"):
        Secrets.of(None, ADMIN)
    with pytest.raises(ValueError, match="cannot read the cluster secret file"):
        Secrets.from_files(tmp_path / "missing")
    assert CLUSTER not in repr(Secrets.of(CLUSTER, ADMIN))
    # a blank *_FILE counts as unset, as in Java's Secrets
    assert Secrets.from_environment({"KVPOOL_SECRET_FILE": " ", "KVPOOL_SECRET": CLUSTER}) == Secrets.of(CLUSTER)


def test_a_short_secret_in_the_environment_stops_the_client_before_it_connects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_SECRET_FILE", raising=False)
    monkeypatch.delenv("KVPOOL_ADMIN_SECRET_FILE", raising=False)
    monkeypatch.delenv("KVPOOL_ADMIN_SECRET", raising=False)
    monkeypatch.setenv("KVPOOL_SECRET", "too-short")
    with pytest.raises(ValueError, match="the cluster secret has 9 characters; it needs at least 16") as e:
        kvpool.Client("127.0.0.1:1", timeout=1, connect_timeout=0.1)
    assert "too-short" not in str(e.value)


def test_a_client_with_a_secret_refuses_an_open_pool(pool: Pool) -> None:
    with pytest.raises(AuthenticationError, match="holds no cluster secret"):
        kvpool.Client(pool.master, timeout=5, connect_timeout=1, secrets=Secrets.of(CLUSTER))

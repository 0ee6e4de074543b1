"""The Python client against a pool in mutual TLS (docs/security.md, "TLS"): the Java master and node
started from the jar with --tls-cert/--tls-key/--tls-ca and the secrets, certificates made by
scripts/tls-certs.sh. A client with the pool's certificate is served byte-exact over TCP (and on the
same-machine path, which needs no TLS); clients without a certificate, with one of another CA, or in
plain TCP are refused with errors saying why; bad files fail when the context is built, naming them."""

from __future__ import annotations

import os
import ssl
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import kvpool
from conftest import REPO, Pool, start_pool
from kvpool import KvPoolError, PutStatus, Secrets
from kvpool.tls import client_context, from_environment

CLUSTER = "cluster-secret-of-the-python-tls-test"
ADMIN = "admin-secret-of-the-python-tls-test!!"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls") / "certs"
    subprocess.run([str(REPO / "scripts" / "tls-certs.sh"), str(d)], check=True, capture_output=True, timeout=120)
    return d


def context(certs: Path, who: str = "client", ca: str = "ca") -> ssl.SSLContext:
    return client_context(certs / f"{who}.pem", certs / f"{who}.key", certs / f"{ca}.pem")


@pytest.fixture(scope="module")
def tls_pool(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    d = tmp_path_factory.mktemp("secrets")
    data, admin = d / "cluster.secret", d / "admin.secret"
    data.write_text(CLUSTER)
    admin.write_text(ADMIN)
    p = start_pool(segment_size="64MiB", secrets=Secrets.of(CLUSTER, ADMIN), tls=context(certs),
                   extra=["--secret-file", str(data), "--admin-secret-file", str(admin),
                          "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                          "--tls-ca", str(certs / "ca.pem")])
    yield p
    p.stop()


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_a_client_with_the_pools_certificate_is_served_byte_exact(tls_pool: Pool, certs: Path, shm: bool) -> None:
    with kvpool.Client(tls_pool.master, shared_memory=shm, secrets=Secrets.of(CLUSTER), tls=context(certs)) as c:
        for size in (1, 5000, 100_000, 3 << 20):
            v = os.urandom(size)
            key = f"tls/{shm}/{size}"
            assert c.upsert(key, v) is PutStatus.OK
            assert c.get(key) == v
            buf = bytearray(size)
            assert c.get_into(key, buf) == size and buf == v
        path = "shm" if shm else "tcp"
        assert c.counters[f"bytes_written_{path}"] >= 3 << 20 and c.counters[f"bytes_read_{path}"] >= 6 << 20


def test_a_plain_tcp_client_is_told_the_pool_requires_tls(tls_pool: Pool) -> None:
    with pytest.raises(KvPoolError, match="requires TLS and this connection is plain TCP.*KVPOOL_TLS_CERT"):
        kvpool.Client(tls_pool.master, timeout=5, connect_timeout=2, secrets=Secrets.of(CLUSTER))


def test_a_client_without_a_certificate_is_refused(tls_pool: Pool, certs: Path) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(certs / "ca.pem"))
    with pytest.raises(KvPoolError, match="(?i)certificate.required"):
        kvpool.Client(tls_pool.master, timeout=5, connect_timeout=2, secrets=Secrets.of(CLUSTER), tls=ctx)


def test_a_certificate_of_another_ca_is_refused(tls_pool: Pool, certs: Path) -> None:
    with pytest.raises(KvPoolError, match=f"TLS with {tls_pool.master} failed"):
        kvpool.Client(tls_pool.master, timeout=5, connect_timeout=2, secrets=Secrets.of(CLUSTER),
                      tls=context(certs, "other-client"))
    # and a client that trusts another CA refuses the pool's servers
    with pytest.raises(KvPoolError, match="CERTIFICATE_VERIFY_FAILED"):
        kvpool.Client(tls_pool.master, timeout=5, connect_timeout=2, secrets=Secrets.of(CLUSTER),
                      tls=context(certs, "client", "other-ca"))


def test_the_pool_keeps_serving_and_tls_comes_from_the_environment(tls_pool: Pool, certs: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOL_TLS_CERT", str(certs / "client.pem"))
    monkeypatch.setenv("KVPOOL_TLS_KEY", str(certs / "client.key"))
    monkeypatch.setenv("KVPOOL_TLS_CA", str(certs / "ca.pem"))
    with kvpool.Client(tls_pool.master, shared_memory=False, secrets=Secrets.of(CLUSTER)) as c:
        assert c.tls is not None
        assert c.put("tls/env", b"from the environment") in (PutStatus.OK, PutStatus.ALREADY_EXISTS)
        assert c.get("tls/env") == b"from the environment"


def test_a_tls_client_of_a_plain_pool_is_told_so(pool: Pool, certs: Path) -> None:
    with pytest.raises(KvPoolError, match="plain TCP"):
        kvpool.Client(pool.master, timeout=5, connect_timeout=2, tls=context(certs))


def test_bad_files_fail_naming_them(certs: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"cannot read the TLS certificate chain file {tmp_path / 'nope.pem'}"):
        client_context(tmp_path / "nope.pem", certs / "client.key", certs / "ca.pem")
    with pytest.raises(ValueError, match=f"private key in {certs / 'server.key'} does not match"):
        client_context(certs / "client.pem", certs / "server.key", certs / "ca.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=f"CA bundle file {junk}"):
        client_context(certs / "client.pem", certs / "client.key", junk)
    with pytest.raises(ValueError, match="KVPOOL_TLS_KEY and KVPOOL_TLS_CA are missing"):
        from_environment({"KVPOOL_TLS_CERT": str(certs / "client.pem")})
    assert from_environment({}) is None

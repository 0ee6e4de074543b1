"""Tenants from the Python client against the Java master: a namespace at its memory quota gets
``PutStatus.QUOTA_EXCEEDED`` (result code 10, version 14) on every put path (write leases, two-phase over TCP, puts
in parts), and nobody else's objects are touched; the master's ``/api/tenants`` counts the refusals and takes a new
list at run time."""

from __future__ import annotations

import json
import urllib.request

import pytest

import kvpool
from conftest import Pool, free_port
from kvpool import PutStatus

VALUE = 64 << 10  # three fit the tenant's 200 KiB (a region is the value, its header and the key), a fourth not


@pytest.fixture(scope="module")
def pool():
    http = free_port()
    with Pool(segment_size="64MiB", http_port=http, extra=["--tenant", "t=quota/:200KiB"]) as p:
        p.http = http  # type: ignore[attr-defined]
        yield p


def _tenants(port: int, body: bytes | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/tenants", data=body, method="PUT" if body else "GET")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("path", ["write_leases", "two_phase", "parts"])
def test_a_tenant_at_its_quota_is_refused_on_every_put_path(pool, path: str) -> None:
    with kvpool.Client(pool.master, shared_memory=path == "write_leases", write_leases=path == "write_leases") as c:
        prefix = f"quota/{path}/"
        _tenants(pool.http, json.dumps({"tenants": [{"name": "t", "prefixes": [prefix], "memory": "200KiB"}]}).encode())
        value = bytes(VALUE)
        if path == "parts":
            statuses = []
            for i in range(4):
                p = c.begin_put([f"{prefix}{i}"], [VALUE])
                refused = p.status(0)
                if refused is None:
                    p.write(0, 0, value)
                    statuses.append(p.finish()[0])
                else:
                    statuses.append(refused)
        else:
            statuses = [c.put(f"{prefix}{i}", value) for i in range(4)]
        assert statuses == [PutStatus.OK] * 3 + [PutStatus.QUOTA_EXCEEDED]
        assert not c.exists(f"{prefix}3")
        assert c.put("elsewhere/" + path, value) == PutStatus.OK, "a key of no tenant"
        t = _tenants(pool.http)["tenants"][0]
        assert t["name"] == "t" and t["refused_puts"] >= 1
        assert 3 * VALUE <= t["memory_bytes"] <= 200 << 10

"""TIER_LOOKUP from the Python client against the Java master, cross-checked with the master's HTTP answer for
the same keys: a prompt's block keys, the oldest spilled to the SSD tier, the newest in memory; an absent key ends
the prefix; a secured master wants its cluster secret for the HTTP lookup."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import kvpool
from conftest import free_port, start_pool, tiers_settled, wait_until
from kvpool.tiers import TierCounts


def http_tiers(port: int, keys: list[str], block_size: int, token: str | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/tiers?block_size={block_size}",
                                 data="\n".join(keys).encode(), method="POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_the_client_and_the_masters_http_answer_count_each_tier_alike() -> None:
    disk = Path(tempfile.mkdtemp(prefix="kvpool-pytest-tiers-"))
    port = free_port()
    try:
        with start_pool(segment_size="8MiB", http_port=port,
                        extra=["--disk-dir", str(disk), "--disk-size", "128MiB"]) as p, kvpool.Client(p.master) as c:
            keys = [f"tiers/{i}" for i in range(64)]
            for k in keys:  # 16 MiB into 8 MiB of memory: the oldest spill
                assert c.put(k, bytes([len(k)]) * (256 << 10)) is kvpool.PutStatus.OK
            wait_until(lambda: tiers_settled(c, len(keys)), "every object listed again (memory or disk), under the watermark")
            t = c.tier_lookup(keys)
            assert (t.keys, t.prefix_blocks) == (64, 64)
            assert t.storage_blocks > 0 and t.memory_blocks > 0 and t.memory_blocks + t.storage_blocks == 64
            assert http_tiers(port, keys, 32) == t.to_json(32)
            assert t.tokens(16) == {"prefix": 1024, "CPU": 16 * t.memory_blocks, "STORAGE": 16 * t.storage_blocks}

            gap = keys[:10] + ["tiers/absent"] + keys[10:]
            assert c.tier_lookup(gap) == TierCounts(65, 10, c.tier_lookup(keys[:10]).memory_blocks,
                                                    c.tier_lookup(keys[:10]).storage_blocks)
            assert http_tiers(port, gap, 16)["prefix_blocks"] == 10
            assert c.tier_lookup([]) == TierCounts(0, 0, 0, 0)
            with pytest.raises(ValueError, match="512"):
                c.tier_lookup(["x" * 600])
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def test_a_secured_master_wants_its_cluster_secret_for_the_http_lookup(tmp_path: Path) -> None:
    cluster, admin = "cluster-secret-of-the-tiers-test", "admin-secret-of-the-tiers-test!!"
    files = []
    for name, v in (("cluster", cluster), ("admin", admin)):
        f = tmp_path / f"{name}.secret"
        f.write_text(v + "\n")
        f.chmod(0o600)
        files.append(f)
    port = free_port()
    with start_pool(segment_size="64MiB", http_port=port, secrets=kvpool.Secrets.of(cluster, admin),
                    extra=["--secret-file", str(files[0]), "--admin-secret-file", str(files[1])]) as p, \
            kvpool.Client(p.master, secrets=kvpool.Secrets.of(cluster)) as c:
        assert c.put("tiers/s", b"v") is kvpool.PutStatus.OK
        for token in (None, "not-the-secret-of-this-master", admin):
            with pytest.raises(urllib.error.HTTPError) as e:
                http_tiers(port, ["tiers/s"], 16, token)
            assert e.value.code == 401 and b"Bearer <cluster secret>" in e.value.read()
        assert http_tiers(port, ["tiers/s"], 16, cluster)["memory_blocks"] == 1
        assert c.tier_lookup(["tiers/s", "tiers/t"]) == TierCounts(2, 1, 1, 0)

"""The Python client against a real pool: semantics, buffers, both data paths, errors, threads, fork."""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import threading

import numpy as np
import pytest
import torch

import kvpool
from conftest import Pool, in_forked_child, start_pool
from kvpool import MISS, PutStatus, RawBuffer



def test_put_get_semantics(either: kvpool.Client) -> None:
    c = either
    assert c.put("k", b"hello") is PutStatus.OK
    assert c.put("k", b"other") is PutStatus.ALREADY_EXISTS
    assert c.get("k") == b"hello"
    assert c.get("missing") is None
    assert c.upsert("k", b"replaced!") is PutStatus.OK
    assert c.get("k") == b"replaced!"
    assert c.size("k") == 9 and c.size("missing") is None
    assert c.put("empty", b"") is PutStatus.OK and c.get("empty") == b""
    assert c.exists("k") and not c.exists("missing")
    assert c.remove("k") and not c.remove("k")
    assert c.get("k") is None


def test_paths_are_the_ones_asked_for(either: kvpool.Client) -> None:
    c = either
    v = os.urandom(1 << 20)
    assert c.put("big", v) is PutStatus.OK
    assert c.get("big") == v
    shm = c.counters["bytes_written_shm"] + c.counters["bytes_read_shm"]
    tcp = c.counters["bytes_written_tcp"] + c.counters["bytes_read_tcp"]
    if c._ch.segments.shm.enabled:
        assert (shm, tcp) == (2 << 20, 0)
    else:
        assert (shm, tcp) == (0, 2 << 20)


def test_small_two_phase_writes_go_over_tcp_even_to_a_mapped_segment(either: kvpool.Client) -> None:
    """Below SHM_WRITE_MIN_BYTES a two-phase frame goes as NODE_WRITE (one exchange with the node) rather than
    SHM_WRITE_BEGIN and END (two); reads still take the mapping. The threshold is per client. (Puts under
    write leases take the mapping at any size: test_write_leases.py.)"""
    c = either
    c.write_leases = False
    small = os.urandom(4096)
    assert c.put("small", small) is PutStatus.OK and c.get("small") == small
    assert (c.counters["bytes_written_shm"], c.counters["bytes_written_tcp"]) == (0, 4096)
    assert c.counters["bytes_read_shm" if c._ch.segments.shm.enabled else "bytes_read_tcp"] == 4096
    c.shm_write_min_bytes = 0
    assert c.put("small2", small) is PutStatus.OK and c.get("small2") == small
    assert c.counters["bytes_written_shm" if c._ch.segments.shm.enabled else "bytes_written_tcp"] == 4096 * (1 if c._ch.segments.shm.enabled else 2)


def test_batches(either: kvpool.Client) -> None:
    c = either
    keys = [f"b/{i}" for i in range(300)]
    vals = [os.urandom(i * 37) for i in range(300)]
    assert c.put_batch(keys, vals) == [PutStatus.OK] * 300
    assert c.put_batch(keys[:2] + ["b/new"], [b"x", b"y", b"z"]) == \
        [PutStatus.ALREADY_EXISTS, PutStatus.ALREADY_EXISTS, PutStatus.OK]
    got = c.get_batch(keys + ["nope"])
    assert got[:-1] == vals and got[-1] is None
    bufs = [bytearray(len(v) + 5) for v in vals]
    assert c.get_into_batch(keys, bufs) == [len(v) for v in vals]
    assert all(bytes(b[:len(v)]) == v for b, v in zip(bufs, vals))
    assert c.batch_exists(["b/0", "zz", "b/299"]) == [True, False, True]
    assert c.batch_size(["b/3", "zz"]) == [111, -1]
    assert c.prefix_match(keys) == 300
    assert c.prefix_match(keys[:5] + ["zz"] + keys[5:]) == 5
    assert c.upsert_batch(keys[:3], [b"1", b"2", b"3"]) == [PutStatus.OK] * 3
    assert c.get_batch(keys[:3]) == [b"1", b"2", b"3"]
    assert c.remove_batch(["b/0", "zz"]) == [True, False]
    assert c.remove_prefix("b/1") == 111  # b/1, b/10..b/19, b/100..b/199
    assert c.status().keys == 300 + 1 - 1 - 111
    assert c.remove_all() == 189
    assert c.get_batch([]) == [] and c.put_batch([], []) == []


def test_key_lists_longer_than_one_frame(client: kvpool.Client) -> None:
    keys = [f"many/{i:06d}" for i in range(20_000)]
    assert client.put_batch(keys, [b"v"] * len(keys)) == [PutStatus.OK] * len(keys)
    assert client.prefix_match(keys) == 20_000
    assert sum(client.batch_exists(keys)) == 20_000
    assert client.get_batch(keys)[-1] == b"v"
    assert client.remove_prefix("many/") == 20_000


def test_buffers_of_every_kind(either: kvpool.Client) -> None:
    c = either
    arr = np.arange(4096, dtype=np.float32).reshape(64, 64)
    assert c.put_from("np", arr) is PutStatus.OK
    out = np.zeros_like(arr)
    assert c.get_into("np", out) == arr.nbytes
    assert np.array_equal(out, arr)
    t = torch.arange(1000, dtype=torch.float16)
    assert c.put("torch", t) is PutStatus.OK
    tout = torch.zeros(1000, dtype=torch.float16)
    assert c.get_into("torch", tout) == 2000 and torch.equal(t, tout)
    raw = (ctypes.c_char * 256)()
    ctypes.memmove(raw, b"R" * 256, 256)
    assert c.put_from("raw", RawBuffer(ctypes.addressof(raw), 256)) is PutStatus.OK
    dst = (ctypes.c_char * 300)()
    assert c.get_into("raw", RawBuffer(ctypes.addressof(dst), 300)) == 256
    assert dst.raw[:256] == b"R" * 256
    m = mmap.mmap(-1, 8192)
    m[:5] = b"mmap!"
    assert c.put("mm", m) is PutStatus.OK
    assert c.get("mm")[:5] == b"mmap!"
    view = memoryview(bytearray(10))
    assert c.get_into("mm", bytearray(8192)) == 8192
    with pytest.raises(ValueError, match="buffer for key 'mm' has 10 bytes; the value has 8192"):
        c.get_into("mm", view)
    with pytest.raises(ValueError, match="read-only"):
        c.get_into("mm", b"x" * 9000)
    with pytest.raises(ValueError, match="not contiguous"):
        c.put("nc", np.zeros((8, 8))[:, ::2])
    with pytest.raises(TypeError, match="exposes no memory"):
        c.put("obj", object())  # type: ignore[arg-type]


def test_bad_arguments_name_what_was_wrong(client: kvpool.Client) -> None:
    with pytest.raises(ValueError, match="1..512"):
        client.put("", b"x")
    with pytest.raises(ValueError, match="513 UTF-8 bytes"):
        client.get("k" * 513)
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        client.put_batch(["a", "b"], [b"x"])
    with pytest.raises(ValueError, match="empty prefix"):
        client.remove_prefix("")
    with pytest.raises(ValueError, match="master accepts at most"):
        client.put("huge", RawBuffer(1 << 20, client.max_value_bytes + 1))
    with pytest.raises(ValueError, match="raw buffer address"):
        RawBuffer(0, 10)
    with pytest.raises(ValueError, match="host:port"):
        kvpool.Client("nohost")
    # nothing was stored by any of it
    assert client.status().keys == 0


def test_unreachable_master_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(kvpool.MasterUnreachable, match=f"master at 127.0.0.1:{port}"):
        kvpool.Client(f"127.0.0.1:{port}", connect_timeout=1)


def test_a_server_of_another_version_is_refused() -> None:
    """A fake 'master' answering in protocol version 2: the client says which versions disagree."""
    from kvpool import protocol as p
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            hdr = conn.recv(32)
            body_len = int.from_bytes(hdr[16:20], "little")
            while body_len:
                body_len -= len(conn.recv(body_len))
            conn.sendall(p.encode_header(hdr[3], int.from_bytes(hdr[8:16], "little"), 0, flags=1, version=2))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(kvpool.ProtocolError, match=f"version 2; this client speaks version {kvpool.PROTOCOL_VERSION}"):
        kvpool.Client(f"127.0.0.1:{srv.getsockname()[1]}")
    t.join(10)
    srv.close()


def test_config_from_environment(pool: Pool, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "client.json"
    cfg.write_text('{"master": "%s", "offload": {"type": "pool"}}' % pool.master)
    monkeypatch.delenv("KVPOOL_MASTER", raising=False)
    monkeypatch.setenv("KVPOOL_CONFIG_PATH", str(cfg))
    with kvpool.Client() as c:
        assert c.master == pool.master
    cfg.write_text("type: pool\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        kvpool.Client()
    monkeypatch.delenv("KVPOOL_CONFIG_PATH")
    with pytest.raises(ValueError, match="no master given"):
        kvpool.Client()


def test_remove_all_force_fences_and_moves_the_epoch(client: kvpool.Client) -> None:
    e0 = client.ping()
    client.put("x", b"1")
    assert client.remove_all(force=True) == 1
    assert client.ping() == e0 + 1
    assert client.get("x") is None


def test_threads_share_one_client(client: kvpool.Client) -> None:
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(50):
                v = f"{t}-{i}".encode() * 100
                assert client.put(f"t/{t}/{i}", v) is PutStatus.OK
                assert client.get(f"t/{t}/{i}") == v
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert client.status().keys == 400


def test_fork_child_uses_its_own_connections(client: kvpool.Client) -> None:
    assert client.put("before-fork", b"parent") is PutStatus.OK
    # the child: the inherited client must work, on sockets of its own
    assert in_forked_child(lambda: client.get("before-fork") == b"parent"
                           and client.put("from-child", b"child") is PutStatus.OK)
    # the parent's connections were not disturbed by the child's traffic
    assert client.get("from-child") == b"child"
    assert client.get("before-fork") == b"parent"


def test_cross_language(pool: Pool, either: kvpool.Client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Java puts, Python reads byte-identical, and the reverse; Java and Python both on TCP and shm."""
    c = either
    java_tcp = [] if c._ch.segments.shm.enabled else ["--no-shm"]
    data = os.urandom(3 << 20)
    f = tmp_path / "v.bin"
    f.write_bytes(data)
    pool.kvpool_cli("put", "--master", pool.master, *java_tcp, "--file", str(f), "java/put")
    assert c.get("java/put") == data
    buf = np.zeros(len(data), dtype=np.uint8)
    assert c.get_into("java/put", buf) == len(data) and buf.tobytes() == data
    data2 = os.urandom((2 << 20) + 13)
    assert c.put("py/put", data2) is PutStatus.OK
    out = tmp_path / "out.bin"
    pool.kvpool_cli("get", "--master", pool.master, *java_tcp, "--out", str(out), "py/put")
    assert out.read_bytes() == data2
    # a key in another script and a value with every byte value
    every = bytes(range(256)) * 1000
    assert c.put("ключ/é/日本", every) is PutStatus.OK
    pool.kvpool_cli("get", "--master", pool.master, "--out", str(out), "ключ/é/日本")
    assert out.read_bytes() == every


def test_reads_fall_back_when_the_object_changes(client: kvpool.Client) -> None:
    """An upsert between lookup and copy: the shm check sees the old generation gone; never old bytes."""
    assert client.put("u", b"A" * 100_000) is PutStatus.OK
    where = client._ch.lookup([b"u"], False)[0]
    assert client.upsert("u", b"B" * 100_000) is PutStatus.OK
    seg = client._ch.segments.segment(where.replicas[0].segment_id)
    m = client._ch.segments.shm.mapping(seg)
    assert m is not None
    dst = memoryview(bytearray(100_000))
    assert not m.read(where.replicas[0].offset, where.generation, 100_000, dst)
    assert client.get("u") == b"B" * 100_000


def test_pool_full_and_no_segment_are_values() -> None:
    with start_pool(segment_size="8MiB") as small, kvpool.Client(small.master) as c:
        statuses = [c.put(f"f/{i}", bytes(3 << 20)) for i in range(4)]
        # with eviction on, old objects make room; an object larger than the whole segment cannot fit
        assert c.put("too-big", bytes(9 << 20)) is PutStatus.POOL_FULL
        assert PutStatus.OK in statuses


def test_master_gone_mid_session() -> None:
    p = start_pool(segment_size="64MiB")
    c = kvpool.Client(p.master, timeout=3, connect_timeout=1)
    try:
        assert c.put("a", b"1") is PutStatus.OK
        p.stop()
        with pytest.raises(kvpool.MasterUnreachable, match=p.master):
            c.get("a")
        with pytest.raises(kvpool.MasterUnreachable, match=p.master):
            c.put("b", b"2")
    finally:
        c.close()
        p.stop()


def test_a_request_after_a_quiet_spell_pings_first(client: kvpool.Client) -> None:
    client._ch.master.heard = -1e9  # as if the last HELLO or PING were long ago
    client.exists("x")
    assert client._ch.master.heard > 0  # a PING went first, so the master counts this client as active
    heard = client._ch.master.heard
    client.exists("x")
    assert client._ch.master.heard == heard  # not before every request


def test_a_buffer_too_small_fails_only_its_own_key_of_a_batch(client: kvpool.Client) -> None:
    assert client.put_batch(["ts/a", "ts/b", "ts/c"], [b"a" * 100, b"b" * 5000, b"c" * 100]) == [PutStatus.OK] * 3
    bufs = [bytearray(100), bytearray(4096), bytearray(100), bytearray(10)]
    got = client.get_into_batch(["ts/a", "ts/b", "ts/c", "ts/missing"], bufs)
    assert got == [100, kvpool.TOO_SMALL, 100, kvpool.MISS]
    assert bufs[0] == b"a" * 100 and bufs[2] == b"c" * 100
    assert bufs[1] == bytearray(4096)  # left alone
    with pytest.raises(ValueError, match="buffer for key 'ts/b' has 4096 bytes; the value has 5000"):
        client.get_into("ts/b", bufs[1])

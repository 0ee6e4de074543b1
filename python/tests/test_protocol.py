"""Cross-language checks of the wire protocol: Python's encoders and decoders against the bytes the
Java code writes (io.kvpool.protocol.WireVectors, run from the jar) and against docs/protocol.md.

A change to a body layout, an opcode, a result code or a status on either side that the other does
not follow fails here.
"""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest

from conftest import JAR, REPO, find_java
from kvpool import protocol as p
from kvpool.block_info import BlockInfo, encode_block_infos
from kvpool.codec import signed64 as _signed64


@pytest.fixture(scope="module")
def java_vectors() -> dict[str, str]:
    out = subprocess.run([str(find_java()), "-cp", str(JAR), "io.kvpool.protocol.WireVectors"],
                         capture_output=True, text=True, check=True, timeout=60)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def vec(java_vectors: dict[str, str], name: str) -> bytes:
    return bytes.fromhex(java_vectors[name])


K1 = "model@0@abc".encode()
K2 = "ключ-é".encode()
ID = (0x1122334455667788, -0x123456789ABCDEF)
MAC1 = bytes(0xA0 + i for i in range(16))
MAC2 = bytes(0x10 + i for i in range(16))


def test_tables_match_java(java_vectors: dict[str, str]) -> None:
    assert int(java_vectors["version"]) == p.VERSION
    java_results = {k[7:]: int(v) for k, v in java_vectors.items() if k.startswith("result.")}
    assert java_results == {c.name: c.value for c in p.ResultCode}
    java_status = {k[7:]: int(v) for k, v in java_vectors.items() if k.startswith("status.")}
    assert java_status == {s.name: s.value for s in p.FrameStatus}
    java_ops = {k[7:]: int(v) for k, v in java_vectors.items() if k.startswith("opcode.")}
    for op in p.Opcode:  # Python speaks a subset (no node-to-master opcodes)
        assert java_ops[op.name] == op.value, op


def test_header(java_vectors: dict[str, str]) -> None:
    ours = p.encode_header(0x81, 0x0102030405060708, 0x11223344, 0x0055667788990011, flags=p.FLAG_REPLY, status=5)
    assert ours == vec(java_vectors, "header_node_read_reply")
    h = p.decode_header(ours)
    assert (h.opcode, h.status, h.request_id, h.body_length, h.payload_length) == \
        (0x81, 5, 0x0102030405060708, 0x11223344, 0x0055667788990011)


def test_header_example_in_the_document() -> None:
    doc = (REPO / "docs" / "protocol.md").read_text()
    m = re.search(r"as `FrameHeader.write` produces them:\s*```text\s*([0-9a-f ]+?)\s*```", doc)
    assert m, "the header example is gone from docs/protocol.md section 2.1"
    documented = bytes.fromhex(m.group(1).replace(" ", ""))
    assert documented == p.encode_header(0x81, 0x0102030405060708, 0x11223344, 0x0055667788990011,
                                         flags=p.FLAG_REPLY, status=5)
    assert f"# kvpool wire protocol, version {p.VERSION}" in doc


def test_every_statement_of_the_protocol_version_agrees() -> None:
    """docs/protocol.md (title, header table, header diagram, section 10), kvpool.protocol (its docstring and
    VERSION) and the Java FrameHeader.VERSION name one version: each place is found, so a stale one fails."""
    doc = (REPO / "docs" / "protocol.md").read_text()
    module = (REPO / "python" / "kvpool" / "protocol" / "__init__.py").read_text()
    java = (REPO / "kvpool-protocol" / "src" / "main" / "java" / "io" / "kvpool" / "protocol" / "FrameHeader.java").read_text()
    places = {
        "protocol.md title": r"\A# kvpool wire protocol, version (\d+)\n",
        "protocol.md header table": r"\| 2 \| 1 \| version \| Protocol version, `(\d+)`",
        "protocol.md header diagram": r"version \(u8\)[^\n]*\n[^\n]*= 0x([0-9A-Fa-f]{2})",
        "protocol.md section 10": r"This document describes version \*\*(\d+)\*\*",
        "protocol.md section 10 error text": r"\(this side speaks version (\d+)\)",
    }
    found = {}
    for name, pattern in places.items():
        m = re.search(pattern, doc)
        assert m, f"{name}: not found"
        found[name] = int(m.group(1), 16 if "diagram" in name else 10)
    m = re.search(r'\A"""kvpool\'s wire protocol, version (\d+),', module)
    assert m, "kvpool.protocol docstring: not found"
    found["kvpool.protocol docstring"] = int(m.group(1))
    m = re.search(r"\| version u8 = (\d+) \|", module)
    assert m, "kvpool.protocol header drawing: not found"
    found["kvpool.protocol header drawing"] = int(m.group(1))
    m = re.search(r"public static final byte VERSION = (\d+);", java)
    assert m, "FrameHeader.VERSION: not found"
    found["FrameHeader.VERSION"] = int(m.group(1))
    found["protocol.VERSION"] = p.VERSION
    assert set(found.values()) == {p.VERSION}, found


def test_request_bodies_equal_java(java_vectors: dict[str, str]) -> None:
    assert p.encode_hello(ID, "host-1", 4242) == vec(java_vectors, "hello")
    assert p.encode_ping(ID) == vec(java_vectors, "ping")
    # version 14: block infos for the KV events
    assert encode_block_infos([
        BlockInfo(K1.decode(), [1, 2, 70000], 16, parent_block_hash=(1 << 64) - 2, lora_id=3, lora_name="adapter-é",
                  cache_salt="salt"),
        BlockInfo(K2.decode(), [], 16)]) == vec(java_vectors, "block_info")
    assert p.encode_put_start(True, 2, "127.0.0.1:50052", [(K1, 1 << 20), (K2, 0)], 3600) == \
        vec(java_vectors, "put_start")
    assert p.encode_put_start(False, 0, "", [(K1, 7)], p.PIN_FOREVER) == vec(java_vectors, "put_start_pin_forever")
    assert p.encode_put_end([(K1, 1234, 2), (K2, -5, -1)]) == vec(java_vectors, "put_end")
    assert p.encode_keys([K1, K2]) == vec(java_vectors, "keys")
    assert p.BodyWriter().bstr(K1).bytes() == vec(java_vectors, "prefix")
    assert p.BodyWriter().boolean(True).bytes() == vec(java_vectors, "remove_all")
    assert p.encode_node_write(3, 0x0A0B0C0D, [
        p.WriteItem(4096, 1234, K1, 1 << 20, 0xE3069283, p.WriteGrant(4096, 1 << 21, 1234, 1, MAC2)),
        p.WriteItem(0, 1, K2, 0, 0, p.NO_GRANT)]) == vec(java_vectors, "node_write")
    # version 17: a put over TCP whose node commits it for the writer
    assert p.encode_node_write_commit(0x0102030405, True, 3, 7, 0x0A0B0C0D, [
        p.WriteItem(4096, 5000, K1, 1 << 20, 0xE3069283, p.WriteGrant(4096, 64 << 20, 5000, 16, MAC1))]) == \
        vec(java_vectors, "node_write_commit")
    R = p.ResultCode
    assert p.decode_node_write_commit_reply(vec(java_vectors, "node_write_commit_reply")) == \
        (True, [R.OK, R.OK, R.FENCED], [R.OK, R.EXPIRED, R.FAILED])
    assert p.decode_node_write_commit_reply(vec(java_vectors, "node_write_commit_reply_not_asked")) == \
        (False, [R.OK, R.DEPOSED], [R.FAILED, R.FAILED])
    assert p.encode_node_read([(4096, 1234, 1 << 20, 0), (0, 7, 9, 1)]) == vec(java_vectors, "node_read")
    assert p.encode_shm_write_end([(4096, 1234, True), (64, 5, False)]) == vec(java_vectors, "shm_write_end")
    # version 11: ranged reads and writes in parts
    assert p.encode_node_read_range([(4096, 1234, 1 << 21, p.TIER_MEMORY, 1 << 16, 1 << 16),
                                     (0, 7, 9, p.TIER_DISK, 9, 0)]) == vec(java_vectors, "node_read_range")
    assert p.encode_part_write([(4096, 1234, 31 << 16, 1 << 16), (64, 5, 0, 3)]) == vec(java_vectors, "part_write")
    assert p.encode_part_end([(4096, 1234, 0xE3069283, True), (64, 5, 7, False)]) == vec(java_vectors, "part_end")
    assert p.encode_write_lease("127.0.0.1:50052", 1 << 20, 64 << 20, 16) == vec(java_vectors, "write_lease")
    assert p.encode_commit(0x0102030405, True, [(K1, 4096, 1 << 20, 5000), (K2, 4096 + (2 << 20), 0, 5001)]) \
        == vec(java_vectors, "commit")
    assert p.encode_release(0x0102030405) == vec(java_vectors, "release")
    assert p.encode_shm_lease(7, 0x0A0B0C0D, 4096, 64 << 20, p.WriteGrant(4096, 64 << 20, 5000, 16, MAC1)) == \
        vec(java_vectors, "shm_lease")
    assert p.decode_shm_lease_reply(vec(java_vectors, "shm_lease_reply")) == (p.ResultCode.OK, True)
    assert p.decode_shm_lease_reply(vec(java_vectors, "shm_lease_reply_record")) == (p.ResultCode.FENCED, False)
    # the object header a same-machine writer stamps (version 16): Java's stamp, padded to the value offset
    header = p.object_header(K2, 1 << 20, 5001, 7, 0x1A2B3C4D)
    stamped = vec(java_vectors, "object_header")
    assert len(stamped) == p.value_offset(len(K2))
    assert stamped[:len(header)] == header
    view = memoryview(bytearray(b"\xee" * len(stamped)))
    p.stamp(view, 0, header)
    assert bytes(view[:len(header)]) == header
    assert p.encode_lease(ID, 77, 12, 500) == vec(java_vectors, "lease")
    assert p.encode_lease(ID, 77, 15, 0, end=True) == vec(java_vectors, "lease_end")
    # frames only masters send, checked so the documented layouts stay the ones Java writes; each carries
    # the control token of the node's registration (version 10), here bytes C0..CF
    token = bytes(range(0xC0, 0xD0))
    assert (p.BodyWriter().i64(0x0A0B0C0D).fixed(token).i32(3).i64(4096).i64(1234).u8(0).boolean(False)
            .i64(0).i64(7).u8(1).boolean(False).i64(64).i64(9).u8(0).boolean(True).bytes()) == vec(java_vectors, "node_free")
    assert p.BodyWriter().i64(4).i64(0x0A0B0C0D).fixed(token).bytes() == vec(java_vectors, "node_reset")
    assert (p.BodyWriter().i32(3).i64(4).boolean(True).i64(0x0A0B0C0D).bytes()) == vec(java_vectors, "register_reply")
    assert (p.BodyWriter().i64(4).i64(0x0A0B0C0D).fixed(token).string("10.0.0.7").i32(50053).i32(2)
            .bstr(K1).i64(1234).i64(1 << 20).u8(p.TIER_MEMORY).i64(4096).i64(8192)
            .bstr(K2).i64(1235).i64(0).u8(p.TIER_DISK).i64(0).i64(64).bytes()) == vec(java_vectors, "node_replicate")


def test_reply_bodies_decode(java_vectors: dict[str, str]) -> None:
    assert p.decode_hello_reply(vec(java_vectors, "hello_reply")) == p.HelloReply(77, 3, 512, 256 << 20, 2, 0x0A0B0C0D)
    assert p.decode_write_lease(vec(java_vectors, "write_lease_reply")) == p.WriteLease(
        p.ResultCode.OK, 0x0102030405, 7, 0x0A0B0C0D, 3, 4096, 64 << 20, 5000, 16, 30_000, MAC1)
    assert p.decode_write_lease(vec(java_vectors, "write_lease_refused")) == p.WriteLease(p.ResultCode.POOL_FULL)
    assert p.decode_lease_reply(vec(java_vectors, "lease_reply")) == p.LeaseReply(77, 15, 2000, False, (
        p.Invalidation(13, p.INVALIDATE_KEYS, (K1, K2)), p.Invalidation(14, p.INVALIDATE_PREFIX, prefix=K2),
        p.Invalidation(15, p.INVALIDATE_ALL)))
    assert p.decode_lease_reply(vec(java_vectors, "lease_reply_resync")) == p.LeaseReply(78, 20, 2000, True)
    epoch, term, results = p.decode_put_start_reply(vec(java_vectors, "put_start_reply"))
    assert (epoch, term) == (9, 0x0A0B0C0D)
    assert results == [p.PutStartResult(p.ResultCode.OK, 1234, (p.Replica(1, 0, 4096), p.Replica(2, 1, 0)), True,
                                        (MAC1, MAC2)),
                       p.PutStartResult(p.ResultCode.OK, 1235, (p.Replica(3, 0, 0),), False, (bytes(16),)),
                       p.PutStartResult(p.ResultCode.POOL_FULL)]
    assert results[0].grant(1, 4096) == p.WriteGrant(0, 4096, 1234, 1, MAC2)
    assert p.decode_codes(vec(java_vectors, "codes"), "codes") == list(p.ResultCode)
    assert p.decode_replica_lists(vec(java_vectors, "replica_lists")) == [
        p.ReplicaList(p.ResultCode.OK, 1 << 20, 1234, (p.Replica(3, 0, 128),)), p.ReplicaList(p.ResultCode.NOT_FOUND)]
    assert p.decode_flags(vec(java_vectors, "flags"), "flags") == [True, False, True]
    assert p.decode_sizes(vec(java_vectors, "sizes")) == [1 << 20, -1]
    assert p.decode_removed(vec(java_vectors, "removed"), "removed") == (12, 4)
    stats = p.decode_cluster_stats(vec(java_vectors, "cluster_stats"))
    assert (stats.incarnation, stats.epoch, stats.keys, stats.pending_puts, stats.allocated_bytes,
            stats.capacity_bytes, stats.active_clients) == (77, 3, 10, 1, 4096, 1 << 30, 2)
    seg = stats.segments[0]
    assert (seg.id, seg.name, seg.host, seg.port, seg.capacity, seg.used, seg.objects, seg.active,
            seg.heartbeat_age_ms, seg.shm_path) == (1, "127.0.0.1:50052", "127.0.0.1", 50052, 1 << 30, 4096, 10,
                                                    True, 250, "/dev/shm/kvpool-x.seg")
    assert list(seg.tiers.values()) == list(range(1, 15))
    assert (seg.state, seg.draining) == ("active", False)
    # version 12: a segment whose node stops for a restart
    stopping = stats.segments[1]
    assert (stopping.id, stopping.name, stopping.active, stopping.draining, stopping.state) == \
        (2, "127.0.0.1:50053", False, True, "draining")


@pytest.mark.parametrize("name,decode", [
    ("put_start_reply", p.decode_put_start_reply),
    ("replica_lists", p.decode_replica_lists),
    ("cluster_stats", p.decode_cluster_stats),
    ("sizes", p.decode_sizes),
    ("write_lease_reply", p.decode_write_lease),
    ("lease_reply", p.decode_lease_reply),
])
def test_truncated_and_padded_bodies_are_rejected(java_vectors: dict[str, str], name: str, decode) -> None:  # type: ignore[no-untyped-def]
    good = vec(java_vectors, name)
    for cut in (1, len(good) // 2, len(good) - 1):
        with pytest.raises(p.ProtocolError, match="ends early|does not fit"):
            decode(good[:cut])
    with pytest.raises(p.ProtocolError, match="trailing"):
        decode(good + b"\0")


def test_header_checks() -> None:
    good = p.encode_header(0x01, 1, 0, flags=p.FLAG_REPLY)
    with pytest.raises(p.ProtocolError, match="magic"):
        p.decode_header(b"XX" + good[2:])
    with pytest.raises(p.ProtocolError, match=f"version 2; this client speaks version {p.VERSION}"):
        p.decode_header(p.encode_header(0x01, 1, 0, flags=p.FLAG_REPLY, version=2))
    with pytest.raises(p.ProtocolError, match="malformed header"):
        p.decode_header(p.encode_header(0x01, 1, 0, flags=0x03))
    with pytest.raises(p.ProtocolError, match="unknown result code"):
        p.decode_codes(b"\x01\x00\x00\x00\x0b", "codes")
    with pytest.raises(p.ProtocolError, match="does not fit"):
        p.decode_codes(b"\xff\xff\xff\x7f", "codes")


def test_pin_seconds_are_checked_before_sending() -> None:
    for bad in (-2, 1 << 31):
        with pytest.raises(ValueError, match="pin_seconds"):
            p.encode_put_start(False, 1, "", [(K1, 1)], bad)
    assert p.encode_put_start(False, 1, "", [(K1, 1)], (1 << 31) - 1)


def test_key_limits() -> None:
    assert p.encode_key("a" * 512) == b"a" * 512
    with pytest.raises(ValueError, match="1..512"):
        p.encode_key("")
    with pytest.raises(ValueError, match="has 513 UTF-8 bytes"):
        p.encode_key("a" * 513)
    with pytest.raises(ValueError, match="has 514 UTF-8 bytes"):
        p.encode_key("é" * 257)


def test_uuid_halves_are_signed() -> None:
    u = uuid.UUID("ffffffff-ffff-ffff-0000-000000000001").int
    assert (_signed64(u >> 64), _signed64(u & ((1 << 64) - 1))) == (-1, 1)


def test_key_digests_equal_java(java_vectors: dict[str, str]) -> None:
    """KD1, the digest the lookups by digest send, computed by Java and by this module."""
    checked = 0
    for name, hexbody in java_vectors.items():
        if name.startswith("digest:"):
            key = bytes.fromhex(name[len("digest:"):])
            lo, hi = p.key_digest(key)
            assert bytes.fromhex(hexbody) == lo.to_bytes(8, "little") + hi.to_bytes(8, "little"), key
            checked += 1
    assert checked >= 5
    assert p.encode_digests([p.key_digest(K1), p.key_digest(K2)]) == vec(java_vectors, "digest_list")


def test_lookups_by_digest_against_a_real_master(client) -> None:  # type: ignore[no-untyped-def]
    """PREFIX_MATCH_DIGEST and BATCH_EXIST_DIGEST answer as the key forms do (the Java client's lookups)."""
    keys = [f"d/{i}" for i in range(40)]
    client.put_batch(keys[:30], [b"v"] * 30)
    digests = [p.key_digest(k.encode()) for k in keys]
    body = p.encode_digests(digests)
    n = client._ch.master.call(p.Opcode.PREFIX_MATCH_DIGEST, body, lambda b: p.decode_i32(b, "reply"))
    assert n == 30
    flags = client._ch.master.call(p.Opcode.BATCH_EXIST_DIGEST, body, lambda b: p.decode_flags(b, "reply"))
    assert flags == [True] * 30 + [False] * 10
    assert flags == client.batch_exists(keys)


def test_auth_exchange_equals_java(java_vectors: dict[str, str]) -> None:
    """Version 8's AUTH_BEGIN / AUTH_PROVE with WireVectors' fixed nonces and secrets: the same bodies and
    proofs, byte for byte, so a Python client and a Java server (or the reverse) agree."""
    from kvpool.auth import Secrets
    s = Secrets.of("cluster-secret-for-vectors-0123", "admin-secret-for-vectors-456789")
    cn = bytes(range(32))
    sn = bytes(0x80 + i for i in range(32))
    assert p.encode_auth_begin(cn) == vec(java_vectors, "auth_begin")
    assert p.decode_auth_begin_reply(vec(java_vectors, "auth_begin_reply")) == \
        (p.AUTH_MODE_SECURED, sn, p.server_proof(s.key(p.ACCESS_DATA), cn, sn))
    assert p.decode_auth_begin_reply(vec(java_vectors, "auth_begin_reply_open")) == (p.AUTH_MODE_OPEN, sn, b"")
    assert p.encode_auth_prove(p.ACCESS_DATA, p.client_proof(s.key(p.ACCESS_DATA), p.ACCESS_DATA, sn, cn)) == \
        vec(java_vectors, "auth_prove_data")
    assert p.encode_auth_prove(p.ACCESS_ADMIN, p.client_proof(s.key(p.ACCESS_ADMIN), p.ACCESS_ADMIN, sn, cn)) == \
        vec(java_vectors, "auth_prove_admin")
    assert p.decode_auth_prove_reply(vec(java_vectors, "auth_prove_reply")) == p.ACCESS_ADMIN
    # every input changes the proofs
    assert p.client_proof(s.key(p.ACCESS_DATA), p.ACCESS_DATA, sn, cn) != p.client_proof(s.key(p.ACCESS_DATA),
                                                                                          p.ACCESS_ADMIN, sn, cn)
    assert p.server_proof(s.key(p.ACCESS_DATA), cn, sn) != p.server_proof(s.key(p.ACCESS_DATA), sn, cn)


def test_write_grant_mac_is_the_documented_construction(java_vectors: dict[str, str]) -> None:
    """Version 9's write grant as Java's master signs it, recomputed from docs/protocol.md 4.32: another
    implementation of a master or node can make and check grants that this pool's accept."""
    import hmac
    import struct
    from kvpool.auth import Secrets
    s = Secrets.of("cluster-secret-for-vectors-0123", "admin-secret-for-vectors-456789")
    key = hmac.new(s.key(p.ACCESS_ADMIN), b"kvpool write grant v9", "sha256").digest()
    mac = hmac.new(key, struct.pack("<iqqqqi", 3, 0x0A0B0C0D, 4096, 64 << 20, 5000, 16), "sha256").digest()[:16]
    r = p.BodyReader(vec(java_vectors, "write_grant"), "write grant")
    assert p.WriteGrant.read(r) == p.WriteGrant(4096, 64 << 20, 5000, 16, mac)
    r.done()

"""The connector contract (kvpool-connector/src/test/resources/connector-contract-vectors.json, the
scenarios Java's ConnectorContractTest runs against PoolConnector and LocalOffloadConnector) run
against the Python PoolConnector, moving whole blocks (python-pool) and layer by layer
(python-pool-layers, which shares python-pool's skips): over an in-memory store that can be told to
fail, and over a real pool for the scenarios that need no store fault. Each op is checked as the
vectors' about says."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest

import kvpool
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PagedKv, PoolConnector, ScheduledRequest

VECTORS = Path(__file__).resolve().parents[2] / "kvpool-connector" / "src" / "test" / "resources" \
    / "connector-contract-vectors.json"
DOC = json.loads(VECTORS.read_text())
DEFAULTS = DOC["defaults"]
SCENARIOS = DOC["scenarios"]


def content(key: str) -> bytes:
    """The bytes of a computed block: its key's SHA-256, twice."""
    h = hashlib.sha256(key.encode("ascii")).digest()
    return h + h


class MemoryStore:
    """A pool in a dict, for the connector under test: answers as the pool does, records what lookups
    asked, and can be told to fail (the next call of a kind raises, chosen keys read short, chosen
    keys' puts answer a status and store nothing)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_next: set[str] = set()
        self.short_reads: set[str] = set()
        self.put_answers: dict[str, kvpool.PutStatus] = {}
        self.probes: list[str] = []
        self.used: set[str] = set()  # the load and save calls made

    def __getattribute__(self, name: str) -> Any:
        if name in ("get_into_batch", "put_batch", "locate", "begin_put"):
            object.__getattribute__(self, "used").add(name)
        return object.__getattribute__(self, name)

    def _maybe_fail(self, call: str) -> None:
        if call in self.fail_next:
            self.fail_next.discard(call)
            raise kvpool.KvPoolError(f"test store: {call} failed as told")

    def prefix_match(self, keys: Sequence[str]) -> int:
        self._maybe_fail("lookup")
        self.probes += keys
        n = 0
        for k in keys:
            if k not in self.objects:
                break
            n += 1
        return n

    def get_into_batch(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int]:
        self._maybe_fail("load")
        out = []
        for k, b in zip(keys, buffers):
            v = self.objects.get(k)
            if v is None:
                out.append(kvpool.MISS)
                continue
            n = len(v) // 2 if k in self.short_reads else len(v)
            memoryview(b).cast("B")[:n] = v[:n]
            out.append(n)
        return out

    def put_batch(self, keys: Sequence[str], values: Sequence[Any]) -> list[kvpool.PutStatus]:
        self._maybe_fail("save")
        return [self.store(k, bytes(memoryview(v).cast("B"))) for k, v in zip(keys, values)]

    def store(self, key: str, value: bytes) -> kvpool.PutStatus:
        """Stores ``value`` under ``key`` as the pool would (or answers what the test told it to)."""
        if key in self.put_answers:
            return self.put_answers[key]
        if key in self.objects:
            return kvpool.PutStatus.ALREADY_EXISTS
        self.objects[key] = value
        return kvpool.PutStatus.OK

    def locate(self, keys: Sequence[str]) -> "Located":
        """Ranged reads of what is stored now (a later removal or replacement makes them miss, as in the pool)."""
        self._maybe_fail("load")
        return Located(list(keys), [self.objects.get(k) for k in keys])

    def get_ranges_into(self, located: "Located", offsets: Sequence[int], buffers: Sequence[Any]) -> list[int]:
        out = []
        for k, v, off, b in zip(located.keys, located.values, offsets, buffers):
            view = memoryview(b).cast("B")
            n = view.nbytes
            if v is None or self.objects.get(k) is not v or (k in self.short_reads and off + n > len(v) // 2):
                out.append(kvpool.MISS)
                continue
            view[:] = v[off:off + n]
            out.append(n)
        return out

    def begin_put(self, keys: Sequence[str], value_lengths: Sequence[int]) -> "Parts":
        self._maybe_fail("save")
        return Parts(self, list(keys), value_lengths)

    def remove_all(self, force: bool = False) -> int:
        self._maybe_fail("reset")
        n = len(self.objects)
        self.objects.clear()
        return n

    def remove_prefix(self, prefix: str) -> int:
        self._maybe_fail("reset")
        gone = [k for k in self.objects if k.startswith(prefix)]
        for k in gone:
            del self.objects[k]
        return len(gone)

    # what the test asks of the store
    def remove(self, key: str) -> bool:
        return self.objects.pop(key, None) is not None

    def get(self, key: str) -> Optional[bytes]:
        return self.objects.get(key)


class Located:
    """What MemoryStore.locate found: each key's value then (None: missing)."""

    def __init__(self, keys: list[str], values: list[Optional[bytes]]) -> None:
        self.keys = keys
        self.values = values

    def value_length(self, i: int) -> int:
        v = self.values[i]
        return kvpool.MISS if v is None else len(v)

    def pick(self, items: Sequence[int]) -> "Located":
        return Located([self.keys[i] for i in items], [self.values[i] for i in items])


class Parts:
    """A put in parts into MemoryStore: each item's bytes gathered, stored at the finish only if every byte
    was written (or the test told the store how to answer the key's put)."""

    def __init__(self, store: MemoryStore, keys: list[str], value_lengths: Sequence[int]) -> None:
        self.store = store
        self.keys = keys
        self.values = [bytearray(n) for n in value_lengths]
        self.written = [0] * len(keys)

    def write_many(self, items: Sequence[int], offsets: Sequence[int], srcs: Sequence[Any]) -> list[bool]:
        for i, off, src in zip(items, offsets, srcs):
            v = memoryview(src).cast("B")
            self.values[i][off:off + v.nbytes] = v
            self.written[i] += v.nbytes
        return [True] * len(items)

    def finish(self) -> list[kvpool.PutStatus]:
        return [self.store.store(k, bytes(v)) if n == len(v) or k in self.store.put_answers
                else kvpool.PutStatus.FAILED for k, v, n in zip(self.keys, self.values, self.written)]

    def abandon(self) -> None:
        pass


class RecordingClient:
    """A real client whose lookups are recorded (the keys asked about)."""

    def __init__(self, real: kvpool.Client) -> None:
        self.real = real
        self.probes: list[str] = []
        self.used: set[str] = set()  # the load and save calls made

    def __getattr__(self, name: str) -> Any:
        self.used.add(name)
        return getattr(self.real, name)

    def prefix_match(self, keys: Sequence[str]) -> int:
        self.probes += keys
        return int(self.real.prefix_match(keys))


class Blocks(PagedKv):
    """The engine's paged KV: ``blocks`` blocks of ``blockBytes`` bytes in one bytearray."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_layers = DEFAULTS["layers"]
        self.block_bytes = DEFAULTS["blockBytes"]
        self.data = bytearray(self.block_bytes * DEFAULTS["blocks"])

    def block(self, block_id: int) -> memoryview:
        return memoryview(self.data)[block_id * self.block_bytes:(block_id + 1) * self.block_bytes]

    def fill(self, block_id: int, byte: int) -> None:
        self.block(block_id)[:] = bytes([byte]) * self.block_bytes


def snake(name: str) -> str:
    return re.sub("([A-Z])", r"_\1", name).lower()


class Run:
    """One scenario on one connector: the ops in order."""

    def __init__(self, scenario: dict, store: Any, faults: bool, granularity: str = "block") -> None:
        self.s = scenario
        self.store = store
        self.faults = faults
        bs = scenario.get("blockSize", DEFAULTS["blockSize"])
        self.hasher = BlockHasher(bs, DEFAULTS["seed"])
        self.keys = KeyFormat(DEFAULTS["model"], DEFAULTS["weights"], DEFAULTS["dtype"])
        self.pc = PoolConnector(store, self.hasher, self.keys, granularity=granularity)
        self.granularity = granularity
        self.kv = Blocks(bs)
        self.label_keys: dict[str, str] = scenario["keys"]
        self.op_no = 0

    def where(self) -> str:
        return f"op {self.op_no}"

    def key(self, label: str) -> str:
        assert label in self.label_keys, f"{self.where()}: label {label} has a key in the vectors"
        return self.label_keys[label]

    def request(self, name: str, num_tokens: int = -1) -> ConnectorRequest:
        r = self.s["requests"][name]
        n = num_tokens if num_tokens >= 0 else r.get("numTokens", len(r["tokens"]))
        return ConnectorRequest(name, r["tokens"], n, r.get("extraKeys"), r.get("salt"))

    def check_keys(self) -> None:
        """Python's keys for every label equal the vectors' (computed independently with cbor2)."""
        for label, want in self.label_keys.items():
            name, _, weights = label.partition("@")
            req, _, block = name.partition("#")
            r = self.request(req, len(self.s["requests"][req]["tokens"]))
            k = self.keys.with_weights(weights) if weights else self.keys
            assert k.key(self.hasher.hashes(r.tokens, r.num_tokens, r.extra_keys_for)[int(block)]) == want, label

    def refused(self, expect: dict, call: Callable[[], Any]) -> bool:
        want = expect.get("error") == "invalid"
        try:
            call()
        except ValueError as e:
            assert want, f"{self.where()} refused unexpectedly: {e}"
            return True
        assert not want, f"{self.where()}: the connector should have refused"
        return False

    def take_probes(self) -> list[str]:
        out = list(self.store.probes)
        self.store.probes.clear()
        return out

    def all(self) -> None:
        self.check_keys()
        try:
            for op in self.s["ops"]:
                self.op_no += 1
                self.op(op, op.get("expect", {}))
        finally:
            self.pc.close()
        # KV moved as the granularity says: whole blocks never by range, layers never whole
        whole, ranged = {"get_into_batch", "put_batch"}, {"locate", "begin_put"}
        assert not self.store.used & (ranged if self.granularity == "block" else whole), self.store.used

    def op(self, op: dict, expect: dict) -> None:
        kind = op["op"]
        if kind == "lookup":
            self.take_probes()
            got: list = []
            if self.refused(expect, lambda: got.append(
                    self.pc.get_num_new_matched_tokens(self.request(op["req"]), op["computed"]))):
                return
            assert got[0].tokens == expect["tokens"], f"{self.where()}: tokens matched {got[0].tokens}"
            if "probed" in expect:
                assert self.take_probes() == [self.key(l) for l in expect["probed"]], f"{self.where()}: probed"
        elif kind == "alloc":
            self.refused(expect, lambda: self.pc.update_state_after_alloc(self.request(op["req"]), op["blocks"],
                                                                         op["external"]))
        elif kind == "step":
            self.step(op, expect)
        elif kind == "finish":
            keep = self.pc.request_finished(self.request(op["req"]), op["blocks"])
            assert keep == expect["keep"], f"{self.where()}: keep the blocks"
        elif kind == "preempt":
            self.pc.wait_for_request_saves(op["reqs"])
            for b in op["blocks"]:
                self.kv.fill(b, 0xDD)  # the engine reuses the blocks at once
        elif kind == "reset":
            self.check_reset(self.pc.reset_cache(), expect)
        elif kind == "switchWeights":
            reclaimed = self.pc.switch_weights(op["weights"], op["reclaim"]).result(60)
            self.keys = self.keys.with_weights(op["weights"])
            if "reclaimed" in expect:
                assert reclaimed == expect["reclaimed"], f"{self.where()}: reclaimed {reclaimed}"
        elif kind == "evict":
            for label in op["keys"]:
                assert self.store.remove(self.key(label)), f"{self.where()}: evict {label}: the store held it"
        elif kind == "fault":
            assert self.faults, f"{self.where()}: a running pool cannot be told to fail: the scenario should skip it"
            if "fail" in op:
                self.store.fail_next.add(op["fail"])
            self.store.short_reads |= {self.key(l) for l in op.get("shortRead", [])}
            for label, status in op.get("putStatus", {}).items():
                self.store.put_answers[self.key(label)] = kvpool.PutStatus[status]
        elif kind == "store":
            for label in op.get("holds", []):
                assert self.store.get(self.key(label)) == content(self.key(label)), f"{self.where()}: holds {label}"
            for label in op.get("lacks", []):
                assert self.store.get(self.key(label)) is None, f"{self.where()}: lacks {label}"
        elif kind == "stats":
            s = self.pc.stats()
            for name, want in expect.items():
                assert getattr(s, snake(name)) == want, f"{self.where()}: stats {name} = {getattr(s, snake(name))}"
        else:
            raise AssertionError(f"{self.where()}: unknown op {op}")

    def check_reset(self, r: Any, expect: dict) -> None:
        assert r.success == expect["success"], f"{self.where()}: reset ({r.message})"
        if "removed" in expect:
            assert r.removed == expect["removed"], f"{self.where()}: removed {r.removed}"

    def pairs(self, expected: list) -> list[tuple[str, int]]:
        return [(self.key(label), block) for label, block in expected]

    def step(self, op: dict, expect: dict) -> None:
        scheduled: list[ScheduledRequest] = []
        built: list = []

        def plan() -> None:
            for s in op["scheduled"]:
                scheduled.append(ScheduledRequest(self.request(s["req"], s.get("numTokens", -1)), s["blocks"],
                                                  s["before"], s["after"]))
            built.append(self.pc.build_connector_meta(scheduled))

        if self.refused(expect, plan):
            return
        meta = built[0]
        for field, got in (("loads", meta.loads), ("voidLoads", meta.void_loads), ("saves", meta.saves)):
            if field in expect:
                assert [(x.key, x.block_id) for x in got] == self.pairs(expect[field]), f"{self.where()}: {field}"
        if "resetAfterPlanning" in op:
            self.check_reset(self.pc.reset_cache(), op["resetAfterPlanning"])
        for l in (*meta.loads, *meta.void_loads):
            self.kv.fill(l.block_id, 0xEE)  # what the block held before: never mistaken for a load
        self.pc.start_load_kv(meta, self.kv)
        for layer in range(self.kv.num_layers):
            self.pc.wait_for_layer_load(layer)
            if layer == 0:
                self.compute(scheduled)
        for layer in range(self.kv.num_layers):
            self.pc.save_kv_layer(layer, self.kv)
        errors = self.pc.block_ids_with_load_errors()
        if "loadErrors" in expect:
            assert errors == set(expect["loadErrors"]), f"{self.where()}: load errors {errors}"
        if not op.get("noWait"):
            self.pc.wait_for_save()
        for l in meta.loads:
            if l.block_id not in errors:
                assert bytes(self.kv.block(l.block_id)) == content(l.key), \
                    f"{self.where()}: block {l.block_id} holds what was saved under {l.key}"

    def compute(self, scheduled: list[ScheduledRequest]) -> None:
        """The forward pass: every block the step computes gets its key's bytes (a partial block zeros)."""
        bs = self.hasher.block_size
        for s in scheduled:
            r = s.request
            h = self.hasher.hashes(r.tokens, s.computed_after, r.extra_keys_for)
            b = s.computed_before // bs
            while b * bs < s.computed_after and b < len(s.block_ids):
                block = s.block_ids[b]
                if b < len(h):
                    self.kv.block(block)[:] = content(self.keys.key(h[b]))
                else:
                    self.kv.fill(block, 0)
                b += 1


GRANULARITIES = {"python-pool": "block", "python-pool-layers": "layer"}


def skipped(scenario: dict, impls: Sequence[str]) -> Optional[str]:
    """Why the scenario does not apply to any of ``impls`` (python-pool-layers shares python-pool's skips)."""
    skip = scenario.get("skip", {})
    for impl in impls:
        why = skip.get("python-pool" if impl == "python-pool-layers" else impl)
        if why:
            return str(why)
    return None


def test_the_vectors_cover_the_python_connector_and_say_why_a_scenario_is_skipped() -> None:
    assert {"python-pool", "python-pool-layers"} <= set(DOC["implementations"])
    assert len(SCENARIOS) >= 25
    for s in SCENARIOS:
        for impl, why in s.get("skip", {}).items():
            assert why.strip(), f"{s['name']}: why {impl} is skipped"


@pytest.mark.parametrize("impl", GRANULARITIES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"][:60] for s in SCENARIOS])
def test_contract_over_an_in_memory_store(scenario: dict, impl: str) -> None:
    why = skipped(scenario, [impl])
    if why:
        pytest.skip(why)
    Run(scenario, MemoryStore(), faults=True, granularity=GRANULARITIES[impl]).all()


@pytest.mark.parametrize("impl", GRANULARITIES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"][:60] for s in SCENARIOS])
def test_contract_on_a_real_pool(scenario: dict, impl: str, client: kvpool.Client) -> None:
    why = skipped(scenario, [impl, "real-pool"])
    if why:
        pytest.skip(why)
    Run(scenario, RecordingClient(client), faults=False, granularity=GRANULARITIES[impl]).all()

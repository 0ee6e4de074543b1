"""Dynamo's standalone KV indexer, run as its own process: ``python -m dynamo.indexer`` from ai-dynamo-runtime 1.6.1
(``dynamo._core.run_kv_indexer``, Rust ``dynamo_kv_router::services::indexer``), with the HTTP API its docs describe
(``docs/pages/components/router/standalone-indexer.md`` upstream): ``POST /register`` a worker's ZMQ PUB endpoint
(and its replay ROUTER), ``POST /query`` a prompt's token ids, ``POST /query_by_hash`` Dynamo's own block hashes,
``GET /dump`` its index as Dynamo ``RouterEvent``s.

Nothing is converted on the way in: for each registered endpoint the indexer runs its own ZMQ SUB listener (topic
"", so any topic) that decodes vLLM's msgpack ``[ts, events, dp_rank]`` batches (``zmq_wire::KvEventBatch``) and
converts each event with ``zmq_wire::convert_event``, exactly as for a bare vLLM engine. Dynamo recomputes its own
block hash of every stored block from the event's ``token_ids`` (``tokens_hash``, its "local" hash, seeded by the
LoRA name) and keeps the engine's ``block_hashes`` only as the chain's identity (``block_hash``/``parent_hash``).

What Dynamo 1.6.1 does with ``medium``: one index per storage tier. No medium or ``GPU`` goes to the device radix
tree (what ``scores`` counts); ``CPU`` to the ``host_pinned`` tier and ``STORAGE`` to the ``disk`` tier, each an
exact continuation index of ``(parent hash, local hash) -> block hash`` edges. A query walks the device tree from
the prompt's first block, then continues in the host tier from where it stopped, then in the disk tier from where
that stopped (it never goes back up a tier); ``instances[worker]`` reports those depths cumulatively, in tokens:
``gpu``, ``cpu`` (gpu + host continuation), ``disk`` (cpu + disk continuation), ``longest_matched``.
``AllBlocksCleared`` clears the worker in every tier.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from kvpool_pools import free_port

DEADLINE = 60.0


@dataclass(frozen=True)
class Match:
    """Dynamo's answer for one worker, in blocks: ``device`` is its overlap score (``scores``, the device tree only);
    ``gpu``, ``host`` and ``disk`` the cumulative depths of its tiered walk (``instances``: device, then host-pinned
    memory, then disk); ``longest`` its ``longest_matched``. All 0 when Dynamo knows nothing of the prompt there."""

    device: int = 0
    gpu: int = 0
    host: int = 0
    disk: int = 0
    longest: int = 0

    @staticmethod
    def of(answer: dict[str, Any], worker: int, block_size: int) -> "Match":
        def blocks(tokens: int) -> int:
            assert tokens % block_size == 0, f"{tokens} tokens is not whole blocks of {block_size}: {answer}"
            return tokens // block_size

        unknown = set(answer.get("instances", {})) | set(answer.get("scores", {}))
        assert unknown <= {str(worker)}, f"Dynamo answered for workers never registered: {answer}"
        scores = answer.get("scores", {}).get(str(worker), {})
        assert set(scores) <= {"0"}, f"dp ranks other than 0: {answer}"
        inst = answer.get("instances", {}).get(str(worker))
        if inst is None:
            return Match(device=blocks(scores.get("0", 0)))
        return Match(device=blocks(scores.get("0", 0)), gpu=blocks(inst["gpu"]), host=blocks(inst["cpu"]),
                     disk=blocks(inst["disk"]), longest=blocks(inst["longest_matched"]))


class DynamoIndexer:
    """``python -m dynamo.indexer`` on a free loopback port (one indexer thread), stopped by PID."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(self.port),
                                      "--threads", "1"], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + DEADLINE
        while True:
            assert self.proc.poll() is None, f"dynamo.indexer exited with {self.proc.returncode}: {self.tail()}"
            try:
                self.workers()
                return
            except OSError:
                assert time.monotonic() < deadline, f"dynamo.indexer never answered on {self.url}: {self.tail()}"
                time.sleep(0.1)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def _call(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def _ok(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
        status, answer = self._call(method, path, body)
        assert 200 <= status < 300, f"{method} {path} {body}: HTTP {status}: {answer}"
        return answer

    def register(self, worker: int, endpoint: str, replay: str, model: str, block_size: int) -> None:
        """A worker's KV event stream, as one would register a vLLM engine's ``--kv-events-config`` endpoints."""
        self._ok("POST", "/register", {"instance_id": worker, "endpoint": endpoint, "replay_endpoint": replay,
                                       "model_name": model, "block_size": block_size})

    def workers(self) -> list[dict[str, Any]]:
        status, answer = self._call("GET", "/workers")
        assert status == 200, f"GET /workers: HTTP {status}: {answer}"
        return list(answer)

    def query(self, model: str, token_ids: Sequence[int], lora_name: Optional[str] = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model_name": model, "token_ids": list(token_ids)}
        if lora_name is not None:
            body["lora_name"] = lora_name
        return dict(self._ok("POST", "/query", body))

    def query_by_hash(self, model: str, local_hashes: Sequence[int]) -> dict[str, Any]:
        """By Dynamo's own block hashes (``compute_block_hash_for_seq``), sent as the i64 the endpoint takes."""
        signed = [h - (1 << 64) if h >= 1 << 63 else h for h in local_hashes]
        return dict(self._ok("POST", "/query_by_hash", {"model_name": model, "block_hashes": signed}))

    def dump(self, model: str) -> list[dict[str, Any]]:
        """The index of ``model`` as the ``RouterEvent``s that would rebuild it."""
        answer = self._ok("GET", "/dump")
        entry = answer.get(f"{model}:default", {"events": []})
        return list(entry["events"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tiers(events: list[dict[str, Any]], worker: int) -> dict[str, dict[int, Optional[int]]]:
    """A dump's stored blocks of ``worker`` by storage tier: ``{tier: {block hash: Dynamo's local hash}}``."""
    out: dict[str, dict[int, Optional[int]]] = {}
    for e in events:
        assert e["worker_id"] == worker, e
        stored = e["event"]["data"].get("stored")
        assert stored is not None, f"a dump holds stored events only: {e}"
        for b in stored["blocks"]:
            out.setdefault(e["storage_tier"], {})[int(b["block_hash"])] = b["tokens_hash"]
    return out


def until(what: str, done: Callable[[], bool], explain: Callable[[], str] = lambda: "") -> None:
    """Polls ``done`` until it holds; fails naming ``what`` (and ``explain()``) after a generous deadline."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}: {explain()}"
        time.sleep(0.05)

"""What the llm-d peer's suite uses (conftest.py's fixtures and the tests): llm-d's KV-cache indexer
(github.com/llm-d/llm-d-kv-cache, the Go module pinned in peers/llm-d/harness/go.mod) subscribed to two real
kvpool pools' KV events, asked to score prompts.

``scripts/peers.sh install llm-d`` builds the venv (pytest) and the harness, ``<venv>/bin/llmd-harness``
(peers/llm-d/harness/main.go): llm-d's own ZMQ subscriber, vLLM event adapter, events pool, block index, token
processor and scorer, wired as llm-d's example service wires them, with a line protocol on stdin/stdout for
``score`` (pod scores of a prompt's token ids), ``stats`` and ``config``. ``Harness`` starts it and stops it by
its PID.

Two pools (master and node by PID, python/tests/conftest.py's ``Pool``), both with KV events on and an 8 MiB
memory segment; ``ssd`` also has the SSD tier (``--disk-dir``, ``--disk-size 128MiB``, ``--promote-after 0``).
Each publishes under the topic ``kv@kvpool-NAME@tiny-llama``: llm-d takes the pod from the topic's middle part,
so each pool is one llm-d pod, ``kvpool-NAME``, and the model from the last part, which a score query must name.

Blocks reach the pool the way a connector saves them: connector keys (``KeyFormat``) of vLLM's block hashes
(``BlockHasher``), described first with their tokens (``Client.describe_blocks`` with ``kvpool.BlockInfo``) so
that the master's BlockStored events carry the token ids llm-d computes its own keys from, then put.

Waits poll with generous deadlines; nothing depends on how long anything takes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import kvpool
from kvpool.connector.hashing import BlockHasher
from kvpool.connector.keys import KeyFormat
from kvpool_pools import Pool, free_port

MODEL = "tiny-llama"
BLOCK = 16
DEADLINE = 120.0
KEYS = KeyFormat(MODEL, "v1", "bf16")
HASHER = BlockHasher(BLOCK, seed="0")
#: llm-d's default medium weights (kvcache.DefaultKVCacheBackendConfig): gpu 1.0, cpu 0.8; a medium it has no
#: weight for (STORAGE, lowercased "storage") counts 1.0 (LongestPrefixScorer's fallback).
CPU_WEIGHT = 0.8
STORAGE_WEIGHT = 1.0

HARNESS = Path(sys.prefix) / "bin" / "llmd-harness"


# ------------------------------------------------------------------------------------------ prompts


@dataclass
class Prompt:
    """A prompt's full blocks as a connector saves them: pool keys, vLLM block hashes, the tokens of each."""

    tokens: list[int]
    hashes: list[bytes] = field(init=False)
    keys: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.hashes = HASHER.hashes(self.tokens)
        self.keys = KEYS.keys(self.hashes)

    @property
    def blocks(self) -> int:
        return len(self.keys)

    def infos(self, start: int = 0, end: int | None = None) -> list[Any]:
        """The ``kvpool.BlockInfo`` of blocks ``[start, end)``: tokens, block size and the parent's hash as a router
        is told it (``kvpool.router_block_hash``: the low 64 bits of the parent key's block hash)."""
        end = self.blocks if end is None else end
        return [kvpool.BlockInfo(self.keys[i], self.tokens[i * BLOCK:(i + 1) * BLOCK], BLOCK,
                                 parent_block_hash=None if i == 0 else kvpool.router_block_hash(self.keys[i - 1]))
                for i in range(start, end)]


def prompt(first_token: int, blocks: int, extra_tokens: int = 0) -> Prompt:
    return Prompt(list(range(first_token, first_token + BLOCK * blocks + extra_tokens)))


def store(client: kvpool.Client, p: Prompt, value_size: int = 4096, start: int = 0, end: int | None = None,
          describe: bool = True) -> None:
    """Saves blocks ``[start, end)`` of ``p`` as a connector would: their tokens described first, then the puts."""
    end = p.blocks if end is None else end
    if describe:
        kept = client.describe_blocks(p.infos(start, end))
        assert kept == end - start, f"the master kept {kept} of {end - start} block infos (are its KV events on?)"
    for key in p.keys[start:end]:
        st = client.put(key, b"k" * value_size)
        assert st == kvpool.PutStatus.OK, (key, st)


# ------------------------------------------------------------------------------------------ pools


class EventsPool:
    """A pool with KV events on, published under ``kv@kvpool-NAME@tiny-llama``: llm-d's pod ``kvpool-NAME``."""

    def __init__(self, name: str, disk: Path | None) -> None:
        self.name = name
        #: llm-d's pod identifier for this pool (the topic's middle part; any text without "@")
        self.pod = f"kvpool-{name}"
        self.topic = f"kv@{self.pod}@{MODEL}"
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        extra = ["--kv-events-endpoint", self.pub, "--kv-events-topic", self.topic]
        if disk is not None:
            extra += ["--disk-dir", str(disk), "--disk-size", "128MiB", "--promote-after", "0"]
        self.pool = Pool(segment_size="8MiB", extra=extra)
        self.master = self.pool.master

    def client(self) -> kvpool.Client:
        return kvpool.Client(self.master)

    def tiers(self, keys: Sequence[str]) -> list[str]:
        """Where each key is now, one by one (TIER_LOOKUP, which is no read for eviction): "CPU" (a copy in
        memory), "STORAGE" (on the SSD tier only) or "" (absent)."""
        out = []
        with self.client() as c:
            for k in keys:
                t = c.tier_lookup([k])
                out.append("CPU" if t.memory_blocks else "STORAGE" if t.storage_blocks else "")
        return out


# ------------------------------------------------------------------------------------------ the harness


class Harness:
    """llmd-harness by PID: llm-d's indexer subscribed to ``endpoints``; one JSON request and answer a line."""

    def __init__(self, endpoints: Sequence[str], log: Path) -> None:
        if not HARNESS.exists():
            raise RuntimeError(f"{HARNESS} is missing: run scripts/peers.sh install llm-d (./kvpool test-peers llm-d)")
        args = [str(HARNESS), "--block-size", str(BLOCK)]
        for ep in endpoints:
            args += ["--endpoint", ep]
        self.log = log
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "wb"),
                                     start_new_session=True)
        self.pid = self.proc.pid
        self._buf = b""

    def ask(self, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.poll() is None, f"llmd-harness exited with {self.proc.returncode}: {self.log_tail()}"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            assert left > 0, f"llmd-harness did not answer {request['op']} in {timeout}s: {self.log_tail()}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                assert chunk, f"llmd-harness closed its stdout: {self.log_tail()}"
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        answer = json.loads(line)
        assert "error" not in answer, f"llmd-harness: {answer['error']} (for {request})"
        return answer

    def score(self, p: Prompt | Sequence[int], model: str = MODEL) -> dict[str, float]:
        """llm-d's pod scores for a prompt's tokens (Indexer.ScoreTokens): pods with no leading block are absent."""
        tokens = p.tokens if isinstance(p, Prompt) else list(p)
        return self.ask({"op": "score", "model": model, "tokens": tokens})["scores"]

    def stats(self) -> dict[str, Any]:
        return self.ask({"op": "stats"})

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stops it by PID: SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()


def until(what: str, check: Callable[[], tuple[bool, Any]], deadline: float = DEADLINE) -> Any:
    """Polls ``check`` (which returns (done, what it saw)) until done; fails after ``deadline`` with the last
    thing it saw."""
    end = time.monotonic() + deadline
    while True:
        done, seen = check()
        if done:
            return seen
        assert time.monotonic() < end, f"timed out waiting until {what}; last seen: {seen}"
        time.sleep(0.1)


def close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


@dataclass
class Fleet:
    """What a test gets: the two pools, the harness subscribed to both."""

    ssd: EventsPool
    mem: EventsPool
    llmd: Harness

    def settle(self, pool: EventsPool, p: Prompt, expected: float) -> dict[str, float]:
        """Waits until llm-d scores ``p`` at ``expected`` for ``pool`` (0: ``pool`` absent from the scores)."""
        def check() -> tuple[bool, Any]:
            s = self.llmd.score(p)
            return close(s.get(pool.pod, 0.0), expected), s
        return until(f"llm-d scores the prompt {expected} for {pool.name} ({pool.pod})", check)

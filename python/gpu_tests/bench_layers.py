"""Time to first token with whole blocks against layer by layer, on a GPU engine whose layer's compute is of the
size of its load (issue 36 item 5; ``scripts/gpu-check.sh``; ``KVPOOL_GPU_DEVICE=cpu`` for a dry run).

Why a GPU. On the CPU machines the reference engine's loads are CPU work (a memory copy, or loopback TCP at both
ends) on the same cores and memory bandwidth as its compute, so overlapping them cannot pay (docs/benchmarks.md,
"Layer by layer, timed per layer"). On a GPU the compute runs on the device while a load is a host copy plus DMA:
the two use different hardware, and a layer's compute can hide the next layer's load.

The engine. A Llama-3-8B-shaped decoder stack on the device (32 layers, hidden 4096, 32 query heads and 8 KV
heads of 128, SwiGLU MLP of 14336, bf16; random weights, one layer's weights shared by all 32 layers, no RoPE:
the compute per layer is the model's, the tokens mean nothing). Its KV cache is paged as vLLM's FlashAttention
backend lays it out (per layer ``[blocks, 16 tokens, 8 heads, K|V]``), seen by the connector as a
:class:`~kvpool.device.DeviceKv` on the CUDA edge. Each layer writes the new tokens' K and V into their pages
and attends over the cached pages plus the new tokens (causal).

What runs. An engine with a :class:`~kvpool.connector.PoolConnector` prefills a prompt of ``CACHED`` tokens and
saves its blocks to the pool. Then, for each count of new tokens, a request of those ``CACHED`` tokens plus the
new ones is run over and over, its cached blocks zeroed on the device before each run, in three ways (rounds
alternate which goes first): no pool (the prefill's KV copied back into the cached blocks: compute alone), whole blocks
(``granularity="block"``: every layer waits for the whole load) and layer by layer (``granularity="layer"``:
layer ``l`` computes once layer ``l`` is in; at this geometry the connector reads 4 layers a ranged read, its
``layer_read_bytes`` default). Time to first token is from ``start_load_kv`` until the last layer's
output is on the device (a synchronize). Also timed: the loads alone in both modes. The last hidden states of
the three ways must be equal (a zeroed or stale block changes them), or the bench fails: the loads brought the
prefill's KV back. The measured requests
save nothing (their step's saves are dropped from the plan): the comparison is of loads.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import kvpool  # noqa: E402
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PoolConnector, ScheduledRequest  # noqa: E402
from kvpool.connector import layers  # noqa: E402
from kvpool.device import CpuEdge, CudaEdge, DeviceKv, PageFormat  # noqa: E402

DEVICE = os.environ.get("KVPOOL_GPU_DEVICE", "cuda")
GPU = DEVICE == "cuda"
BS = 16  # tokens a block
if GPU:  # Llama-3-8B
    LAYERS, HIDDEN, Q_HEADS, KV_HEADS, HEAD, MLP, DTYPE = 32, 4096, 32, 8, 128, 14336, torch.bfloat16
else:  # a dry run's toy of the same shape
    LAYERS, HIDDEN, Q_HEADS, KV_HEADS, HEAD, MLP, DTYPE = 4, 64, 4, 2, 16, 128, torch.float32
CACHED = int(os.environ.get("KVPOOL_GPU_LAYERS_CACHED", "4096" if GPU else "64"))
NEW = [int(n) for n in os.environ.get("KVPOOL_GPU_LAYERS_NEW", "256,1024,4096" if GPU else "16,32").split(",")]
ROUNDS = int(os.environ.get("KVPOOL_GPU_LAYERS_ROUNDS", "6" if GPU else "2"))
SHM = os.environ.get("KVPOOL_GPU_LAYERS_PATHS", "shm,tcp").split(",")


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


class Model:
    """One decoder layer's weights, applied ``LAYERS`` times (see the module docstring)."""

    def __init__(self) -> None:
        g = torch.Generator(device=DEVICE).manual_seed(36)

        def w(rows: int, cols: int) -> Any:
            return (torch.randn(rows, cols, device=DEVICE, generator=g) * rows ** -0.5).to(DTYPE)
        self.qkv = w(HIDDEN, (Q_HEADS + 2 * KV_HEADS) * HEAD)
        self.o = w(Q_HEADS * HEAD, HIDDEN)
        self.gate_up = w(HIDDEN, 2 * MLP)
        self.down = w(MLP, HIDDEN)
        self.sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)

    @staticmethod
    def norm(x: Any) -> Any:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def layer(self, x: Any, pages: Any, cached: Any, new: Any, mask: Any) -> Any:
        """``x`` ``(T, HIDDEN)``; ``pages`` the layer's cache ``[blocks, BS, KV_HEADS, 2 * HEAD]``; ``cached`` and
        ``new`` the block ids of the cached prefix and of the new tokens; ``mask`` ``(T, cached + T)``."""
        t = x.shape[0]
        q, k, v = (self.norm(x) @ self.qkv).split([Q_HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        kv_new = torch.cat([k.view(t, KV_HEADS, HEAD), v.view(t, KV_HEADS, HEAD)], dim=-1)
        pages.index_copy_(0, new, kv_new.view(t // BS, BS, KV_HEADS, 2 * HEAD))
        seq = pages.index_select(0, torch.cat([cached, new])).view(-1, KV_HEADS, 2 * HEAD)
        group = Q_HEADS // KV_HEADS
        keys = seq[..., :HEAD].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)  # (1, Q_HEADS, S, HEAD)
        values = seq[..., HEAD:].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        queries = q.view(t, Q_HEADS, HEAD).transpose(0, 1).unsqueeze(0)  # (1, Q_HEADS, T, HEAD)
        if self.sdpa is not None:
            att = self.sdpa(queries, keys, values, attn_mask=mask)
        else:  # torch 1.x (the CPU dry run)
            scores = (queries @ keys.transpose(-1, -2)) * HEAD ** -0.5
            att = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ values
        x = x + att[0].transpose(0, 1).reshape(t, Q_HEADS * HEAD) @ self.o
        gate, up = (self.norm(x) @ self.gate_up).chunk(2, dim=-1)
        return x + (torch.nn.functional.silu(gate) * up) @ self.down


def phases(pc: PoolConnector, kv: DeviceKv, meta: Any, rows: list[tuple[str, str]], path: str) -> None:
    """One layer-by-layer load alone, its time split into the connector's phases (summed over the layers): the
    targets in host memory, the ranged reads from the pool, the commit to the device (copy and scatter)."""
    client = pc.client
    spent = {"targets": 0.0, "reads": 0.0, "commit": 0.0}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t0
        return call
    run_targets, reads = kv.layer_run_targets, client.get_ranges_into

    def targets(ids: Any, first: int, count: int) -> Any:
        t, commit = timed("targets", run_targets)(ids, first, count)
        return t, timed("commit", commit)
    kv.layer_run_targets, client.get_ranges_into = targets, timed("reads", reads)
    try:
        sync()
        t0 = time.perf_counter()
        pc.start_load_kv(meta, kv)
        pc.wait_for_layer_load(LAYERS - 1)
        total = time.perf_counter() - t0
    finally:
        del kv.layer_run_targets, client.get_ranges_into
    if not spent["targets"]:
        raise SystemExit("bench_layers: the load's phases were not timed (the connector reads through another method)")
    rest = total - sum(spent.values())  # the lookup, the hand-offs between threads, the waits
    rows.append((f"{path}, one load's phases", f"all in {total * 1e3:.1f} ms: " + ", ".join(
        f"{k} {v * 1e3:.1f} ms" for k, v in spent.items()) + f", the rest {rest * 1e3:.1f} ms"))
    print(f"{rows[-1][0]:28} {rows[-1][1]}", flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> int:
    master = os.environ["KVPOOL_MASTER"]
    edge = CudaEdge() if GPU else CpuEdge()
    model = Model()
    cached_blocks = CACHED // BS
    total = cached_blocks + max(NEW) // BS
    raw = torch.zeros(LAYERS, total, BS, KV_HEADS, 2 * HEAD, dtype=DTYPE, device=DEVICE)
    pages = [raw[i] for i in range(LAYERS)]
    item = raw.element_size()
    kv = DeviceKv([p.permute(0, 2, 1, 3) for p in pages], PageFormat(KV_HEADS, BS, 2 * HEAD * item, HEAD * item),
                  BS, edge, str(DTYPE).removeprefix("torch."))
    hasher, keys = BlockHasher(BS, "0"), KeyFormat("gpu-layers", "v1", str(DTYPE).removeprefix("torch."))
    prefix = list(range(1, CACHED + 1))
    cached_ids = list(range(cached_blocks))
    cached = torch.tensor(cached_ids, dtype=torch.long, device=DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(7)

    def forward(x: Any, new: Any, cached_idx: Any, wait: Callable[[int], None]) -> Any:
        t = x.shape[0]
        s = cached_idx.numel() * BS + t
        mask = torch.ones(t, s, dtype=torch.bool, device=DEVICE).tril(s - t)
        for layer in range(LAYERS):
            wait(layer)
            x = model.layer(x, pages[layer], cached_idx, new, mask)
        return x

    rows: list[tuple[str, str]] = []
    fails: list[str] = []
    print(f"\nkvpool layer by layer on {DEVICE} ({torch.cuda.get_device_name() if GPU else 'CPU'}), torch "
          f"{torch.__version__}: {LAYERS} layers, {kv.block_bytes >> 10} KiB blocks of {BS} tokens, {CACHED} cached "
          f"tokens ({cached_blocks * kv.block_bytes >> 20} MiB), {layers.layers_a_read(kv)} layers a ranged read, "
          f"medians of {ROUNDS} rounds\n", flush=True)
    for path in SHM:
        with kvpool.Client(master, shared_memory=path == "shm") as client:
            client.remove_all(force=True)
            # the first engine: prefills the prefix and saves its blocks (whole blocks)
            with PoolConnector(client, hasher, keys) as pc:
                r = ConnectorRequest("prefill", prefix)
                pc.get_num_new_matched_tokens(r, 0)
                pc.update_state_after_alloc(r, cached_ids, 0)
                meta = pc.build_connector_meta([ScheduledRequest(r, cached_ids, 0, CACHED)])
                pc.start_load_kv(meta, kv)
                x = torch.randn(CACHED, HIDDEN, device=DEVICE, generator=g).to(DTYPE)
                empty = torch.tensor([], dtype=torch.long, device=DEVICE)

                def saving(layer: int) -> None:
                    if layer:
                        pc.save_kv_layer(layer - 1, kv)
                forward(x, cached, empty, saving)
                pc.save_kv_layer(LAYERS - 1, kv)
                pc.wait_for_save()
                if pc.saved_blocks != cached_blocks:
                    raise SystemExit(f"bench_layers: the prefill saved {pc.saved_blocks} of {cached_blocks} blocks")
            ref = raw[:, :cached_blocks].clone()
            conns = {g_: PoolConnector(client, hasher, keys, granularity=g_) for g_ in ("block", "layer")}
            try:
                for n_new in NEW:
                    new_ids = list(range(cached_blocks, cached_blocks + n_new // BS))
                    new = torch.tensor(new_ids, dtype=torch.long, device=DEVICE)
                    x0 = torch.randn(n_new, HIDDEN, device=DEVICE, generator=g).to(DTYPE)
                    times: dict[str, list[float]] = {k: [] for k in ("none", "block", "layer", "load block",
                                                                      "load layer", "layer 0 in")}
                    outs: dict[str, Any] = {}
                    serial = [0]

                    def planned(pc: PoolConnector) -> Any:
                        serial[0] += 1
                        r = ConnectorRequest(f"r{serial[0]}", prefix + list(range(10**6, 10**6 + n_new)))
                        m = pc.get_num_new_matched_tokens(r, 0)
                        if m.tokens != CACHED:
                            raise SystemExit(f"bench_layers: the pool matched {m.tokens} of {CACHED} tokens")
                        pc.update_state_after_alloc(r, cached_ids + new_ids, m.tokens)
                        meta = pc.build_connector_meta([ScheduledRequest(r, cached_ids + new_ids, CACHED,
                                                                         CACHED + n_new)])
                        meta.saves.clear()  # the comparison is of loads (module docstring)
                        return meta

                    def run(way: str) -> None:
                        if way == "none":
                            raw[:, :cached_blocks].copy_(ref)  # the prefix's KV, as the prefill computed it
                        else:
                            raw[:, :cached_blocks].zero_()
                        sync()
                        pc = conns.get(way)
                        meta = planned(pc) if pc is not None else None
                        t0 = time.perf_counter()
                        first = [0.0]
                        if pc is None:
                            out = forward(x0, new, cached, lambda layer: None)
                        else:
                            pc.start_load_kv(meta, kv)

                            def wait(layer: int) -> None:
                                pc.wait_for_layer_load(layer)
                                if layer == 0:
                                    first[0] = time.perf_counter() - t0
                            out = forward(x0, new, cached, wait)
                        sync()
                        times[way].append(time.perf_counter() - t0)
                        if pc is not None:
                            if way == "layer":
                                times["layer 0 in"].append(first[0])
                            bad = pc.block_ids_with_load_errors()
                            if bad:
                                raise SystemExit(f"bench_layers: {len(bad)} blocks failed to load ({way})")
                        outs[way] = out

                    def load_only(way: str) -> None:
                        raw[:, :cached_blocks].zero_()
                        sync()
                        pc = conns[way]
                        meta = planned(pc)
                        t0 = time.perf_counter()
                        pc.start_load_kv(meta, kv)
                        pc.wait_for_layer_load(LAYERS - 1)
                        times["load " + way].append(time.perf_counter() - t0)

                    for way in ("none", "block", "layer", "block", "layer"):  # warm-up
                        run(way)
                    for key in times:
                        times[key].clear()
                    for i in range(ROUNDS):
                        order = ["none", "block", "layer"] if i % 2 == 0 else ["layer", "block", "none"]
                        for way in order:
                            run(way)
                        for way in order[1:] if i % 2 == 0 else order[:2]:
                            load_only(way)
                    if n_new == NEW[0]:
                        phases(conns["layer"], kv, planned(conns["layer"]), rows, path)
                    for way in ("block", "layer"):
                        same = torch.equal(outs[way], outs["none"])
                        if not same:
                            diff = (outs[way].float() - outs["none"].float()).abs().max().item()
                            fails.append(f"{path}, {n_new} new tokens, {way}: hidden states differ from no pool's "
                                         f"(max |diff| {diff:.3g})")
                    none, whole, layer = (median(times[k]) for k in ("none", "block", "layer"))
                    lb, ll, l0 = (median(times[k]) for k in ("load block", "load layer", "layer 0 in"))
                    label = f"{path}, {n_new} new tokens"
                    rows.append((label, f"compute alone {none:8.1f} ms | loads alone: whole {lb:7.1f} ms, layer by "
                                        f"layer {ll:7.1f} ms"))
                    rows.append((label, f"TTFT whole {whole:8.1f} ms | layer by layer {layer:8.1f} ms "
                                        f"({layer / whole:.2f}x) | layer 0 in after {l0:.1f} ms | ideal "
                                        f"{max(none, ll):.1f} ms"))
                    print(f"{rows[-2][0]:28} {rows[-2][1]}\n{rows[-1][0]:28} {rows[-1][1]}", flush=True)
            finally:
                for pc in conns.values():
                    pc.close()
                client.remove_all(force=True)
    for f in fails:
        print("bench_layers: FAILED:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

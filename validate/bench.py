"""Micro-benchmarks of `planner profile`, run under torchrun on every process of the node(s):
GEMM sweeps over sizes and dtypes, fused attention, memory copy bandwidth, and all-reduce,
all-gather, reduce-scatter and send/recv sweeps over message sizes (on the node's ranks, and
across nodes when there are several). Rank 0 writes the raw numbers as JSON; profile.py turns
them into a GpuProfile.

    python -m torch.distributed.run --nproc-per-node 2 -m planner.validate.bench --out RAW.json

Every rank runs the compute benchmarks at the same time, as ranks do in training (on CPUs they
share the cores, each with cores/nproc threads, as `planner validate` runs them)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .records import environment

GIB = 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, min_time_s: float,
              min_iters: int = 3) -> float:
    """Fastest seconds of one call (one warm-up call first), repeating for at least min_time_s:
    what the hardware can do (MAMF-style), not what a busy neighbour left of it."""
    fn()
    _sync(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return min(times)


def gemm_sweep(device: torch.device, dtypes: list[torch.dtype], sizes: list[int],
               min_time_s: float) -> dict[str, list[list[float]]]:
    """dtype -> [(FLOP of one square GEMM = 2 n^3, FLOP/s achieved)]."""
    out: dict[str, list[list[float]]] = {}
    for dtype in dtypes:
        points = []
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            t = time_call(lambda a=a, b=b: torch.mm(a, b), device, min_time_s)
            points.append([2.0 * n**3, 2.0 * n**3 / t])
        out[str(dtype).removeprefix("torch.")] = points
    return out


def attention_rate(device: torch.device, dtype: torch.dtype, batch: int, heads: int, seq: int,
                   head_dim: int, min_time_s: float) -> dict[str, float]:
    """Causal SDPA forward + backward, FLOP/s counted as the planner counts model FLOPs:
    forward 4 b h s^2 d / 2 (causal half), backward twice the forward."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype,
                           requires_grad=True) for _ in range(3))

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()

    t = time_call(step, device, min_time_s)
    flop = 3 * 4.0 * batch * heads * seq**2 * head_dim / 2
    return {"flop": flop, "flop_per_s": flop / t, "batch": batch, "heads": heads, "seq": seq,
            "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch.")}


def copy_bandwidth(device: torch.device, nbytes: int, min_time_s: float) -> float:
    """Bytes/s of a large tensor copy, counting the read and the write (STREAM Copy)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, min_time_s)
    return 2.0 * nbytes / t


def time_collective(fn: Callable[[], Any], device: torch.device, min_time_s: float,
                    group: dist.ProcessGroup | None) -> float:
    """Median seconds of one call of a communication op, the slowest rank's. The ranks agree on
    the repeat count first (each deciding alone would leave one waiting for a call that never
    comes)."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    count = torch.tensor([min(200, max(3, int(min_time_s / max(first, 1e-6))))], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    times = []
    for _ in range(int(count.item())):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return _slowest(statistics.median(times), device, group)


def _slowest(seconds: float, device: torch.device, group: dist.ProcessGroup | None) -> float:
    buf = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
    return float(buf.item())


def collective_sweep(device: torch.device, sizes: list[int], group: dist.ProcessGroup | None,
                     min_time_s: float) -> dict[str, list[list[float]]]:
    """op -> [(message bytes S, seconds, busbw bytes/s)] on `group`, nccl-tests conventions:
    all-reduce busbw = 2 S (n-1)/n / t; all-gather and reduce-scatter (S = the full buffer)
    busbw = S (n-1)/n / t. Time = the slowest rank's median."""
    n = dist.get_world_size(group)
    out: dict[str, list[list[float]]] = {"all_reduce": [], "all_gather": [], "reduce_scatter": []}
    for size in sizes:
        numel = max(n, size // 4 // n * n)
        nbytes = numel * 4
        full = torch.ones(numel, dtype=torch.float32, device=device)
        shard = torch.ones(numel // n, dtype=torch.float32, device=device)
        ops = {
            "all_reduce": (lambda f=full: dist.all_reduce(f, group=group), 2.0),
            "all_gather": (lambda f=full, s=shard: dist.all_gather_single(f, s, group=group), 1.0),
            "reduce_scatter": (
                lambda f=full, s=shard: dist.reduce_scatter_single(s, f, group=group), 1.0),
        }
        for name, (fn, factor) in ops.items():
            try:
                dist.barrier(group=group)
                t = time_collective(fn, device, min_time_s, group)
            except (RuntimeError, NotImplementedError):  # e.g. an op the backend lacks
                continue
            out[name].append([float(nbytes), t, factor * nbytes * (n - 1) / n / t])
    return out


def send_recv_sweep(device: torch.device, sizes: list[int], peer_a: int, peer_b: int,
                    min_time_s: float) -> list[list[float]]:
    """[(bytes, one-way seconds, bytes/s)] of a ping-pong between two ranks (half the round
    trip). Every rank calls it; only the two peers communicate."""
    rank = dist.get_rank()
    out = []
    for size in sizes:
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)

        def ping(buf: torch.Tensor = buf) -> None:
            if rank == peer_a:
                dist.send(buf, peer_b)
                dist.recv(buf, peer_b)
            elif rank == peer_b:
                dist.recv(buf, peer_a)
                dist.send(buf, peer_a)

        dist.barrier()
        t = time_collective(ping, device, min_time_s, None) / 2
        out.append([float(buf.numel() * 4), t, buf.numel() * 4 / t])
    return out


def _rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run(quick: bool) -> dict[str, Any]:
    """All benchmarks; the returned dict is complete on rank 0."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nnodes = world // local_world
    min_t = 0.05 if quick else 0.25
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        memory = {"total_bytes": float(total), "reserved_bytes": float(total - free)}
        gemm_sizes = [512, 1024, 2048, 4096, 8192] if not quick else [512, 2048]
        dtypes = [torch.bfloat16, torch.float16, torch.float32]
        attn = dict(batch=2, heads=16, seq=4096 if not quick else 1024, head_dim=128,
                    dtype=torch.bfloat16)
        coll_sizes = [2**p for p in range(10, 31, 2)] if not quick else [2**10, 2**20, 2**26]
        copy_bytes = 2 * GIB
    else:
        with open("/proc/meminfo") as f:
            mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        memory = {"total_bytes": mem_kib * 1024.0 / local_world, "reserved_bytes": _rss_bytes()}
        gemm_sizes = [32, 64, 128, 256, 512, 1024, 2048] if not quick else [64, 256]
        dtypes = [torch.float32, torch.bfloat16]
        attn = dict(batch=1, heads=4, seq=512 if not quick else 128, head_dim=64,
                    dtype=torch.float32)
        coll_sizes = [2**p for p in range(10, 25, 2)] if not quick else [2**10, 2**16, 2**20]
        copy_bytes = 256 * 2**20 if not quick else 32 * 2**20
    result: dict[str, Any] = {
        "world_size": world, "nnodes": nnodes, "nproc_per_node": local_world,
        "backend": dist.get_backend(), "threads_per_rank": torch.get_num_threads(),
        "memory": memory, **environment(device),
    }
    # compute, all ranks at once; keep rank 0's numbers (ranks are alike on one node)
    dist.barrier()
    result["gemm"] = gemm_sweep(device, dtypes, gemm_sizes, min_t)
    result["attention"] = attention_rate(device, min_time_s=min_t, **attn)
    result["copy_bytes_per_s"] = copy_bandwidth(device, copy_bytes, min_t)
    dist.barrier()
    # collectives inside a node (the node of rank 0), then over the whole world if it spans nodes
    node_groups = [dist.new_group(list(range(i * local_world, (i + 1) * local_world)))
                   for i in range(nnodes)]
    my_node = node_groups[rank // local_world]
    if local_world > 1:
        result["intra_node"] = collective_sweep(device, coll_sizes, my_node, min_t)
        result["intra_node_send_recv"] = send_recv_sweep(device, coll_sizes, 0, 1, min_t)
    if nnodes > 1:
        result["inter_node"] = collective_sweep(device, coll_sizes, None, min_t)
        result["inter_node_send_recv"] = send_recv_sweep(device, coll_sizes, 0, local_world,
                                                         min_t)
    result["hostname"] = socket.gethostname()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="planner profile micro-benchmarks (torchrun)")
    parser.add_argument("--out", required=True, help="raw results JSON (written by rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings")
    ns = parser.parse_args(argv)
    threads = os.environ.get("PLANNER_THREADS")
    if threads and not torch.cuda.is_available():
        torch.set_num_threads(int(threads))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    try:
        result = run(ns.quick)
        if dist.get_rank() == 0:
            from planner.io import write_text_atomic

            write_text_atomic(ns.out, json.dumps(result, indent=1))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Micro-benchmarks of `planner profile`, run under torchrun on every process of the node(s):
GEMM sweeps over sizes and dtypes, fused attention, memory copy bandwidth, and all-reduce,
all-gather, reduce-scatter and send/recv sweeps over message sizes (on the node's ranks, and
across nodes when there are several). Rank 0 writes the raw numbers as JSON; profile.py turns
them into a GpuProfile.

    python -m torch.distributed.run --nproc-per-node 2 -m planner.validate.bench --out RAW.json

Every rank runs the compute benchmarks at the same time, as ranks do in training (on CPUs they
share the cores, each with cores/nproc threads, as `planner validate` runs them). The sweeps
are budgeted by the device (Budget): a size sweep stops after the first point past its time,
and a CPU dtype without native units is skipped; the raw numbers say what was left out and why.
Rank 0 reports its phases to the launcher's progress bar ($PLANNER_PROGRESS_FILE)."""

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
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.interrupts import exit_with_launcher
from planner.progress import report_phase

from .records import environment

GIB = 2**30


@dataclass(frozen=True)
class Budget:
    """Seconds the sweeps may spend on this device: every point repeats for at least
    `min_time_s` (its fastest call is kept, at most `point_s` of repeats); a sweep over sizes
    stops after the first point that took longer than `point_s` (the next, larger one would
    take longer still) or once the sweep has taken `sweep_s` in all."""

    min_time_s: float
    point_s: float
    sweep_s: float


# Chosen so that `planner profile --nproc 2` ends within 120 s (--quick: 30 s) on a 2-core CPU
# host shared with other work, torchrun's start included (docs/validate.md has the times), and
# so that a GPU still reaches the sizes where its GEMMs and collectives plateau (8192^3, 1 GiB:
# a few ms to a few hundred ms each on an H100).
BUDGETS = {
    ("cpu", False): Budget(min_time_s=0.2, point_s=1.5, sweep_s=10.0),
    ("cpu", True): Budget(min_time_s=0.05, point_s=0.4, sweep_s=2.0),
    ("cuda", False): Budget(min_time_s=0.25, point_s=3.0, sweep_s=30.0),
    ("cuda", True): Budget(min_time_s=0.05, point_s=1.0, sweep_s=8.0),
}
# A CPU dtype whose small GEMM runs at less than this fraction of fp32's rate is emulated (no
# bf16 units such as AVX512_BF16 or AMX on x86): its sweep is skipped and the profile says so.
SLOW_DTYPE_RATIO = 0.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, min_time_s: float,
              min_iters: int = 3, max_time_s: float | None = None) -> float:
    """Fastest seconds of one call (one warm-up call first), repeating for at least min_time_s:
    what the hardware can do (MAMF-style), not what a busy neighbour left of it. Repeats end
    after max_time_s (one timed call at least) even short of min_iters."""
    start = time.perf_counter()
    fn()
    _sync(device)
    times: list[float] = []
    while len(times) < min_iters or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000 or (max_time_s is not None
                                  and time.perf_counter() - start > max_time_s):
            break
    return min(times)


class Phases:
    """The benchmark's units of work (a GEMM size, a message size, ...), reported to the
    launcher's progress bar by (local) rank 0."""

    def __init__(self, total: int, rank: int) -> None:
        self.total, self.done, self.rank = total, 0, rank

    def tick(self, text: str, units: int = 1) -> None:
        """`units` more are done; `text` says what runs now."""
        self.done = min(self.total, self.done + units)
        if self.rank == 0:
            report_phase(self.done, self.total, text)


def _tick(phases: Phases | None, text: str, units: int = 1) -> None:
    if phases is not None:
        phases.tick(text, units)


def square_gemm_rate(device: torch.device, dtype: torch.dtype, n: int, budget: Budget) -> float:
    """FLOP/s of one n x n x n torch.mm in `dtype` (2 n^3 FLOP, fastest call)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = time_call(lambda: torch.mm(a, b), device, budget.min_time_s, 3, budget.point_s)
    return 2.0 * n**3 / t


def slow_dtypes(device: torch.device, dtypes: list[torch.dtype], budget: Budget,
                n: int = 256) -> dict[str, str]:
    """dtype name -> why its sweep is skipped, for the CPU dtypes whose n^3 GEMM runs at less
    than SLOW_DTYPE_RATIO of fp32's rate here. GPUs run every dtype."""
    if device.type != "cpu" or torch.float32 not in dtypes or len(dtypes) < 2:
        return {}
    probe = Budget(min_time_s=min(0.1, budget.min_time_s), point_s=budget.point_s,
                   sweep_s=budget.sweep_s)
    fp32 = square_gemm_rate(device, torch.float32, n, probe)
    out = {}
    for dtype in dtypes:
        if dtype == torch.float32:
            continue
        rate = square_gemm_rate(device, dtype, n, probe)
        if rate < SLOW_DTYPE_RATIO * fp32:
            out[str(dtype).removeprefix("torch.")] = (
                f"skipped: a {n}^3 GEMM ran at {rate / 1e9:.3g} GFLOP/s, {rate / fp32:.2f}x "
                f"fp32's {fp32 / 1e9:.3g} GFLOP/s (below {SLOW_DTYPE_RATIO}x: no native units "
                "for it on this CPU)")
    return out


def _stop_reason(point_s: float, sweep_s: float, budget: Budget) -> str | None:
    """Why a sweep stops after a point that took point_s, the sweep sweep_s so far (or None)."""
    if point_s > budget.point_s:
        return f"the point took {point_s:.2f} s > {budget.point_s:g} s"
    if sweep_s > budget.sweep_s:
        return f"the sweep took {sweep_s:.1f} s > {budget.sweep_s:g} s"
    return None


def gemm_sweep(device: torch.device, dtypes: list[torch.dtype], sizes: list[int],
               budget: Budget, phases: Phases | None = None
               ) -> tuple[dict[str, list[list[float]]], list[str]]:
    """dtype -> [(FLOP of one square GEMM = 2 n^3, FLOP/s achieved)], sizes ascending until
    the budget stops the sweep; and one line for each sweep that stopped early."""
    out: dict[str, list[list[float]]] = {}
    stopped: list[str] = []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        points: list[list[float]] = []
        sweep_start = time.perf_counter()
        for i, n in enumerate(sizes):
            _tick(phases, f"GEMM {name} {n}^3", units=0)
            t0 = time.perf_counter()
            points.append([2.0 * n**3, square_gemm_rate(device, dtype, n, budget)])
            now = time.perf_counter()
            _tick(phases, f"GEMM {name} {n}^3")
            rest = sizes[i + 1:]
            why = _stop_reason(now - t0, now - sweep_start, budget)
            if rest and why:
                stopped.append(f"GEMM {name}: stopped after {n}^3 ({why}); not measured: "
                               + ", ".join(f"{m}^3" for m in rest))
                _tick(phases, f"GEMM {name}: budget reached", units=len(rest))
                break
        out[name] = points
    return out, stopped


def attention_rate(device: torch.device, dtype: torch.dtype, batch: int, heads: int, seq: int,
                   head_dim: int, budget: Budget) -> dict[str, float]:
    """Causal SDPA forward + backward, FLOP/s counted as the planner counts model FLOPs:
    forward 4 b h s^2 d / 2 (causal half), backward twice the forward."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype,
                           requires_grad=True) for _ in range(3))

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()

    t = time_call(step, device, budget.min_time_s, 3, budget.point_s)
    flop = 3 * 4.0 * batch * heads * seq**2 * head_dim / 2
    return {"flop": flop, "flop_per_s": flop / t, "batch": batch, "heads": heads, "seq": seq,
            "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch.")}


def copy_bandwidth(device: torch.device, nbytes: int, budget: Budget) -> float:
    """Bytes/s of a large tensor copy, counting the read and the write (STREAM Copy)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, budget.min_time_s, 3, budget.point_s)
    return 2.0 * nbytes / t


def time_collective(fn: Callable[[], Any], device: torch.device, min_time_s: float,
                    group: dist.ProcessGroup | None) -> tuple[float, int]:
    """(median seconds of one call of a communication op, the slowest rank's; the repeat
    count). The ranks agree on the repeat count first (each deciding alone would leave one
    waiting for a call that never comes), so both values are the same on every rank."""
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
    return _slowest(statistics.median(times), device, group), int(count.item())


def _slowest(seconds: float, device: torch.device, group: dist.ProcessGroup | None) -> float:
    buf = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
    return float(buf.item())


def collective_sweep(device: torch.device, sizes: list[int], group: dist.ProcessGroup | None,
                     budget: Budget, phases: Phases | None = None, label: str = ""
                     ) -> tuple[dict[str, list[list[float]]], list[str]]:
    """op -> [(message bytes S, seconds, busbw bytes/s)] on `group`, nccl-tests conventions:
    all-reduce busbw = 2 S (n-1)/n / t; all-gather and reduce-scatter (S = the full buffer)
    busbw = S (n-1)/n / t. Time = the slowest rank's median. The sweep stops on every rank
    alike: its clock is the agreed time x repeat count of each call."""
    n = dist.get_world_size(group)
    out: dict[str, list[list[float]]] = {"all_reduce": [], "all_gather": [], "reduce_scatter": []}
    stopped: list[str] = []
    swept = 0.0
    for i, size in enumerate(sizes):
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
        _tick(phases, f"{label}collectives {_bytes(nbytes)}", units=0)
        point = 0.0
        for name, (fn, factor) in ops.items():
            try:
                dist.barrier(group=group)
                t, count = time_collective(fn, device, budget.min_time_s, group)
            except (RuntimeError, NotImplementedError):  # e.g. an op the backend lacks
                continue
            point += t * (count + 2)
            out[name].append([float(nbytes), t, factor * nbytes * (n - 1) / n / t])
        swept += point
        _tick(phases, f"{label}collectives {_bytes(nbytes)}")
        rest = sizes[i + 1:]
        why = _stop_reason(point, swept, budget)
        if rest and why:
            stopped.append(f"{label}collectives: stopped after {_bytes(nbytes)} ({why}); not "
                           "measured: " + ", ".join(_bytes(m) for m in rest))
            _tick(phases, f"{label}collectives: budget reached", units=len(rest))
            break
    return out, stopped


def send_recv_sweep(device: torch.device, sizes: list[int], peer_a: int, peer_b: int,
                    budget: Budget, phases: Phases | None = None, label: str = ""
                    ) -> tuple[list[list[float]], list[str]]:
    """[(bytes, one-way seconds, bytes/s)] of a ping-pong between two ranks (half the round
    trip). Every rank calls it; only the two peers communicate. Budgeted as collective_sweep."""
    rank = dist.get_rank()
    out, stopped, swept = [], [], 0.0
    for i, size in enumerate(sizes):
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)

        def ping(buf: torch.Tensor = buf) -> None:
            if rank == peer_a:
                dist.send(buf, peer_b)
                dist.recv(buf, peer_b)
            elif rank == peer_b:
                dist.recv(buf, peer_a)
                dist.send(buf, peer_a)

        _tick(phases, f"{label}send/recv {_bytes(buf.numel() * 4)}", units=0)
        dist.barrier()
        round_trip, count = time_collective(ping, device, budget.min_time_s, None)
        t = round_trip / 2
        out.append([float(buf.numel() * 4), t, buf.numel() * 4 / t])
        point = round_trip * (count + 2)
        swept += point
        _tick(phases, f"{label}send/recv {_bytes(buf.numel() * 4)}")
        rest = sizes[i + 1:]
        why = _stop_reason(point, swept, budget)
        if rest and why:
            stopped.append(f"{label}send/recv: stopped after {_bytes(buf.numel() * 4)} ({why}); "
                           "not measured: " + ", ".join(_bytes(m) for m in rest))
            _tick(phases, f"{label}send/recv: budget reached", units=len(rest))
            break
    return out, stopped


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def _rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run(quick: bool) -> dict[str, Any]:
    """All benchmarks; the returned dict is complete on rank 0."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nnodes = world // local_world
    budget = BUDGETS[(device.type, quick)]
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        memory = {"total_bytes": float(total), "reserved_bytes": float(total - free)}
        gemm_sizes = [512, 1024, 2048, 4096, 8192] if not quick else [512, 2048]
        dtypes = [torch.bfloat16, torch.float16, torch.float32] if not quick else [torch.bfloat16]
        attn = dict(batch=2, heads=16, seq=4096 if not quick else 1024, head_dim=128,
                    dtype=torch.bfloat16)
        coll_sizes = [2**p for p in range(10, 31, 2)] if not quick else [2**10, 2**20, 2**26]
        copy_bytes = 2 * GIB
    else:
        with open("/proc/meminfo") as f:
            mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        memory = {"total_bytes": mem_kib * 1024.0 / local_world, "reserved_bytes": _rss_bytes()}
        gemm_sizes = [32, 64, 128, 256, 512, 1024, 2048] if not quick else [64, 256]
        # --quick measures only the dtype CPU runs compute in (validate: fp32 on CPUs)
        dtypes = [torch.float32, torch.bfloat16] if not quick else [torch.float32]
        attn = dict(batch=1, heads=4, seq=512 if not quick else 128, head_dim=64,
                    dtype=torch.float32)
        coll_sizes = [2**p for p in range(10, 25, 2)] if not quick else [2**10, 2**16, 2**20]
        copy_bytes = 256 * 2**20 if not quick else 32 * 2**20
    result: dict[str, Any] = {
        "world_size": world, "nnodes": nnodes, "nproc_per_node": local_world,
        "backend": dist.get_backend(), "threads_per_rank": torch.get_num_threads(),
        "memory": memory, "quick": quick, "budget": asdict(budget), **environment(device),
    }
    comm_sweeps = (2 if local_world > 1 else 0) + (2 if nnodes > 1 else 0)
    # each node's launcher follows its own local rank 0
    phases = Phases(len(dtypes) * len(gemm_sizes) + 2 + comm_sweeps * len(coll_sizes),
                    int(os.environ.get("LOCAL_RANK", rank)))
    # compute, all ranks at once; keep rank 0's numbers (ranks are alike on one node)
    dist.barrier()
    phases.tick("GEMM: which dtypes run natively", units=0)
    skipped = slow_dtypes(device, dtypes, budget)
    for name in skipped:
        phases.tick(f"GEMM {name} skipped", units=len(gemm_sizes))
    result["gemm"], stopped = gemm_sweep(
        device, [d for d in dtypes if str(d).removeprefix("torch.") not in skipped], gemm_sizes,
        budget, phases)
    result["gemm_skipped"] = skipped
    phases.tick("attention (SDPA fwd+bwd)", units=0)
    result["attention"] = attention_rate(device, budget=budget, **attn)
    phases.tick("copy bandwidth")
    result["copy_bytes_per_s"] = copy_bandwidth(device, copy_bytes, budget)
    phases.tick("collectives")
    dist.barrier()
    # collectives inside a node (the node of rank 0), then over the whole world if it spans nodes
    node_groups = [dist.new_group(list(range(i * local_world, (i + 1) * local_world)))
                   for i in range(nnodes)]
    my_node = node_groups[rank // local_world]
    if local_world > 1:
        result["intra_node"], more = collective_sweep(device, coll_sizes, my_node, budget,
                                                      phases)
        stopped += more
        result["intra_node_send_recv"], more = send_recv_sweep(device, coll_sizes, 0, 1, budget,
                                                               phases)
        stopped += more
    if nnodes > 1:
        result["inter_node"], more = collective_sweep(device, coll_sizes, None, budget, phases,
                                                      "inter-node ")
        stopped += more
        result["inter_node_send_recv"], more = send_recv_sweep(
            device, coll_sizes, 0, local_world, budget, phases, "inter-node ")
        stopped += more
    result["sweeps_stopped"] = stopped
    result["hostname"] = socket.gethostname()
    phases.tick("writing the raw numbers", units=phases.total)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="planner profile micro-benchmarks (torchrun)")
    parser.add_argument("--out", required=True, help="raw results JSON (written by rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings")
    ns = parser.parse_args(argv)
    exit_with_launcher()  # the planner killed outright: end, do not measure on to the end
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

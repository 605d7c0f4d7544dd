"""The cost model on a cluster of several GPU pools (specs.PooledCluster): each pipeline stage on
one pool, evaluated with that pool's GPU profile and network.

Placement (what a plan fixes): the layout's tp, cp and dp are the same in every pool, so the pool
j holding p_j stages uses p_j x tp x cp x dp GPUs (all of them: p_j = GPUs_j / (tp cp dp)); the
pools hold consecutive stages in `order` (one pool boundary per pair of pools, the pipeline
crossing the network there); the data-parallel replicas are alike. A stage's TP, CP, EP and DP
groups stay inside its pool (comm.Group on that pool's cluster). Terms:

- per micro-batch, each stage: compute and TP/CP/EP comm with its pool's GPU and fabric (the same
  per-stage functions as the homogeneous assembly, costmodel.batch);
- the slowest stage sets grad_accum x its time + the bubble (pipeline.bubble_time; with pools
  of different GPUs the equal-stage bound, one_gpu);
- pipeline sends: the slower pool's network for every hop (the pipeline moves at its slowest
  link; a send between pools crosses the network);
- DP traffic and the optimizer step: per pool on its stage with the most parameters, with its
  GPU; the pool that takes longest counts (the step ends when every stage has stepped);
- memory: every stage against its own pool's usable capacity; the reported GPU is the one with
  the least headroom, and the plan fits when every stage fits.
MFU counts each pool's GPUs at their own peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from planner.costmodel import comm, compute, memory, pipeline
from planner.costmodel.batch import (
    _gather_stages,
    _Knobs,
    _Picker,
    _stage_memory,
    _stage_times,
    dp_and_optimizer_time,
    layout_arrays,
)
from planner.layout import Layout
from planner.specs import GIB, JobSpec, ModelSpec, PooledCluster


def pool_stage_counts(pooled: PooledCluster, tp, cp, dp, order: Sequence[int]):
    """Stages each pool holds, in `order`, per layout: GPUs of the pool / (tp cp dp); an
    (N, pools) int array."""
    width = np.asarray(tp * cp * dp, dtype=np.int64)
    return np.stack([pooled.pools[j].num_gpus // width for j in order], axis=1)


def stage_pool_index(pooled: PooledCluster, tp, cp, dp, order: Sequence[int],
                     stage_index: np.ndarray) -> np.ndarray:
    """Pool (index into pooled.pools) of each stage ((N, C) stage indices)."""
    counts = pool_stage_counts(pooled, tp, cp, dp, order)
    bounds = np.cumsum(counts, axis=1)  # (N, pools)
    pos = (stage_index[:, :, None] >= bounds[:, None, :]).sum(axis=2)  # position in order
    return np.asarray(order, dtype=np.int64)[np.minimum(pos, len(order) - 1)]


def one_gpu(pooled: PooledCluster) -> bool:
    """Whether every pool has the same GPU profile. Then the sum of the stage times is the same
    for every split and the bubble is pipeline.bubble_time's; with different GPUs a split that
    ties on the slowest stage may differ in that sum, and the split search (which minimizes the
    slowest stage) keeps the equal-stage bubble, (pp - 1) x the slowest: an upper bound."""
    labels = {"name", "aliases", "description", "sources", "provenance"}  # not performance
    first = pooled.pools[0].gpu.model_dump(exclude=labels)
    return all(p.gpu.model_dump(exclude=labels) == first for p in pooled.pools[1:])


def estimate_pooled_batch(
    model: ModelSpec,
    pooled: PooledCluster,
    job: JobSpec,
    layouts: Sequence[Layout] | Mapping[str, Any],
    order: Sequence[int],
) -> dict[str, np.ndarray]:
    """Plan columns for each layout (explicit stage_layers, vpp 1) with its stages on the pools
    in `order` (module docstring), plus per-stage arrays (layouts, stages): stage_time_s (per
    micro-batch), stage_mem_gb, stage_pool (index into pooled.pools; -1 past the layout's pp)."""
    lo = layout_arrays(layouts)
    n_layouts = len(lo["tp"])
    x = _Knobs.of(lo, job, model)
    st = _gather_stages(model, lo["pp"], lo["vpp"], lo.get("stage_layers"), prune=False)
    pool = stage_pool_index(pooled, lo["tp"], lo["cp"], lo["dp"], order, st["index"].astype(int))
    width = st["index"].shape[1]
    real = np.arange(width)[None, :] < x.pp[:, None]  # every stage, in order; then padding
    parts = []
    for j, cl in enumerate(pooled.pools):
        t = _stage_times(model, cl, job, x, st)
        parts.append((j, cl, t, _stage_memory(model, cl, job, x, st, t)))

    def per_stage(get) -> np.ndarray:
        out = np.zeros(st["index"].shape)
        for j, _, t, mem in parts:
            out = np.where(pool == j, get(t, mem), out)
        return out

    stage_mb = per_stage(lambda t, mem: t.total)
    comp = per_stage(lambda t, mem: t.compute.total)
    tp_mb = per_stage(lambda t, mem: t.tp)
    cp_mb = per_stage(lambda t, mem: t.cp)
    ep_mb = per_stage(lambda t, mem: t.ep)
    mem_total = per_stage(lambda t, mem: mem.total)
    cap = np.select([pool == j for j in range(len(pooled.pools))],
                    [p.gpu.usable_memory_gib for p in pooled.pools])
    hbm = np.select([pool == j for j in range(len(pooled.pools))],
                    [p.gpu.memory_gib for p in pooled.pools])
    at = _Picker(stage_mb.shape)
    m = x.m
    slow = np.argmax(np.where(real, stage_mb, -np.inf), axis=1)
    slow_mb = at(stage_mb, slow)
    time_compute = m * at(comp, slow)
    time_tp, time_cp, time_ep = m * at(tp_mb, slow), m * at(cp_mb, slow), m * at(ep_mb, slow)
    if one_gpu(pooled):  # every stage of the pipeline once
        whole = np.where(real, stage_mb, 0.0).sum(axis=1)
    else:  # the split's sum is not fixed across pools: the equal-stage bound (an upper bound)
        whole = slow_mb * x.pp
    bubble = pipeline.bubble_time(x.pp, x.vpp, m, slow_mb, whole)
    crosses = np.ones(n_layouts, dtype=bool)  # a pool boundary is a network hop
    time_pp = np.max([comm.pp_p2p_time(cl, model, x.tokens, x.tp, x.pp, x.dp, x.cp, x.vpp, x.sp,
                                       m, slow_mb, job.p2p_overlap, crosses)
                      for cl in pooled.pools], axis=0)

    # DP and optimizer per pool on its heaviest stage; the slowest pool counts
    dp_opt = []
    for j, cl, t, mem in parts:
        state = mem.state
        params = np.where((pool == j) & real, state.p_dense + state.p_expert, -1.0)
        heavy = np.argmax(params, axis=1)
        present = at(params, heavy) >= 0
        t_dp, t_opt = dp_and_optimizer_time(model, cl, job, x, t, state, heavy, at)
        dp_opt.append((np.where(present, t_dp, 0.0), np.where(present, t_opt, 0.0)))
    sums = np.stack([d + o for d, o in dp_opt], axis=1)
    worst = np.argmax(sums, axis=1)
    rows = np.arange(n_layouts)
    time_dp = np.stack([d for d, _ in dp_opt], axis=1)[rows, worst]
    time_opt = np.stack([o for _, o in dp_opt], axis=1)[rows, worst]

    headroom = np.where(real, cap - mem_total / GIB, np.inf)
    peak_stage = np.argmin(headroom, axis=1)
    peak_mem = at(mem_total, peak_stage) / GIB
    capacity = at(cap, peak_stage)

    def mem_part(name: str) -> np.ndarray:
        get = {
            "weights": lambda t, mem: mem.state.weights,
            "grads": lambda t, mem: mem.state.grads,
            "optimizer": lambda t, mem: mem.state.optimizer,
            "activations": lambda t, mem: mem.activations,
            "other": lambda t, mem: mem.other,
        }[name]
        return at(per_stage(get), peak_stage) / GIB

    step = time_compute + time_tp + time_cp + time_ep + bubble + time_pp + time_dp + time_opt
    s, batch = job.seq_len, job.global_batch
    tokens_step = float(s * batch)
    n_gpus = float(pooled.num_gpus)
    model_flops = compute.model_flops_per_step(model, s, batch)
    hw_flops = model_flops + compute.recompute_flops_per_step(model, s, batch, x.rc)
    peak = sum(p.num_gpus * p.gpu.peak_flops(job.precision) for p in pooled.pools)
    rel = max(p.gpu.step_time_rel_error or 0.0 for p in pooled.pools)
    flight = per_stage(lambda t, mem: mem.flight)
    return {
        "grad_accum": m.astype(np.int64),
        "global_batch": np.full(n_layouts, batch, dtype=np.int64),
        "seq_len": np.full(n_layouts, s, dtype=np.int64),
        "step_time_s": step,
        "tokens_per_s": tokens_step / step,
        "tokens_per_s_per_gpu": tokens_step / step / n_gpus,
        "model_tflops_per_gpu": model_flops / step / n_gpus / 1e12,
        "hw_tflops_per_gpu": hw_flops / step / n_gpus / 1e12,
        "mfu": model_flops / (step * peak),
        "hfu": hw_flops / (step * peak),
        "peak_mem_gb": peak_mem,
        "mem_capacity_gb": capacity,
        "fits": headroom.min(axis=1) >= 0,
        "time_compute_s": time_compute,
        "time_tp_comm_s": time_tp,
        "time_cp_comm_s": time_cp,
        "time_ep_comm_s": time_ep,
        "time_pp_comm_s": time_pp,
        "time_pp_bubble_s": bubble,
        "time_dp_comm_exposed_s": time_dp,
        "time_optimizer_s": time_opt,
        "mem_weights_gb": mem_part("weights"),
        "mem_grads_gb": mem_part("grads"),
        "mem_optimizer_gb": mem_part("optimizer"),
        "mem_activations_gb": mem_part("activations"),
        "mem_other_gb": mem_part("other"),
        "step_time_low_s": step * (1 - rel),
        "step_time_high_s": step * (1 + rel),
        "device_mem_gb": memory.device_memory_gib(
            peak_mem, mem_part("activations"), at(hbm, peak_stage), x.tp, x.pp, x.dp, x.cp, x.ep),
        "peak_stage": at(st["index"], peak_stage).astype(np.int64),
        "slow_stage": at(st["index"], slow).astype(np.int64),
        "in_flight": at(flight, peak_stage),
        "model_flops": np.full(n_layouts, model_flops),
        "hw_flops": hw_flops,
        "stage_time_s": np.where(real, stage_mb, np.nan),
        "stage_mem_gb": np.where(real, mem_total / GIB, np.nan),
        "stage_pool": np.where(real, pool, -1),
    }


def estimate_pooled(model: ModelSpec, pooled: PooledCluster, job: JobSpec, layout: Layout,
                    order: Sequence[int] | None = None) -> tuple[Layout, Any]:
    """One layout on the pools (in the cluster's order unless `order`): (the layout naming each
    stage's layers and GPU, its Estimate); LayoutError when it cannot be placed."""
    from dataclasses import replace

    from planner.costmodel import Estimate
    from planner.costmodel.checks import layout_violations
    from planner.errors import LayoutError

    order = tuple(range(len(pooled.pools))) if order is None else tuple(order)
    width = layout.tp * layout.cp * layout.dp
    bad = [p for p in pooled.pools if p.num_gpus % width]
    if layout.num_gpus != pooled.num_gpus or bad:
        raise LayoutError(f"layout {layout}: tp*cp*dp = {width} must divide every pool's GPUs "
                          f"({', '.join(str(p.num_gpus) for p in pooled.pools)}) and "
                          f"tp*pp*dp*cp must be {pooled.num_gpus}")
    if layout.vpp != 1:
        raise LayoutError("interleaving (vpp > 1) is not modelled on a cluster of pools")
    counts = layout.stage_layers or tuple(
        pipeline.stage_layer_counts(model.num_hidden_layers, layout.pp))
    names = [pooled.pools[j].gpu.name for j in order
             for _ in range(pooled.pools[j].num_gpus // width)]
    placed = replace(layout, stage_layers=tuple(counts), stage_gpu=tuple(names))
    for j in order:  # structural checks against each pool (tp within its NVLink domain, ...)
        sub = replace(placed, pp=1, dp=layout.dp, stage_layers=(), stage_gpu=())
        problems = [v for v in layout_violations(model, pooled.pools[j], job, sub)
                    if not v.startswith("tp*pp*dp*cp")]
        if problems:
            raise LayoutError(f"layout {layout} on {pooled.pools[j]}: " + "; ".join(problems))
    from planner.costmodel.checks import stage_layers_violations

    problems = stage_layers_violations(model.num_hidden_layers, placed)
    if problems:
        raise LayoutError(f"layout {placed} is invalid: " + "; ".join(problems))
    cols = estimate_pooled_batch(model, pooled, job, [placed], order)
    return placed, Estimate.from_batch(cols, 0)

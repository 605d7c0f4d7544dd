"""The cost model on a cluster of several GPU pools (specs.PooledCluster): each pipeline stage on
one pool, evaluated with that pool's GPU profile and network. The columns are assembled by the
one assembly of every cluster (costmodel.batch._assemble, a homogeneous cluster being one pool);
this module keeps the placement: which pool holds which stage.

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
  the least headroom, and the plan fits when every stage fits;
- the step-time band: the slowest stage's profile's (calibrated, else the stock error).
MFU counts each pool's GPUs at their own peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from planner.costmodel import pipeline
from planner.costmodel.batch import (
    _assemble,
    _gather_stages,
    _Knobs,
    _stage_memory,
    _stage_times,
    layout_arrays,
    round_period,
)
from planner.layout import Layout
from planner.specs import JobSpec, ModelSpec, PooledCluster


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


def pool_order(pooled: PooledCluster, layouts: Sequence[Layout] | Mapping[str, Any]
               ) -> tuple[int, ...]:
    """The order of the pools along the pipeline that the layouts' stage_gpu names (each pool's
    GPU first appears where its stages begin); the cluster's order when they name none."""
    first = next(iter(layouts), None) if not isinstance(layouts, Mapping) else None
    names = list(getattr(first, "stage_gpu", ()) or ())
    index = {p.gpu.name: j for j, p in enumerate(pooled.pools)}
    order = [index[n] for i, n in enumerate(names) if n in index and n not in names[:i]]
    return tuple(order) if len(order) == len(pooled.pools) else tuple(range(len(pooled.pools)))


def estimate_pooled_batch(
    model: ModelSpec,
    pooled: PooledCluster,
    job: JobSpec,
    layouts: Sequence[Layout] | Mapping[str, Any],
    order: Sequence[int],
    all_stages: bool = False,
) -> dict[str, np.ndarray]:
    """Plan columns for each layout (explicit stage_layers, vpp 1) with its stages on the pools
    in `order` (module docstring), plus per-stage arrays (layouts, stages): stage_time_s (per
    micro-batch), stage_mem_gb, stage_pool (index into pooled.pools; -1 past the layout's pp)."""
    lo = layout_arrays(layouts)
    x = _Knobs.of(lo, job, model)
    st = _gather_stages(model, lo["pp"], lo["vpp"], lo.get("stage_layers"), prune=False)
    pool = stage_pool_index(pooled, lo["tp"], lo["cp"], lo["dp"], order, st["index"].astype(int))
    width = st["index"].shape[1]
    real = np.arange(width)[None, :] < x.pp[:, None]  # every stage, in order; then padding
    parts = []
    for cl in pooled.pools:
        t = _stage_times(model, cl, job, x, st)
        parts.append((t, _stage_memory(model, cl, job, x, st, t)))
    # interleaved rounds (batch.round_period) on pools of one GPU profile; pools of several
    # keep the stage form (their chunks' times differ by pool)
    period = round_period(model, pooled.pools[0], job, x, lo) if one_gpu(pooled) else None
    return _assemble(model, pooled.pools, job, x, st, parts, pool, real, one_gpu(pooled),
                     all_stages, period=period)


def estimate_pooled(model: ModelSpec, pooled: PooledCluster, job: JobSpec, layout: Layout,
                    order: Sequence[int] | None = None) -> tuple[Layout, dict[str, np.ndarray]]:
    """One layout on the pools (in the cluster's order unless `order`): (the layout naming each
    stage's layers and GPU, its plan columns: costmodel.Estimate.from_batch(columns, 0));
    LayoutError when it cannot be placed."""
    from dataclasses import replace

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
    return placed, cols

"""The analytical cost model: memory of the most loaded GPU and time per optimizer step of one
layout, term by term (the plan columns of docs/contract.md).

    estimate(model, cluster, job, layout) -> Estimate          one layout, checked
    estimate_placed(model, cluster, job, layout)                 ... with its stages written out
                                                                 (on any cluster, pools too)
    estimate_batch(model, cluster, job, layouts) -> dict        many layouts, numpy columns
    layout_violations(model, cluster, job, layout) -> list[str] structural problems

estimate() is estimate_batch() on one layout, so the two agree exactly. Modules: memory.py
(weights/grads/optimizer per ZeRO stage, activations), compute.py (GEMM/attention/element-wise
time, FLOPs), comm.py (collectives on the profile's busbw curves), pipeline.py (stages, in-flight
micro-batches, bubble), checks.py (layout checks), batch.py (assembly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from planner.costmodel import batch
from planner.costmodel.checks import layout_violations
from planner.errors import LayoutError
from planner.layout import Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec, PooledCluster

__all__ = ["Estimate", "estimate", "estimate_batch", "estimate_placed", "layout_violations",
           "memory_status"]


@dataclass(frozen=True)
class Estimate:
    """Prediction for one layout: the non-layout plan columns (seconds per optimizer step, GiB,
    TFLOP/s per GPU, fractions of peak), the step-time band and, when it does not fit, why."""

    grad_accum: int
    global_batch: int
    seq_len: int
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_mem_gb: float
    mem_capacity_gb: float
    fits: bool
    time_compute_s: float
    time_tp_comm_s: float
    time_cp_comm_s: float
    time_ep_comm_s: float
    time_pp_comm_s: float
    time_pp_bubble_s: float
    time_dp_comm_exposed_s: float
    time_optimizer_s: float
    mem_weights_gb: float
    mem_grads_gb: float
    mem_optimizer_gb: float
    mem_activations_gb: float
    mem_other_gb: float
    step_time_low_s: float
    step_time_high_s: float
    peak_stage: int = 0  # pipeline stage of the most loaded GPU
    in_flight: float = 1.0  # micro-batches of activations held there (stage-equivalents)
    overflow: list[str] = field(default_factory=list)
    # per pipeline stage on a cluster of pools (empty otherwise): seconds per micro-batch, GiB
    stage_time_s: tuple[float, ...] = ()
    stage_mem_gb: tuple[float, ...] = ()
    # what the device shows (nvidia-smi) at the peak, GiB: peak_mem_gb (what PyTorch
    # allocates) + the caching allocator's reserve + CUDA context + NCCL buffers
    # (memory.device_memory_gib); NaN when a cost function does not give it
    device_mem_gb: float = float("nan")
    # relative 1-sigma error between layouts of one job (the tie rule's band; fraction):
    # GpuProfile.ranking_band; NaN when a cost function does not give it
    ranking_band: float = float("nan")

    def columns(self) -> dict[str, Any]:
        """The plan columns this estimate owns (plus the step-time band and, on pools, the
        per-stage time and memory), for Plan.row()."""
        skip = {"peak_stage", "in_flight", "overflow"}
        out = {k: v for k, v in asdict(self).items() if k not in skip}
        for name in ("stage_time_s", "stage_mem_gb"):
            if out[name]:
                out[name] = list(out[name])
            else:
                del out[name]
        return out

    @classmethod
    def from_batch(cls, cols: Mapping[str, np.ndarray], i: int = 0) -> Estimate:
        """Row i of estimate_batch's columns."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("overflow", "stage_time_s", "stage_mem_gb"):
                continue
            if f.name in ("device_mem_gb", "ranking_band") and f.name not in cols:
                continue  # a cost function without it (tests' stand-ins)
            v = cols[f.name][i]
            if f.type in ("int", int):
                values[f.name] = int(v)
            elif f.type in ("bool", bool):
                values[f.name] = bool(v)
            else:
                values[f.name] = float(v)
        if "stage_pool" in cols:  # a cluster of pools: the per-stage columns
            real = np.asarray(cols["stage_pool"][i]) >= 0
            values["stage_time_s"] = tuple(float(v) for v in cols["stage_time_s"][i][real])
            values["stage_mem_gb"] = tuple(float(v) for v in cols["stage_mem_gb"][i][real])
        est = cls(**values)
        return est if est.fits else cls(**values, overflow=overflow_reasons(est))


def memory_status(est: Estimate) -> str:
    """'fits', 'does not fit', or 'may not fit: x GiB +- y' when the peak is within the memory
    band (1 sigma, memory.MEM_REL_ERROR) of the usable capacity, below it or above it: a
    layout measured runs so close to the line are known to run is not refused, and one a few
    percent under the line is not promised either (memory.near_capacity). The decision reads
    peak_mem_gb (what PyTorch allocates) against the capacity left after the CUDA context,
    NCCL buffers and allocator slack (GpuProfile.reserve_gib), never device_mem_gb: the
    caching allocator releases its cached blocks before it reports out of memory."""
    from planner.costmodel.memory import MEM_REL_ERROR, near_capacity

    band = MEM_REL_ERROR * est.peak_mem_gb
    if not near_capacity(est.peak_mem_gb, est.mem_capacity_gb):
        return "fits"
    if est.peak_mem_gb - band <= est.mem_capacity_gb:
        return (f"may not fit: {est.peak_mem_gb:.1f} GiB +- {band:.1f} (1 sigma) against "
                f"{est.mem_capacity_gb:.1f} usable")
    return "does not fit"


def overflow_reasons(est: Estimate) -> list[str]:
    """Readable lines: what overflows the usable memory and by how much."""
    over = est.peak_mem_gb - est.mem_capacity_gb
    state = est.mem_weights_gb + est.mem_grads_gb + est.mem_optimizer_gb
    lines = [
        f"peak {est.peak_mem_gb:.1f} GiB on pipeline stage {est.peak_stage} exceeds the usable "
        f"{est.mem_capacity_gb:.1f} GiB by {over:.1f} GiB ({memory_status(est)})",
        f"weights {est.mem_weights_gb:.1f} + grads {est.mem_grads_gb:.1f} + optimizer "
        f"{est.mem_optimizer_gb:.1f} + activations {est.mem_activations_gb:.1f} "
        f"({est.in_flight:g} micro-batches in flight) + other {est.mem_other_gb:.1f} GiB",
    ]
    if state > est.mem_capacity_gb:
        lines.append(
            f"model state alone ({state:.1f} GiB) exceeds the capacity: shard it more "
            "(higher tp or pp, or a higher zero stage)"
        )
    elif est.mem_activations_gb > over:
        lines.append("activations dominate: try recompute, a smaller mbs, sp, or more tp/cp")
    return lines


def estimate_batch(model: ModelSpec, cluster: ClusterSpec | PooledCluster, job: JobSpec,
                   layouts: Sequence[Layout] | Mapping[str, Any], all_stages: bool = False
                   ) -> dict[str, np.ndarray]:
    """Plan columns of many layouts (costmodel.batch.estimate_batch). On a cluster of pools the
    stages sit on the pools in the order the layouts' stage_gpu names them (the cluster's order
    without it; costmodel.pools)."""
    if isinstance(cluster, PooledCluster):
        from planner.costmodel.pools import estimate_pooled_batch, pool_order

        return estimate_pooled_batch(model, cluster, job, layouts, pool_order(cluster, layouts),
                                     all_stages)
    return batch.estimate_batch(model, cluster, job, layouts, all_stages)


def estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout) -> Estimate:
    """Predict one layout; LayoutError (all reasons) when it cannot run at all. A layout that
    does not fit in memory is still estimated (fits False, overflow says why)."""
    problems = layout_violations(model, cluster, job, layout)
    if problems:
        raise LayoutError(f"layout {layout} is invalid: " + "; ".join(problems))
    return Estimate.from_batch(estimate_batch(model, cluster, job, [layout]), 0)


def estimate_placed(model: ModelSpec, cluster: ClusterSpec | PooledCluster, job: JobSpec,
                    layout: Layout) -> tuple[Layout, Estimate]:
    """(the layout with its layers per stage written out, and on a cluster of pools each stage's
    GPU, stages on the pools in the order they are written; its Estimate). LayoutError when it
    cannot run or be placed. One entry for every cluster (estimate, explain by pins)."""
    from dataclasses import replace

    from planner.costmodel import pipeline

    if isinstance(cluster, PooledCluster):
        from planner.costmodel.pools import estimate_pooled

        placed, cols = estimate_pooled(model, cluster, job, layout)
        return placed, Estimate.from_batch(cols, 0)
    est = estimate(model, cluster, job, layout)
    if layout.virtual_split:  # layers per virtual stage: written out already
        return layout, est
    counts = pipeline.stage_counts(model.num_hidden_layers, layout.pp, layout.vpp,
                                   layout.stage_layers)
    return replace(layout, stage_layers=tuple(counts)), est


def estimate_many(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layouts: Sequence[Layout]
) -> list[Estimate]:
    """Estimate objects for many (valid) layouts through one estimate_batch call."""
    cols = estimate_batch(model, cluster, job, layouts)
    return [Estimate.from_batch(cols, i) for i in range(len(layouts))]

"""What a plan means for the training run: days, GPU-hours, cost, energy, checkpoints and
failures, and learning-rate advice for its global batch (the seeds' operational chapters).

    run = training_run(plan, model, cluster, RunInputs(train_tokens=15.6e12))
    run.columns()   -> train_days, gpu_hours, cost_usd, energy_mwh, checkpoint_gb,
                       checkpoint_interval_min (the plan columns, ../shared CONTRACT)
    lr_advice(ref_lr=3e-4, ref_batch=256, new_batch=2048, total_steps=100_000)

Conventions (stated once, used everywhere):
- train_days, gpu_hours, cost_usd and energy_mwh are the failure-free run: optimizer steps x the
  plan's predicted step time. The expected overhead of checkpoints and failures is reported
  beside them (RunCosts.failure_overhead), never folded in silently.
- checkpoint_gb is decimal GB (1e9 bytes), as storage is sold and as seed 001 ch. 7 counts it;
  plan memory columns stay GiB.
- MTBF is per node (--mtbf-hours); the cluster fails nodes / as often (independent failures).

Sources: seed 001 ("Workbook - Distributed Training") ch. 3 (LR scaling, warmup), ch. 7
(checkpoint size, write time, Young's interval, work lost per crash), ch. 9 (6ND, days, GPU
rental and electricity cost, PUE); Young 1974, "A first order approximation to the optimum
checkpoint interval", CACM 17(9); Dubey et al. 2024 (The Llama 3 Herd of Models,
arXiv:2407.21783) sec. 3.3.4 for the default node MTBF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.specs import ClusterSpec, ModelSpec

RUN_COLUMNS: tuple[str, ...] = (
    "train_days", "gpu_hours", "cost_usd", "energy_mwh", "checkpoint_gb",
    "checkpoint_interval_min",
)

# Mixed-precision Adam checkpoint: bf16/fp16 weights 2 + fp32 master 4 + Adam m 4 + v 4 bytes
# per parameter; gradients are not saved (seed 001 Ex 7.1: 70B -> 980 GB). FP8 training keeps
# the same master weights and optimizer state (Transformer Engine), so the same 14 bytes.
CHECKPOINT_BYTES_PER_PARAM = 14.0
# Aggregate write bandwidth of the job's checkpoint storage, GB/s: seed 001 ch. 7's NFS figure
# ("At 10 GB/s to NFS, that's 98 seconds"). A parallel file system with every rank writing its
# shard is faster; pass --storage-gb-per-s.
DEFAULT_STORAGE_GB_PER_S = 10.0
# Per-node MTBF, hours: Llama 3 405B pretraining saw 419 unexpected interruptions in a 54-day
# snapshot on 16,384 H100 in 2,048 nodes of 8 (Dubey et al. 2024 sec. 3.3.4, Table 5):
# cluster MTBF 54 x 24 / 419 = 3.09 h, per node x 2,048 = 6,335 h.
DEFAULT_NODE_MTBF_HOURS = 54 * 24 / 419 * 2048
# Rental price per GPU-hour, USD: seed 001 Ex 7.4 and 9.5 ("~$2/GPU-hr" for H100).
DEFAULT_GPU_HOUR_USD = 2.0
# Power usage effectiveness: seed 001 Ex 9.9 ("add ~40% for cooling, networking, storage ...
# PUE ~ 1.4").
DEFAULT_PUE = 1.4


@dataclass(frozen=True)
class RunInputs:
    """What the user says about the run: tokens to train on and the facility's numbers."""

    train_tokens: float  # tokens to train on
    gpu_hour_usd: float = DEFAULT_GPU_HOUR_USD  # USD per GPU-hour
    pue: float = DEFAULT_PUE  # facility energy / IT energy
    node_mtbf_hours: float = DEFAULT_NODE_MTBF_HOURS  # mean time between failures of one node, h
    storage_gb_per_s: float = DEFAULT_STORAGE_GB_PER_S  # aggregate checkpoint write, GB/s
    restart_s: float | None = None  # time to restart after a failure; None: one checkpoint read


@dataclass(frozen=True)
class RunCosts:
    """The training run of one plan. Times in the unit their name says."""

    steps: int  # optimizer steps to see train_tokens
    train_days: float  # failure-free wall-clock days (steps x step time)
    gpu_hours: float  # GPUs x failure-free hours
    cost_usd: float  # gpu_hours x price
    energy_mwh: float | None  # GPUs x TDP x hours x PUE, MWh (None: profile without tdp_w)
    checkpoint_gb: float  # weights + optimizer state, GB (1e9 bytes)
    checkpoint_write_s: float  # checkpoint_gb / storage bandwidth, s
    cluster_mtbf_hours: float  # node MTBF / nodes, h
    checkpoint_interval_min: float  # Young: sqrt(2 x write time x cluster MTBF), minutes
    lost_per_failure_h: float  # wall-clock lost per failure: half an interval + restart, h
    lost_per_failure_gpu_hours: float  # that x GPUs
    lost_per_failure_usd: float  # that x price
    failure_overhead: float  # expected extra time, fraction of the failure-free run
    num_gpus: int

    def columns(self) -> dict[str, Any]:
        """The plan columns this adds (RUN_COLUMNS, contract order)."""
        return {c: getattr(self, c) for c in RUN_COLUMNS}


def checkpoint_gb(num_params: float) -> float:
    """Weights + optimizer state of mixed-precision Adam, GB (1e9 bytes)."""
    return num_params * CHECKPOINT_BYTES_PER_PARAM / 1e9


def young_interval_hours(write_hours: float, mtbf_hours: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 C M), hours (Young 1974; seed 001 Ex 7.3)."""
    return math.sqrt(2.0 * write_hours * mtbf_hours)


def lost_per_failure_hours(interval_hours: float, restart_hours: float) -> float:
    """Expected wall-clock lost per failure: on average half an interval of work since the last
    checkpoint, plus the restart (seed 001 Ex 7.4)."""
    return interval_hours / 2.0 + restart_hours


def failure_overhead(write_h: float, interval_h: float, mtbf_h: float, restart_h: float) -> float:
    """Expected extra time per unit of useful time: checkpoint writes (C / interval) plus the
    work lost and the restart of each failure (1 / MTBF of them per hour). First order, as
    Young's derivation (valid while the interval is much shorter than the MTBF)."""
    return write_h / interval_h + lost_per_failure_hours(interval_h, restart_h) / mtbf_h


def training_run(plan: Plan, model: ModelSpec, cluster: ClusterSpec, inputs: RunInputs) -> RunCosts:
    """Days, GPU-hours, cost, energy, checkpoint and failure numbers of one plan's run. On a
    cluster of pools each pool's GPUs draw their own TDP and each pool's nodes fail alike."""
    e = plan.estimate
    n = plan.layout.tp * plan.layout.pp * plan.layout.dp * plan.layout.cp
    tokens_per_step = e.global_batch * e.seq_len
    steps = math.ceil(inputs.train_tokens / tokens_per_step)
    hours = steps * e.step_time_s / 3600.0
    gpu_hours = n * hours
    pools = getattr(cluster, "pools", None)
    if pools is None:
        tdp = cluster.gpu.tdp_w
        energy = n * tdp * hours * inputs.pue / 1e6 if tdp is not None else None
        nodes = max(1, math.ceil(n / cluster.gpus_per_node))
    else:
        tdps = [p.gpu.tdp_w for p in pools]
        energy = (sum(p.num_gpus * t for p, t in zip(pools, tdps, strict=True)) * hours
                  * inputs.pue / 1e6 if None not in tdps else None)
        nodes = sum(max(1, math.ceil(p.num_gpus / p.gpus_per_node)) for p in pools)
    ckpt = checkpoint_gb(model.num_params)
    write_s = ckpt / inputs.storage_gb_per_s
    mtbf = inputs.node_mtbf_hours / nodes
    interval = young_interval_hours(write_s / 3600.0, mtbf)
    restart_h = (write_s if inputs.restart_s is None else inputs.restart_s) / 3600.0
    lost = lost_per_failure_hours(interval, restart_h)
    return RunCosts(
        steps=steps,
        train_days=hours / 24.0,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * inputs.gpu_hour_usd,
        energy_mwh=energy,
        checkpoint_gb=ckpt,
        checkpoint_write_s=write_s,
        cluster_mtbf_hours=mtbf,
        checkpoint_interval_min=interval * 60.0,
        lost_per_failure_h=lost,
        lost_per_failure_gpu_hours=lost * n,
        lost_per_failure_usd=lost * n * inputs.gpu_hour_usd,
        failure_overhead=failure_overhead(write_s / 3600.0, interval, mtbf, restart_h),
        num_gpus=n,
    )


def _big(x: float, unit: str = "") -> str:
    """12,345 below a million, 1.234M above."""
    return f"{unit}{x / 1e6:,.3f}M" if x >= 1e6 else f"{unit}{x:,.0f}"


def run_summary(run: RunCosts, inputs: RunInputs) -> list[str]:
    """Readable lines for one plan's run (the CLI and the HTML report print them)."""
    energy = (f"{run.energy_mwh:,.0f} MWh at PUE {inputs.pue:g}" if run.energy_mwh is not None
              else "energy: the GPU profile has no tdp_w")
    return [
        f"{run.steps:,} steps: {run.train_days:,.1f} days on {run.num_gpus:,} GPUs, "
        f"{_big(run.gpu_hours)} GPU-hours, {_big(run.cost_usd, '$')} at "
        f"${inputs.gpu_hour_usd:g}/GPU-hour, {energy} (failure-free)",
        f"checkpoint {run.checkpoint_gb:,.0f} GB (weights + optimizer state), written in "
        f"{run.checkpoint_write_s:,.0f} s at {inputs.storage_gb_per_s:g} GB/s",
        f"cluster MTBF {run.cluster_mtbf_hours:.2f} h (node MTBF {inputs.node_mtbf_hours:,.0f} h"
        f"): checkpoint every {run.checkpoint_interval_min:.0f} min (Young); each failure loses "
        f"{run.lost_per_failure_h * 60:.0f} min ({run.lost_per_failure_gpu_hours:,.0f} GPU-hours, "
        f"${run.lost_per_failure_usd:,.0f}); checkpoints and failures add "
        f"{run.failure_overhead:.1%} to the run",
    ]


# ---- learning rate ------------------------------------------------------------------------
# Seed 001 ch. 3: linear scaling (Goyal et al. 2017) holds up to ~1M-4M tokens per batch for
# LLMs; square-root scaling (Hoffer et al. 2017, McCandlish et al. 2018) is more conservative
# and works better at very large batches; beyond the critical batch (~1-2M tokens at GPT-3
# scale) a bigger batch buys little. Warmup: ~(B_new / B_base) x 1000 steps, or 5-10% of steps.
LINEAR_LIMIT_TOKENS = 4e6
CRITICAL_BATCH_TOKENS = (1e6, 2e6)
WARMUP_STEPS_PER_RATIO = 1000
WARMUP_FRACTION = (0.05, 0.10)


@dataclass(frozen=True)
class LrAdvice:
    """Peak learning rates for a new global batch scaled from a tuned reference, and warmup."""

    ratio: float  # new batch / reference batch
    linear_lr: float  # ref_lr x ratio
    sqrt_lr: float  # ref_lr x sqrt(ratio)
    warmup_steps: int  # ratio x 1000 (seed 001 Ex 3.3)
    warmup_range: tuple[int, int] | None  # 5-10% of total steps, when they are known
    notes: list[str]  # the rules' limits that apply here


def lr_advice(ref_lr: float, ref_batch: float, new_batch: float, total_steps: int | None = None,
              tokens_per_sequence: int | None = None) -> LrAdvice:
    """Linear and square-root scaled peak LR for new_batch (same unit as ref_batch), warmup,
    and the limits of the rules (seed 001 ch. 3)."""
    ratio = new_batch / ref_batch
    warm = round(ratio * WARMUP_STEPS_PER_RATIO)
    rng = None
    if total_steps:
        rng = (round(WARMUP_FRACTION[0] * total_steps), round(WARMUP_FRACTION[1] * total_steps))
    notes = []
    if tokens_per_sequence:
        tokens = new_batch * tokens_per_sequence
        if tokens > LINEAR_LIMIT_TOKENS:
            notes.append(
                f"the batch is {tokens / 1e6:.1f}M tokens, beyond the ~1-4M where linear scaling "
                "is known to hold for LLMs: prefer square-root scaling or between the two")
        if tokens > CRITICAL_BATCH_TOKENS[1]:
            notes.append(
                "above the critical batch (~1-2M tokens at GPT-3 scale) more tokens per step "
                "barely cut the steps needed: consider a batch ramp-up (Llama 3: 4M -> 16M)")
    if ratio < 1:
        notes.append("the batch is smaller than the reference: both rules lower the LR")
    if total_steps and warm > WARMUP_FRACTION[1] * total_steps:
        notes.append(f"{warm:,} warmup steps exceed 10% of the {total_steps:,} steps: use the "
                     "5-10% range")
    notes.append("decay the schedule (e.g. cosine) over the actual number of steps")
    return LrAdvice(ratio, ref_lr * ratio, ref_lr * math.sqrt(ratio), warm, rng, notes)


def lr_lines(adv: LrAdvice, ref_lr: float, ref_batch: float, new_batch: float) -> list[str]:
    """Readable lines of the LR advice."""
    rng = (f"; 5-10% of the run is {adv.warmup_range[0]:,}-{adv.warmup_range[1]:,} steps"
           if adv.warmup_range else "")
    return [
        f"learning rate for global batch {new_batch:g} (tuned {ref_lr:g} at {ref_batch:g}, "
        f"x{adv.ratio:g}): linear {adv.linear_lr:.3g}, square-root {adv.sqrt_lr:.3g}; warmup "
        f"~{adv.warmup_steps:,} steps{rng}",
        *(f"  - {n}" for n in adv.notes),
    ]

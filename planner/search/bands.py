"""Prediction bands: when can two plans be told apart, and which of a tie to prefer?

Every Estimate carries two 1-sigma bands (planner.data.bands): step_time_low_s /
step_time_high_s, how far its step time may be off (the calibrated step_time_rel_error, else the
error on sources left out of every fit), and ranking_band, the relative error between layouts of
one job (the job's common offset removed). Ranking compares layouts of one job, so ties use the
ranking band: plans whose step_time_s x (1 -+ ranking_band) overlaps the best plan's are tied
with it (ranking_bounds): the model alone cannot rank them.

Within a tie the planner prefers the plan least sensitive to what the model is least sure of:
the robustness score is the ranking band's high end plus the exposed communication and
pipeline-bubble terms, each times its own 1-sigma error on published sources where they pin it
(UNCERTAIN_TERM_WEIGHTS, tp_term_weight; robust_step_time), costed on the adverse fabric measured
on a real cluster (adverse_cluster: ring collectives that slow with the nodes they span), then lower
memory. numpy only: `solve` uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# The terms the cost model is least sure of. On the held-out published runs, the term diagnosis
# of benchmarks/accuracy.py (log(measured/predicted) regressed on each term's share of the step;
# docs/accuracy.md "Prediction bands") finds compute right to 1% (factor 1.006) while the
# communication and bubble terms need factors of 0.7 (DP exposed) to 3.4 (TP) and 9.8 (PP sends,
# 0.3% of the step): their error is of the order of the term itself.
UNCERTAIN_TERMS: tuple[str, ...] = (
    "time_tp_comm_s", "time_cp_comm_s", "time_ep_comm_s", "time_pp_comm_s",
    "time_pp_bubble_s", "time_dp_comm_exposed_s",
)
# How much of each uncertain term the robustness score adds: the term's own 1-sigma error on
# published sources where the data pin it, else 1 (`python benchmarks/term_split.py rows.csv` on
# the rows of `benchmarks/accuracy.py --tune none --rows`, "== term weights =="). Per source S,
# log(measured/predicted) = a_S + sum_k b_k share_k, the term's factor f = 1 + b_k (no term
# formula is fitted on any run, so every source is held out for the terms); over the sources
# that identify the term (OLS standard error of f below 0.6) the root mean square of f - 1 (bias
# and spread for a source not seen, the scale of the 1-sigma band the score starts from) is the
# weight when it, its value with each source left out and the median |f - 1| all fall on one
# side of 1; otherwise the data cannot say whether the term is better or worse known than "the
# term itself" (the diagnosis above) and it keeps 1. Rows at d27112a:
# - pipeline bubble: BLOOM 0.21 +- 0.35 alone identifies it (dgxc 1.66 +- 0.98, Megatron-Bridge
#   1.34 +- 0.88, DLPerf 1.54 +- 2.2 do not) -> 1;
# - exposed DP: dgxc 1.05, DLPerf 0.96, llm-foundry 3.56 (FSDP), Megatron-Bridge 2.60 (BLOOM
#   0.98 +- 0.95 does not identify it): RMS 1.51, one left out 0.93-1.74, median 0.83 -> 1;
# - PP sends (DLPerf 0.31 +- 0.47 alone identifies them), CP and EP (no rows) -> 1.
# TP by kind (tp_term_weight): the same rule per kind.
UNCERTAIN_TERM_WEIGHTS: dict[str, float] = {
    "time_tp_comm_s": 1.0,  # replaced per row by tp_term_weight
    "time_cp_comm_s": 1.0,
    "time_ep_comm_s": 1.0,
    "time_pp_comm_s": 1.0,
    "time_pp_bubble_s": 1.0,
    "time_dp_comm_exposed_s": 1.0,
}
# TP inside the scale-up domain, not overlapped: BLOOM 1.47 +- 0.57 (its runs set
# CUDA_LAUNCH_BLOCKING=1, docs/accuracy.md), DLPerf 0.91 +- 0.18 (V100, 9 rows; main at d27112a,
# after the megatron-2021 dropout and fp16 step passes) and Korthikanti 2022 Table 5
# (Megatron-LM, A100, TP 8, TP 7-28% of the step; one level for its 8 points: 0.94 +- 0.14,
# tests/unit/test_costmodel_published.py) -> 0.28 (one left out 0.08-0.34, median 0.09).
TP_WEIGHT_IN_DOMAIN = 0.28
# TP overlapped with the GEMMs (Transformer Engine userbuffers, JobSpec.tp_comm_overlap): dgxc
# 0.97 +- 0.18 and Megatron-Bridge 3.01 +- 0.55 (RMS 1.42, median 1.02; with one left out a
# single source) -> 1. TP across scale-up domains (--tp-across-nodes): one source (DLPerf) -> 1.
TP_WEIGHT_OVERLAPPED = 1.0
TP_WEIGHT_ACROSS_DOMAINS = 1.0


TP_KIND_WEIGHTS = {"tp_in_domain": TP_WEIGHT_IN_DOMAIN, "tp_overlapped": TP_WEIGHT_OVERLAPPED,
                   "tp_across_domains": TP_WEIGHT_ACROSS_DOMAINS}


def tp_kind(tp: Any, domain_gpus: Any, tp_comm_overlap: Any) -> np.ndarray:
    """Each row's kind of TP term (a TP_KIND_WEIGHTS key): tp_across_domains where tp exceeds
    the `domain_gpus` of one scale-up domain, else tp_overlapped with `tp_comm_overlap`, else
    tp_in_domain (benchmarks/term_split.py splits the published rows by it)."""
    tp = np.asarray(tp)
    inside = np.where(np.asarray(tp_comm_overlap, dtype=bool), "tp_overlapped", "tp_in_domain")
    return np.where(tp > np.asarray(domain_gpus), "tp_across_domains", inside)


def tp_term_weight(tp: Any, domain_gpus: int, tp_comm_overlap: bool) -> np.ndarray:
    """The robustness score's weight of each row's TP term (UNCERTAIN_TERM_WEIGHTS' rule by
    kind): TP_KIND_WEIGHTS of its tp_kind."""
    kinds = np.atleast_1d(tp_kind(tp, domain_gpus, tp_comm_overlap))
    return np.array([TP_KIND_WEIGHTS[k] for k in kinds], dtype=float)


# The fabric a tie is ordered on (robust_step_time's `adverse` columns): ring all-gathers and
# reduce-scatters (and the ring all-reduce) across k > 2 nodes at busbw / (1 + x (k - 2)),
# LinkProfile.ring_slowdown_per_domain. x = 0.045 per node is what the one multi-node cluster
# whose collectives were logged at 2-64 nodes measured: the nanotron sweep's healthy
# allocations (planner/data/sweeps/nanotron_sweep_dev.csv; `python benchmarks/dp_scale.py`
# fits it on the logged all-gather / reduce-scatter busbw at 8-32 nodes and checks 2 and 64
# nodes: +3.6%, +5.7%; no step time is fitted). The stock profiles assume none (nccl-tests
# curves at 2 nodes). A user cannot know which fabric a job lands on, so among plans the model
# cannot tell apart the one that stays fast on the measured fabric goes first; the predicted
# step time and the tie itself stay the stock profile's.
ADVERSE_RING_SLOWDOWN = 0.045


def adverse_cluster(cluster: Any) -> Any:
    """`cluster` (a ClusterSpec) on the adverse fabric: its GPU profile's inter-node link with
    ring_slowdown_per_domain = ADVERSE_RING_SLOWDOWN. The same object when nothing would change:
    the profile states its own slowdown (its fabric is measured), or no ring can span more than
    2 scale-up domains."""
    gpu = cluster.gpu
    link = gpu.inter_node
    if link.ring_slowdown_per_domain is not None or cluster.num_gpus <= 2 * cluster.domain_gpus:
        return cluster
    link = link.model_copy(update={"ring_slowdown_per_domain": ADVERSE_RING_SLOWDOWN})
    return cluster.model_copy(update={"gpu": gpu.model_copy(update={"inter_node": link})})


def ranking_bounds(columns: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the ranking band of each row, seconds: step_time_s x (1 -+ ranking_band);
    columns without ranking_band (a cost function that lacks it) fall back to the step-time band
    (step_time_low_s / step_time_high_s, else the step time itself)."""
    step = np.asarray(columns["step_time_s"], dtype=float)
    if "ranking_band" in columns:
        rel = np.asarray(columns["ranking_band"], dtype=float)
        rel = np.where(np.isfinite(rel), rel, 0.0)
        return step * (1 - rel), step * (1 + rel)
    return (np.asarray(columns.get("step_time_low_s", step), dtype=float),
            np.asarray(columns.get("step_time_high_s", step), dtype=float))


def robust_step_time(columns: Mapping[str, Any],
                     adverse: Mapping[str, Any] | None = None,
                     tp_weight: Any = TP_WEIGHT_IN_DOMAIN) -> np.ndarray:
    """Robustness score of each row of cost columns, seconds (lower is more robust): the ranking
    band's high end (ranking_bounds) plus each exposed communication and bubble term times its
    weight (UNCERTAIN_TERM_WEIGHTS; the TP term's `tp_weight`, a scalar or one per row:
    tp_term_weight, default TP inside the scale-up domain without overlap), all read from
    `adverse` (the same rows costed on adverse_cluster) when given, else from `columns`.
    Columns a cost function lacks count as 0."""
    columns = columns if adverse is None else adverse
    step = np.asarray(columns["step_time_s"], dtype=float)
    high = ranking_bounds(columns)[1]
    uncertain = np.zeros_like(step)
    for term in UNCERTAIN_TERMS:
        if term in columns:
            weight = tp_weight if term == "time_tp_comm_s" else UNCERTAIN_TERM_WEIGHTS[term]
            uncertain = uncertain + np.asarray(weight, dtype=float) * np.asarray(
                columns[term], dtype=float)
    return high + uncertain


def overlaps_best(low: np.ndarray, high: np.ndarray, best: int) -> np.ndarray:
    """Rows whose band [low, high] overlaps row `best`'s band (row best included)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return (low <= high[best]) & (high >= low[best])


BAND_COLUMNS = ("step_time_s", "step_time_low_s", "step_time_high_s", "ranking_band")


def estimate_columns(ests: Sequence[Any], names: Sequence[str] = BAND_COLUMNS,
                     ) -> dict[str, np.ndarray]:
    """Columns of Estimate-like objects (those they have)."""
    return {c: np.array([float(getattr(e, c)) for e in ests]) for c in names
            if all(hasattr(e, c) for e in ests)}


def plans_indistinguishable(plans: Sequence[Any]) -> int:
    """How many of the ranked `plans` (the first one included) have a ranking band that
    overlaps the first plan's: 1 means the winner is clear; k means k plans cannot be told
    apart. 0 for an empty list. Without bands only exact ties count."""
    if not plans:
        return 0
    low, high = ranking_bounds(estimate_columns([p.estimate for p in plans]))
    return int(overlaps_best(low, high, 0).sum())


def _score_columns(ests: Sequence[Any]) -> dict[str, np.ndarray]:
    """The uncertain-term columns (0 where an Estimate lacks one) and band columns of
    Estimate-like objects: what robust_step_time reads."""
    cols = {c: np.array([float(getattr(e, c, 0.0)) for e in ests]) for c in UNCERTAIN_TERMS}
    cols.update(estimate_columns(ests))
    return cols


def order_ties(plans: Sequence[Any], adverse: Sequence[Any] | None = None,
               tp_weight: Any = TP_WEIGHT_IN_DOMAIN) -> list[Any]:
    """A list of plans (fitting first, by step time) in `solve`'s final order, for rankings
    built outside the search (benchmarks/ranking.py): the fitting plans whose band overlaps the
    fastest fitting plan's come first (those within the memory band of the capacity last), by
    robustness score then peak memory (ties by the ranking band, ranking_bounds), flagged
    tied_with_best; the others keep their order. Ranks are renumbered from 1. `adverse`: each
    plan's Estimate on adverse_cluster (as the search scores its tie); None: the plans' own.
    `tp_weight`: the TP term's weight, a scalar or one per plan (tp_term_weight)."""
    from dataclasses import replace

    plans = list(plans)
    fitting = [i for i, p in enumerate(plans) if p.estimate.fits]
    if not fitting:
        return [replace(p, rank=r, tied_with_best=False) for r, p in enumerate(plans, 1)]
    ests = [plans[i].estimate for i in fitting]
    cols = _score_columns(ests)
    best = int(np.argmin(cols["step_time_s"]))
    tied = overlaps_best(*ranking_bounds(cols), best)
    weight = np.broadcast_to(np.asarray(tp_weight, dtype=float), (len(plans),))[fitting]
    score = robust_step_time(cols, None if adverse is None
                             else _score_columns([adverse[i] for i in fitting]), weight)
    from planner.costmodel.memory import near_capacity

    tight = near_capacity([e.peak_mem_gb for e in ests], [e.mem_capacity_gb for e in ests])
    tie_order = sorted((k for k in range(len(fitting)) if tied[k]),
                       key=lambda k: (bool(tight[k]), score[k], ests[k].peak_mem_gb, k))
    head = [fitting[k] for k in tie_order]
    flags = set(head)
    rest = [i for i in range(len(plans)) if i not in flags]
    return [replace(plans[i], rank=r, tied_with_best=i in flags)
            for r, i in enumerate(head + rest, 1)]

"""Prediction bands: when can two plans be told apart, and which of a tie to prefer?

Every Estimate carries step_time_low_s / step_time_high_s, the 1-sigma band: the profile's
calibrated step_time_rel_error, or for a stock profile the cost model's documented error between
layouts of one job (GpuProfile.step_time_band, docs/accuracy.md "Prediction bands"). Plans whose
band overlaps the best plan's band are tied with it: the model alone cannot rank them.

Within a tie the planner prefers the plan least sensitive to what the model is least sure of:
the robustness score is the band's high end plus the exposed communication and pipeline-bubble
terms once more (robust_step_time_s), then lower memory. numpy only: `solve` uses it.
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
# How much of each uncertain term the robustness score adds: one more time the term (a factor
# of 2, the middle of the 0.7-3.4 the diagnosis measured on the terms with a visible share).
UNCERTAIN_TERM_FACTOR = 1.0


def robust_step_time(columns: Mapping[str, Any]) -> np.ndarray:
    """Robustness score of each row of cost columns, seconds (lower is more robust): the band's
    high end (step_time_high_s, else step_time_s) plus UNCERTAIN_TERM_FACTOR times the exposed
    communication and bubble terms. Columns a cost function lacks count as 0."""
    step = np.asarray(columns["step_time_s"], dtype=float)
    high = np.asarray(columns.get("step_time_high_s", step), dtype=float)
    uncertain = np.zeros_like(step)
    for term in UNCERTAIN_TERMS:
        if term in columns:
            uncertain = uncertain + np.asarray(columns[term], dtype=float)
    return high + UNCERTAIN_TERM_FACTOR * uncertain


def overlaps_best(low: np.ndarray, high: np.ndarray, best: int) -> np.ndarray:
    """Rows whose band [low, high] overlaps row `best`'s band (row best included)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return (low <= high[best]) & (high >= low[best])


def _band(plan: Any) -> tuple[float, float]:
    est = plan.estimate
    t = float(est.step_time_s)
    low = float(getattr(est, "step_time_low_s", t))
    high = float(getattr(est, "step_time_high_s", t))
    return low, high


def plans_indistinguishable(plans: Sequence[Any]) -> int:
    """How many of the ranked `plans` (the first one included) have a step-time band that
    overlaps the first plan's band: 1 means the winner is clear; k means k plans cannot be told
    apart. 0 for an empty list. Without bands only exact ties count."""
    if not plans:
        return 0
    bands = np.array([_band(p) for p in plans])
    return int(overlaps_best(bands[:, 0], bands[:, 1], 0).sum())


def order_ties(plans: Sequence[Any]) -> list[Any]:
    """A list of plans (fitting first, by step time) in `solve`'s final order, for rankings
    built outside the search (benchmarks/ranking.py): the fitting plans whose band overlaps the
    fastest fitting plan's come first (those within the memory band of the capacity last), by
    robustness score then peak memory, flagged
    tied_with_best; the others keep their order. Ranks are renumbered from 1."""
    from dataclasses import replace

    plans = list(plans)
    fitting = [i for i, p in enumerate(plans) if p.estimate.fits]
    if not fitting:
        return [replace(p, rank=r, tied_with_best=False) for r, p in enumerate(plans, 1)]
    ests = [plans[i].estimate for i in fitting]
    cols = {c: np.array([float(getattr(e, c, 0.0)) for e in ests])
            for c in ("step_time_s", "step_time_low_s", "step_time_high_s", *UNCERTAIN_TERMS)}
    best = int(np.argmin(cols["step_time_s"]))
    tied = overlaps_best(cols["step_time_low_s"], cols["step_time_high_s"], best)
    score = robust_step_time(cols)
    from planner.costmodel.memory import near_capacity

    tight = near_capacity([e.peak_mem_gb for e in ests], [e.mem_capacity_gb for e in ests])
    tie_order = sorted((k for k in range(len(fitting)) if tied[k]),
                       key=lambda k: (bool(tight[k]), score[k], ests[k].peak_mem_gb, k))
    head = [fitting[k] for k in tie_order]
    rest = [i for i in range(len(plans)) if i not in set(head)]
    flags = set(head)
    return [replace(plans[i], rank=r, tied_with_best=i in flags)
            for r, i in enumerate(head + rest, 1)]

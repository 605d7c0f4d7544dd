"""Which plans to measure: the n plans of a ranking whose runs best separate the tie
(`solve --calibrate N` validates them, planner.validate.loop; benchmarks/ranking.py replays it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from planner.errors import PlannerError
from planner.plan import Plan

# How far apart two plans are in what drives their predicted step times: the share of the step
# each time term takes (the refit's knobs act on these terms: GEMM efficiency on compute,
# bus bandwidth on the collectives, dp_overlap on the exposed DP time, ...). Layout knobs (log2
# degrees, micro-batch, ZeRO, recompute, SP) only break ties between plans with the same shares.
KNOB_TIEBREAK_WEIGHT = 1e-3


def _features(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(time-term shares, layout knobs) of a plan, for choose_calibration_plans."""
    from planner.layout import RECOMPUTE_LEVELS
    from planner.plan import TIME_COLUMNS

    est, lay = plan.estimate, plan.layout
    step = float(est.step_time_s) or 1.0
    shares = np.array([float(getattr(est, c)) / step for c in TIME_COLUMNS])
    knobs = np.array([*(math.log2(getattr(lay, k)) for k in ("tp", "pp", "dp", "cp", "ep",
                                                             "vpp", "mbs")),
                      lay.zero, RECOMPUTE_LEVELS.index(lay.recompute), float(lay.sp)])
    return shares, knobs


def choose_calibration_plans(plans: Sequence[Plan], n: int) -> list[Plan]:
    """The n plans of a ranking (best first) whose measurements best separate the tie: the first
    plan (what the user would run), then, one at a time, the plan tied with the best
    (Plan.tied_with_best) that differs most from those already chosen in the share of its step
    each time term takes (farthest point: the largest L1 distance to its nearest chosen plan;
    layout knobs break equal shares, then the rank). Once the tie is exhausted the untied plans
    follow by the same rule. Fewer than n plans given: all of them, in rank order."""
    if n < 1:
        raise PlannerError("--calibrate N needs N >= 1 plans to validate")
    plans = list(plans)
    if len(plans) <= n:
        return plans
    feats = [_features(p) for p in plans]

    def distance(i: int, j: int) -> float:
        (si, ki), (sj, kj) = feats[i], feats[j]
        return float(np.abs(si - sj).sum() + KNOB_TIEBREAK_WEIGHT * np.abs(ki - kj).sum())

    chosen = [0]
    tied = [i for i in range(1, len(plans)) if plans[i].tied_with_best]
    rest = [i for i in range(1, len(plans)) if not plans[i].tied_with_best]
    for pool in (tied, rest):
        pool = list(pool)
        while pool and len(chosen) < n:
            best = max(pool, key=lambda i: (min(distance(i, j) for j in chosen), -i))
            chosen.append(best)
            pool.remove(best)
    return [plans[i] for i in sorted(chosen)]

"""Prediction bands: when can two plans be told apart?

A calibrated profile carries step_time_rel_error (1 sigma); the cost model turns it into
step_time_low_s / step_time_high_s on every Estimate. Two plans whose bands overlap cannot be
ranked with confidence by the model alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _band(plan: Any) -> tuple[float, float]:
    est = plan.estimate
    t = float(est.step_time_s)
    low = float(getattr(est, "step_time_low_s", t))
    high = float(getattr(est, "step_time_high_s", t))
    return low, high


def plans_indistinguishable(plans: Sequence[Any]) -> int:
    """How many of the ranked `plans` (the best one included) have a step-time band that overlaps
    the best plan's band: 1 means the winner is clear; k means plans 1..k cannot be told apart.
    0 for an empty list. Without bands (uncalibrated profile) only exact ties count."""
    if not plans:
        return 0
    best_low, best_high = _band(plans[0])
    count = 0
    for plan in plans:
        low, high = _band(plan)
        if low <= best_high and high >= best_low:
            count += 1
    return count

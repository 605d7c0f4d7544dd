"""Calibration: fit a GPU profile to measured runs, and choose which runs to measure.

    from planner.calibrate import calibrate, load_runs
    runs, skipped = load_runs("runs.jsonl", gpu)
    fit = calibrate(gpu, runs)           # FitResult: fit.profile, fit.err_before, fit.err_cv ...
    fit = few_shot_fit(gpu, runs, stack=resolve_stack("nemo"))  # only what the runs identify
    choose_calibration_plans(plans, n)   # the n plans whose runs best separate the tie

scipy is imported only inside the fit. The bands are the search's (planner.search.bands); the
closed loop, which runs plans through the validate launcher, is planner.validate.loop.
"""

from __future__ import annotations

from planner.calibrate.choose import choose_calibration_plans
from planner.calibrate.fewshot import FewShotFit, FewShotPrior, few_shot_fit
from planner.calibrate.fit import (
    FitResult,
    calibrate,
    predict_step_times,
    profile_yaml,
    resolve_layout,
)
from planner.measured.runs import MeasuredRun, load_runs
from planner.specs.adjust import apply_values, knobs_for, stock_values

__all__ = [
    "FewShotFit", "FewShotPrior", "FitResult", "MeasuredRun", "apply_values", "calibrate",
    "choose_calibration_plans", "few_shot_fit", "knobs_for",
    "load_runs", "predict_step_times", "profile_yaml",
    "resolve_layout", "stock_values",
]


"""Calibration: fit a GPU profile to measured runs, prediction bands, the closed loop.

    from planner.calibrate import calibrate, load_runs
    runs, skipped = load_runs("runs.jsonl", gpu)
    fit = calibrate(gpu, runs)           # FitResult: fit.profile, fit.err_before, fit.err_cv ...
    fit = few_shot_fit(gpu, runs, stack=resolve_stack("nemo"))  # only what the runs identify
    plans_indistinguishable(plans)       # how many top plans overlap the best one's band
    choose_calibration_plans(plans, n)   # the n plans whose runs best separate the tie

scipy is imported only inside the fit, so `solve` can use the band helper cheaply.
"""

from __future__ import annotations

from planner.calibrate.bands import plans_indistinguishable
from planner.calibrate.fewshot import FewShotFit, FewShotPrior, few_shot_fit
from planner.calibrate.fit import (
    FitResult,
    apply_values,
    calibrate,
    knobs_for,
    predict_step_times,
    profile_yaml,
    resolve_layout,
    stock_values,
)
from planner.runs import MeasuredRun, load_runs

__all__ = [
    "FewShotFit", "FewShotPrior", "FitResult", "MeasuredRun", "apply_values", "calibrate",
    "choose_calibration_plans", "closed_loop", "few_shot_fit", "knobs_for",
    "load_runs", "plans_indistinguishable", "predict_step_times", "profile_yaml",
    "resolve_layout", "stock_values",
]


def __getattr__(name: str):  # noqa: ANN202 - lazy: the loop pulls in the validate launcher
    if name in ("closed_loop", "ClosedLoopResult", "choose_calibration_plans"):
        from planner.calibrate import loop

        return getattr(loop, name)
    raise AttributeError(name)

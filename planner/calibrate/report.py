"""Printing a fit: per-run and overall step-time errors before, after and cross-validated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from planner.calibrate.fit import FitResult
from planner.measured.runs import Skipped


def error_stats(err: np.ndarray | None) -> dict[str, float] | None:
    """Median and p90 of the absolute relative error (fractions), and the signed median (bias)."""
    if err is None or len(err) == 0:
        return None
    a = np.abs(err)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "bias": float(np.median(err)), "n": int(len(err))}


def fit_summary(fit: FitResult, skipped: Sequence[Skipped] = ()) -> dict[str, Any]:
    """A JSON-able summary of the fit."""
    cv = fit.err_cv
    return {
        "profile": fit.profile.name,
        "fitted": {k: fit.values[k] for k in fit.fitted},
        "step_time_rel_error": fit.profile.step_time_rel_error,
        "before": error_stats(fit.err_before),
        "after": error_stats(fit.err_after),
        "cross_validated": error_stats(cv),
        "cv_method": fit.cv_method,
        "runs": [
            {"run": r.run_id, "layout": str(lay), "measured_step_time_s": float(m),
             "predicted_before_s": float(b), "predicted_after_s": float(a),
             "predicted_cv_s": None if fit.pred_cv is None else float(fit.pred_cv[i])}
            for i, (r, lay, m, b, a) in enumerate(zip(fit.runs, fit.layouts, fit.measured,
                                                      fit.pred_before, fit.pred_after, strict=True))
        ],
        "skipped": [{"run": s.run_id, "reason": s.reason} for s in skipped],
        "notes": fit.notes,
        # few-shot fits (planner.calibrate.fewshot): the stack and the knobs kept, with why
        "stack": getattr(fit, "stack", None) or None,
        "kept": dict(getattr(fit, "kept", {}) or {}),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def print_fit(fit: FitResult, console: Any, skipped: Sequence[Skipped] = (),
              max_rows: int = 40) -> None:
    """Rich tables: every run (up to max_rows), the overall errors, the fitted values."""
    from rich.table import Table

    table = Table(title=f"step time per run ({len(fit.runs)} runs)")
    for col in ("run", "layout", "measured s", "before s", "err before", "after s", "err after",
                f"err {fit.cv_method or 'cv'}"):
        table.add_column(col, justify="left" if col in ("run", "layout") else "right")
    cv = fit.err_cv
    for i, run in enumerate(fit.runs[:max_rows]):
        table.add_row(run.run_id, str(fit.layouts[i]), f"{fit.measured[i]:.4g}",
                      f"{fit.pred_before[i]:.4g}", _pct(fit.err_before[i]),
                      f"{fit.pred_after[i]:.4g}", _pct(fit.err_after[i]),
                      _pct(None if cv is None else cv[i]))
    console.print(table)
    if len(fit.runs) > max_rows:
        console.print(f"... {len(fit.runs) - max_rows} more runs (use --json for all)")
    overall = Table(title="absolute step-time error")
    for col in ("", "median", "p90", "bias (median signed)"):
        overall.add_column(col, justify="right")
    for label, err in (("before", fit.err_before), ("after (in-sample)", fit.err_after),
                       (f"after ({fit.cv_method})", cv)):
        s = error_stats(err)
        if s is not None:
            overall.add_row(label, f"{100 * s['median']:.1f}%", f"{100 * s['p90']:.1f}%",
                            _pct(s["bias"]))
    console.print(overall)
    fitted = ", ".join(f"{k}={fit.values[k]:.4g}" for k in fit.fitted) or "nothing (no run moves)"
    stack = getattr(fit, "stack", "")
    console.print(f"fitted: {fitted}" + (f" (starting from stack preset {stack})" if stack else ""))
    for name, why in (getattr(fit, "kept", {}) or {}).items():
        console.print(f"kept {name}: {why}", highlight=False)
    console.print(f"step_time_rel_error (1 sigma band): {fit.profile.step_time_rel_error}")
    for note in fit.notes:
        console.print(f"note: {note}")
    if skipped:
        console.print(f"skipped {len(skipped)} run(s): "
                      + "; ".join(f"{s.run_id}: {s.reason}" for s in list(skipped)[:5])
                      + (" ..." if len(skipped) > 5 else ""))

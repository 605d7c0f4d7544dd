"""Fit a GPU profile's efficiency parameters to measured step times.

Robust nonlinear least squares (scipy.optimize.least_squares, soft-L1 loss) on the log ratio
log(predicted / measured) of every run, the prediction being the cost model's step time with the
trial profile. Parameters live in their measured bounds (calibrate.bounds.fit_knobs: no
efficiency above the best measured kernel of its kind on the GPU, physical where none is
measured) and are fitted in a unit box (log-spaced for scales and latencies); a weak prior pulls
each parameter toward the stock value so a parameter the runs do not constrain stays where its
source put it. Parameters that change no run's prediction are frozen before the fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from planner.calibrate.bounds import fit_knobs
from planner.errors import PlannerError
from planner.layout import Layout
from planner.measured.runs import MeasuredRun
from planner.progress import track
from planner.specs import GpuProfile
from planner.specs.adjust import Knob, apply_values, stock_values

# soft-L1 switches from quadratic to linear at a 5% log error: one bad run (a noisy BLOOM
# snapshot, a straggler) cannot drag the fit. Weight of the stock-value prior, in log-error units
# per unit-box distance (moving a parameter across its whole range costs as much as 2% on one run).
ROBUST_SCALE = 0.05
PRIOR_WEIGHT = 0.02
SENSITIVITY_STEP = 0.25  # unit-box step (a quarter of the range) for the frozen-parameter test
MIN_SENSITIVITY = 1e-4  # |d log t| below which a parameter does not move any run
# Runs per fitted parameter: benchmarks/accuracy.py fits a GPU profile's first n // 20 knobs on
# its n tuning runs (at least one), stackfit a preset's two knobs on at least 2 x 20 runs' worth.
RUNS_PER_KNOB = 20


# ---- predictions --------------------------------------------------------------------------------

Predictor = Callable[[GpuProfile, Sequence[MeasuredRun], Sequence[Layout]], np.ndarray]


def predict_step_times(profile: GpuProfile, runs: Sequence[MeasuredRun],
                       layouts: Sequence[Layout]) -> np.ndarray:
    """Cost-model step time (s) of each run's layout on `profile`, one estimate_batch call per
    (model, cluster shape, job) group (runs share a group when they share the ModelSpec object;
    planner.measured.runs interns equal specs)."""
    return predict_columns(profile, runs, layouts, ("step_time_s",))["step_time_s"]


def predict_columns(profile: GpuProfile, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                    names: Sequence[str]) -> dict[str, np.ndarray]:
    """Cost-model columns `names` (estimate_batch's, e.g. step_time_s and the time terms, s) of
    each run's layout on `profile`, as predict_step_times groups them."""
    from planner.costmodel import estimate_batch

    out = {name: np.empty(len(runs)) for name in names}
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        key = (id(run.model), run.cluster.num_nodes, run.cluster.gpus_per_node, run.job)
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        run = runs[idx[0]]
        cluster = run.cluster.model_copy(update={"gpu": profile})
        cols = estimate_batch(run.model, cluster, run.job, [layouts[i] for i in idx])
        for name in names:
            out[name][idx] = np.asarray(cols[name], dtype=float)
    return out


def resolve_layout(run: MeasuredRun, profile: GpuProfile | None = None) -> Layout | None:
    """The run's layout: its own when every knob is known, else the search's best layout with
    the run's knobs pinned (the published runs were tuned; the fastest consistent layout is the
    best guess). None when nothing fits."""
    if run.layout is not None:
        return run.layout
    from planner.errors import InfeasibleError
    from planner.search import solve

    cluster = run.cluster if profile is None else run.cluster.model_copy(update={"gpu": profile})
    try:
        # published runs used their framework's even split (the even rule encodes it)
        plans = solve(run.model, cluster, run.job, dict(run.pins), top_k=1, even_stages=True)
    except InfeasibleError:
        return None
    return plans[0].layout if plans else None


# ---- the fit ----------------------------------------------------------------------------------

@dataclass
class FitResult:
    """A fitted profile and the errors that go with it (relative errors = pred/measured - 1)."""

    base: GpuProfile
    profile: GpuProfile
    values: dict[str, float]
    fitted: list[str]
    runs: list[MeasuredRun]
    layouts: list[Layout]
    measured: np.ndarray
    pred_before: np.ndarray
    pred_after: np.ndarray
    pred_cv: np.ndarray | None = None
    cv_method: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def err_before(self) -> np.ndarray:
        return self.pred_before / self.measured - 1

    @property
    def err_after(self) -> np.ndarray:
        return self.pred_after / self.measured - 1

    @property
    def err_cv(self) -> np.ndarray | None:
        return None if self.pred_cv is None else self.pred_cv / self.measured - 1

    @property
    def rel_error_sigma(self) -> float:
        """1-sigma relative step-time error for prediction bands: robust spread (1.4826 x median
        absolute log residual) of the cross-validated residuals, in-sample when there is no CV."""
        pred = self.pred_cv if self.pred_cv is not None else self.pred_after
        return float(1.4826 * np.median(np.abs(np.log(pred / self.measured))))


def _unit_bounds(knobs: Sequence[Knob]) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(len(knobs)), np.ones(len(knobs))


def _frozen_out(knobs: list[Knob], u0: np.ndarray, base_pred: np.ndarray, runs, layouts,
                profile: GpuProfile, predict: Predictor) -> list[int]:
    """Indices of the knobs that move at least one run's predicted step time."""
    active = []
    for j, knob in enumerate(knobs):
        step = SENSITIVITY_STEP if u0[j] < 0.5 else -SENSITIVITY_STEP
        u = min(1.0, max(0.0, u0[j] + step))
        trial = apply_values(profile, {knob.name: knob.to_value(u)})
        change = np.abs(np.log(predict(trial, runs, layouts) / base_pred))
        if np.nanmax(change) > MIN_SENSITIVITY:
            active.append(j)
    return active


def fit_values(profile: GpuProfile, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
               measured: np.ndarray, names: Sequence[str] | None = None,
               predict: Predictor = predict_step_times, start: dict[str, float] | None = None,
               weights: np.ndarray | None = None,
               ) -> tuple[dict[str, float], list[str]]:
    """Fit the knobs to the runs; returns (all knob values, names of the fitted ones). `start`
    (e.g. the fit on all runs, for cross-validation) is where the search begins; the prior
    still pulls toward the profile's own values. `weights` (one per run, mean 1; default all 1)
    scale each run's share of the loss, e.g. so that every source counts alike."""
    from scipy.optimize import least_squares

    every = fit_knobs(profile)
    knobs = [k for k in every if names is None or k.name in names]
    if names is not None:
        unknown = set(names) - {k.name for k in every}
        if unknown:
            raise PlannerError(f"unknown fit parameter(s): {', '.join(sorted(unknown))}; known: "
                               + ", ".join(k.name for k in every))
    stock = stock_values(profile)
    u0 = np.array([k.to_unit(stock[k.name]) for k in knobs])
    base_pred = predict(profile, runs, layouts)
    active = _frozen_out(knobs, u0, base_pred, runs, layouts, profile, predict)
    if not active:
        return {k.name: stock[k.name] for k in knobs}, []
    act = [knobs[j] for j in active]
    ua0 = u0[active]
    log_meas = np.log(measured)
    root_w = np.ones(len(log_meas)) if weights is None else np.sqrt(np.asarray(weights, float))

    def values_of(ua: np.ndarray) -> dict[str, float]:
        return {k.name: k.to_value(float(u)) for k, u in zip(act, ua, strict=True)}

    def residuals(ua: np.ndarray) -> np.ndarray:
        pred = predict(apply_values(profile, values_of(ua)), runs, layouts)
        data = root_w * (np.log(np.maximum(pred, 1e-12)) - log_meas)
        return np.concatenate([data, PRIOR_WEIGHT * (ua - ua0)])

    x0 = ua0 if start is None else np.array([k.to_unit(start[k.name]) for k in act])
    if start is None:
        x0 = _coarse_start(residuals, x0)
    result = least_squares(residuals, x0, bounds=(np.zeros(len(act)), np.ones(len(act))),
                           loss="soft_l1", f_scale=ROBUST_SCALE, diff_step=1e-3, x_scale=1.0,
                           max_nfev=200 * (len(act) + 1))
    fitted = [k.name for k in act]
    # an FP8 scale not fitted (not asked, or no FP8 run moves it) follows the GEMM scale
    # (specs.adjust.fp8_tied_values), as it did inside the fit
    values = {k.name: stock[k.name] for k in knobs
              if not (k.name == "fp8_gemm_scale" and "gemm_scale" in fitted)}
    values.update(values_of(result.x))
    return values, fitted


def _robust_cost(r: np.ndarray) -> float:
    """scipy's soft_l1 loss at ROBUST_SCALE, summed (what least_squares minimizes, x2)."""
    z = (r / ROBUST_SCALE) ** 2
    return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _coarse_start(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray,
                  grid: int = 5, rounds: int = 2) -> np.ndarray:
    """Coordinate search on a grid of the unit box before the local solver: curves read by
    interpolation and log-spaced latencies give flat spots where finite differences see no
    slope (a latency at its lower bound), so least_squares alone can stall far from the fit."""
    x = x0.copy()
    best = _robust_cost(residuals(x))
    for _ in range(rounds):
        for j in range(len(x)):
            for u in np.linspace(0.0, 1.0, grid):
                trial = x.copy()
                trial[j] = u
                cost = _robust_cost(residuals(trial))
                if cost < best:
                    best, x = cost, trial
    return x


def _cv_folds(n: int, max_loo: int) -> tuple[list[np.ndarray], str]:
    if n <= max_loo:
        return [np.array([i]) for i in range(n)], "leave-one-out"
    k = 10
    return [np.arange(n)[i::k] for i in range(k)], f"{k}-fold"


def timed_runs(profile: GpuProfile, runs: Sequence[MeasuredRun],
               layouts: Sequence[Layout | None] | None = None,
               ) -> tuple[list[MeasuredRun], list[Layout], np.ndarray, list[str]]:
    """The runs a fit can use: (runs, their layouts, measured step times s, notes). OOM labels
    and runs whose layout is unknown and unresolvable on `profile` are left out with a note;
    PlannerError when none is left."""
    notes: list[str] = []
    if layouts is None:
        layouts = [None if r.oom else resolve_layout(r, profile) for r in runs]
    kept = [(r, lay) for r, lay in zip(runs, layouts, strict=True)
            if not r.oom and lay is not None and r.measured_step_time_s]
    if len(kept) < len(runs):
        notes.append(f"{len(runs) - len(kept)} run(s) left out (OOM labels or no layout fits)")
    if not kept:
        raise PlannerError("no run with a measured step time to calibrate on")
    fit_runs = [r for r, _ in kept]
    fit_layouts = [lay for _, lay in kept]
    measured = np.array([r.measured_step_time_s for r in fit_runs], dtype=float)
    return fit_runs, fit_layouts, measured, notes


def source_weights(runs: Sequence[MeasuredRun]) -> np.ndarray:
    """One weight per run, mean 1, such that every source_id's runs weigh the same in total:
    a fit for software nobody named is the middle of the sources, not of the largest one."""
    ids = [r.source_id for r in runs]
    count = {s: ids.count(s) for s in set(ids)}
    return np.array([len(ids) / (len(count) * count[s]) for s in ids])


def calibrate(profile: GpuProfile, runs: Sequence[MeasuredRun], *,
              layouts: Sequence[Layout | None] | None = None, names: Sequence[str] | None = None,
              cross_validate: bool = True, max_loo: int = 40,
              predict: Predictor = predict_step_times, per_source: bool = False) -> FitResult:
    """Fit `profile` to the measured step times of `runs` (OOM labels and runs whose layout is
    unknown and unresolvable are left out, with a note). `layouts` (one per run) skips the search
    for runs whose knobs are incomplete. `per_source`: every source_id weighs alike in the loss,
    however many runs it has (source_weights). Cross-validation refits without each held-out
    run (or fold) and predicts it."""
    fit_runs, fit_layouts, measured, notes = timed_runs(profile, runs, layouts)
    pred_before = predict(profile, fit_runs, fit_layouts)
    weights = source_weights(fit_runs) if per_source else None
    values, fitted = fit_values(profile, fit_runs, fit_layouts, measured, names, predict,
                                weights=weights)
    new = apply_values(profile, values)
    pred_after = predict(new, fit_runs, fit_layouts)
    pred_cv, method = None, ""
    if cross_validate and len(fit_runs) >= 3:
        folds, method = _cv_folds(len(fit_runs), max_loo)
        pred_cv = np.empty(len(fit_runs))
        for held in track(folds, f"cross-validating ({method}): refits"):
            train = np.setdiff1d(np.arange(len(fit_runs)), held)
            tr_runs = [fit_runs[i] for i in train]
            tr_lay = [fit_layouts[i] for i in train]
            v, _ = fit_values(profile, tr_runs, tr_lay, measured[train], names, predict,
                              start=values)
            pred_cv[held] = predict(apply_values(profile, v), [fit_runs[i] for i in held],
                                    [fit_layouts[i] for i in held])
    elif cross_validate:
        notes.append("cross-validation needs at least 3 runs")
    result = FitResult(profile, new, values, fitted, fit_runs, fit_layouts, measured, pred_before,
                       pred_after, pred_cv, method, notes)
    result.profile = _with_provenance(new, result)
    return result


def _summary(err: np.ndarray | None) -> dict[str, float] | None:
    if err is None:
        return None
    a = np.abs(err)
    return {"median": round(float(np.median(a)), 4), "p90": round(float(np.percentile(a, 90)), 4)}


def _with_provenance(profile: GpuProfile, fit: FitResult) -> GpuProfile:
    date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    provenance = {
        "calibrated_by": "planner calibrate",
        "date": date,
        "base_profile": fit.base.name,
        "method": f"scipy least_squares soft_l1 (f_scale {ROBUST_SCALE}) on log(pred/measured), "
                  f"prior weight {PRIOR_WEIGHT}",
        "fitted": {k: round(fit.values[k], 6) for k in fit.fitted},
        "runs": [r.run_id for r in fit.runs],
        "residuals": {r.run_id: round(float(e), 4) for r, e in zip(fit.runs, fit.err_after,
                                                                    strict=True)},
        "rel_error_before": _summary(fit.err_before),
        "rel_error_after": _summary(fit.err_after),
        "rel_error_cv": _summary(fit.err_cv),
        "cv_method": fit.cv_method,
        "previous": fit.base.provenance or None,
    }
    field_of = {"gemm_scale": "gemm_efficiency", "gemm_size_log2": "gemm_efficiency",
                "fp8_gemm_scale": "fp8_gemm_efficiency", "intra_bw_scale": "intra_node",
                "intra_latency_us": "intra_node", "inter_bw_scale": "inter_node",
                "intra_size_log2": "intra_node", "inter_size_log2": "inter_node",
                "intra_base_latency_us": "intra_node", "inter_base_latency_us": "inter_node",
                "inter_latency_us": "inter_node"}
    sources = dict(profile.sources)
    for name in fit.fitted:
        key = field_of.get(name, name)
        sources[key] = (f"fitted by planner calibrate on {len(fit.runs)} runs ({date}); was: "
                        + fit.base.sources.get(key, "stock value"))[:500]
    sources["step_time_rel_error"] = f"robust spread of the {fit.cv_method or 'in-sample'} " \
                                     f"residuals of {len(fit.runs)} runs ({date})"
    return profile.model_copy(update={
        "provenance": provenance, "sources": sources,
        "step_time_rel_error": round(fit.rel_error_sigma, 4),
    })


def profile_yaml(profile: GpuProfile) -> str:
    """The profile as YAML in the GpuProfile schema (loadable by `--profile`)."""
    import yaml

    data = profile.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)

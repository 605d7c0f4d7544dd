"""Fit a software stack's efficiency factors (StackFactors) on runs of that stack across GPUs.

One GEMM scale and one host time per layer pass, shared by every GPU the runs used (each run
predicted on its own GPU profile with the factors applied through StackPreset.apply, the path
`--stack` takes). Robust least squares (soft-L1 at the same 5% log scale as planner.calibrate).
Where the runs cannot separate the two (too few for their estimates' correlation,
MIN_SEPARATING_RUNS) one knob is fitted, the one that predicts held-out runs better
(choose_knobs). benchmarks/accuracy.py --stacks fits the presets with it, split by source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from planner.calibrate.fit import ROBUST_SCALE, RUNS_PER_KNOB, predict_step_times
from planner.layout import Layout
from planner.measured.runs import MeasuredRun

GEMM_SCALE_BOUNDS = (0.3, 2.0)  # a stack 3x slower or 2x faster than the stock profiles' GEMMs
LAYER_OVERHEAD_MAX_US = 2e4  # 20 ms per layer pass: beyond any host overhead in the table
# Two knobs are fitted together only where the runs separate them: the variance of each estimate
# grows as VIF / n, VIF = 1 / (1 - r^2) the variance inflation factor of their correlation r
# (knob_correlation). Both are fitted while n / VIF, the runs' count discounted by it, is at
# least 2 x RUNS_PER_KNOB / 10: the 20 runs per knob the profile fits ask for
# (planner.calibrate.fit), at VIF 10, the usual bound past which collinearity makes
# least-squares estimates unreliable (Kutner, Nachtsheim, Neter, Applied Linear Regression
# Models, 4th ed., sec. 10.5). Measured at the stock factors on the committed fit groups, n / VIF:
# nemo's own-curve GPUs 261 x (1 - 0.913^2) = 43, pytorch-fsdp 216 x (1 - 0.751^2) = 94,
# megatron-deepspeed 113 x (1 - 0.846^2) = 32, maxtext 35 x (1 - 0.721^2) = 16.8, nemo on
# Megatron-Bridge's own-curve runs alone (a leave-one-source-out fold) 49 x (1 - 0.951^2) = 4.7;
# beyond: DLPerf's 18 V100 runs 18 x (1 - 0.977^2) = 0.82, nemo's 22 GB300 runs 0.91.
MAX_VIF = 10.0
MIN_SEPARATING_RUNS = 2 * RUNS_PER_KNOB / MAX_VIF


def predict_with(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                 ) -> np.ndarray:
    """Step time (s) of each run on its own GPU profile with the preset's factors for the run's
    precision applied."""
    out = np.empty(len(runs))
    by_gpu: dict[tuple[int, str], list[int]] = {}
    for i, run in enumerate(runs):
        by_gpu.setdefault((id(run.cluster.gpu), run.job.precision), []).append(i)
    for (_, precision), idx in by_gpu.items():
        gpu = preset.apply(runs[idx[0]].cluster.gpu, precision)
        out[idx] = predict_step_times(gpu, [runs[i] for i in idx], [layouts[i] for i in idx])
    return out


def precisions_of(runs: Sequence[MeasuredRun]) -> list[str]:
    """The job precisions of the runs, sorted (StackFactors.precisions of a fit on them)."""
    return sorted({r.job.precision for r in runs})


KNOBS = ("gemm_scale", "layer_overhead_us")  # the factors a preset has (StackFactors)


def _with_knobs(preset, x: np.ndarray, knobs: Sequence[str], borrowed: Sequence[str]):
    """The preset with the knobs set from x (log GEMM scale, layer overhead in ms), as its
    transferable factors and those of every borrowed-curve class in `borrowed`; a knob not in
    `knobs` keeps the stock value (GEMM x1, the profile's layer overhead)."""
    from planner.stacks import StackFactors

    val = dict(zip(knobs, x, strict=True))
    return _placed(preset, StackFactors(
        gemm_scale=math.exp(val["gemm_scale"]) if "gemm_scale" in val else 1.0,
        layer_overhead_us=1e3 * val["layer_overhead_us"] if "layer_overhead_us" in val
        else None), borrowed)


def _placed(preset, factors, borrowed: Sequence[str]):
    """The preset with `factors` transferable and on each borrowed-curve class."""
    return preset.model_copy(update={"factors": factors, "gpu_factors": {
        **preset.gpu_factors, **{cls: factors for cls in borrowed}}})


def _borrowed_classes(runs: Sequence[MeasuredRun]) -> list[str]:
    from planner.published import gpu_class

    return sorted({gpu_class(r.cluster.gpu.name) or r.cluster.gpu.name for r in runs
                   if r.cluster.gpu.curve_is_borrowed})


def fit_stack_factors(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                      knobs: Sequence[str] = KNOBS):
    """The preset with `knobs` (of KNOBS: the GEMM scale, the layer-pass overhead, or both)
    fitted to the runs' measured step times; the runs' own GPU profiles are the base, a knob
    left out keeps its stock value. The factors are set as the transferable ones and as the
    gpu_factors of every borrowed-curve class among the runs (StackPreset.factors_for gives such
    a class stock factors otherwise), so they apply on every run's GPU, and they record the runs'
    precisions (StackFactors.precisions: another precision kind keeps stock)."""
    from scipy.optimize import least_squares

    knobs = [k for k in KNOBS if k in knobs]
    if not knobs:
        raise ValueError(f"no knob of {KNOBS} to fit")
    borrowed = _borrowed_classes(runs)
    measured = np.log(np.array([r.measured_step_time_s for r in runs], dtype=float))
    bounds = {"gemm_scale": (math.log(GEMM_SCALE_BOUNDS[0]), math.log(GEMM_SCALE_BOUNDS[1])),
              "layer_overhead_us": (0.0, LAYER_OVERHEAD_MAX_US / 1e3)}
    lo, hi = [bounds[k][0] for k in knobs], [bounds[k][1] for k in knobs]
    starts = {"gemm_scale": (0.0, 0.0, math.log(0.7)), "layer_overhead_us": (0.0, 1.0, 0.5)}

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict_with(_with_knobs(preset, x, knobs, borrowed), runs, layouts)) \
            - measured

    best = None
    # a few starts (flat spots), each once: one knob's starts can repeat
    for start in dict.fromkeys(tuple(starts[k][i] for k in knobs) for i in range(3)):
        res = least_squares(residuals, np.array(start), bounds=(lo, hi), loss="soft_l1",
                            f_scale=ROBUST_SCALE, diff_step=1e-3)
        if best is None or res.cost < best.cost:
            best = res
    f = _with_knobs(preset, best.x, knobs, borrowed).factors
    return _placed(preset, f.model_copy(update={
        "gemm_scale": round(f.gemm_scale, 4),
        "layer_overhead_us": None if f.layer_overhead_us is None
        else round(f.layer_overhead_us, 1),
        "precisions": precisions_of(runs)}), borrowed)


def knob_correlation(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                     step: float = 1e-2) -> float:
    """Correlation of the two knobs' least-squares estimates at the preset's factors (on the
    runs' first GPU class: its gpu_factors where it has them): r = C01 / sqrt(C00 C11) with
    C = (J^T J)^-1, J the derivatives of each run's log step time by the log GEMM scale and by
    the layer overhead (ms), by central differences. |r| near 1: the runs move both terms
    alike and cannot tell one knob from the other (any error in one is taken up by the other)."""
    borrowed = _borrowed_classes(runs)
    f = preset.factors_for(runs[0].cluster.gpu.name)
    x0 = np.array([math.log(f.gemm_scale),
                   (f.layer_overhead_us if f.layer_overhead_us is not None
                    else runs[0].cluster.gpu.layer_overhead_us) / 1e3])
    cols = []
    for j in range(2):
        d = np.zeros(2)
        d[j] = step
        lo = x0 - d
        lo[1] = max(lo[1], 0.0)
        up, dn = (np.log(predict_with(_with_knobs(preset, v, KNOBS, borrowed), runs, layouts))
                  for v in (x0 + d, lo))
        cols.append((up - dn) / (x0[j] + step - lo[j]))
    jac = np.column_stack(cols)
    norms = np.linalg.norm(jac, axis=0)
    if norms.min() <= 1e-9 * max(norms.max(), 1e-300):
        return 1.0  # a knob that moves no run: nothing tells it apart
    cov = np.linalg.inv(jac.T @ jac)
    return float(cov[0, 1] / math.sqrt(cov[0, 0] * cov[1, 1]))


def _folds(runs: Sequence[MeasuredRun]) -> list[np.ndarray]:
    """Held-out masks: each source, or with one source each model (fit_stacks' protocol)."""
    keys = [r.source_id for r in runs]
    if len(set(keys)) < 2:
        keys = [r.model.name for r in runs]
    labels = np.array(keys)
    return [labels == k for k in sorted(set(keys)) if (labels != k).sum() >= 2]


def choose_knobs(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                 ) -> tuple[tuple[str, ...], str]:
    """The knobs the runs can fit, and why. Both (KNOBS) where the runs separate them: their
    count discounted by the variance inflation of the two estimates' correlation r
    (knob_correlation, at the stock factors), n (1 - r^2), at least MIN_SEPARATING_RUNS.
    Below it one knob: the one whose fits predict the held-out folds (each source left out, or
    each model where there is one source) with the smaller median error; the GEMM scale where
    there are fewer than two folds."""
    r = knob_correlation(preset, runs, layouts)
    n_sep = len(runs) * (1.0 - r * r)
    stat = f"{len(runs)} runs x (1 - {r:.3f}^2) = {n_sep:.2f}"
    if n_sep >= MIN_SEPARATING_RUNS:
        return KNOBS, f"both knobs ({stat})"
    folds = _folds(runs)
    head = (f"one knob: {stat} < {MIN_SEPARATING_RUNS:g} (20 runs per knob at a variance "
            "inflation of 10), the runs cannot separate the GEMM scale from the layer-pass "
            "overhead")
    if len(folds) < 2:
        return KNOBS[:1], f"{head}; {KNOBS[0]} (fewer than two folds to choose by)"
    meas = np.array([x.measured_step_time_s for x in runs], dtype=float)
    scores = {}
    for knob in KNOBS:
        err = np.full(len(runs), np.nan)
        for held in folds:
            part = fit_stack_factors(preset, [x for x, h in zip(runs, held, strict=True) if not h],
                                     [x for x, h in zip(layouts, held, strict=True) if not h],
                                     (knob,))
            idx = np.flatnonzero(held)
            err[idx] = predict_with(part, [runs[i] for i in idx],
                                    [layouts[i] for i in idx]) / meas[idx] - 1
        err = np.abs(err[~np.isnan(err)])
        scores[knob] = (float(np.median(err)), float(np.quantile(err, 0.9)))
    best = min(KNOBS, key=lambda k: scores[k])
    held_by = "source" if len({x.source_id for x in runs}) > 1 else "model"
    return (best,), (f"{head}; {best} alone, by each {held_by} held out: " + ", ".join(
        f"{k} {m:.1%} median / {p:.1%} p90" for k, (m, p) in scores.items()))


def fit_stack_by_class(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                       knobs: Sequence[str] | None = None):
    """The preset fitted so that its factors mean the same on every GPU. Runs on a GPU whose
    GEMM curve is the chip's own (measured on it, GpuProfile.curve_is_borrowed false) fit
    the transferable `factors`: relative to each GPU's own curve, they carry to any GPU. Runs on
    a GPU whose curve is borrowed from another chip fit `gpu_factors` of that GPU class only:
    there the factor also absorbs the borrowed curve's error (the Megatron-LM 2021 preset's 0.68
    on V100, which carried to A100 turned -15% into +32..+43% on held-out runs, issue 19). With
    no run on an own-curve GPU the transferable factors stay the stock ones. Each set of factors
    records the precisions of its runs (fit_stack_factors).
    `knobs` None: each group (the own-curve runs, each borrowed class) fits the knobs its runs
    can separate (choose_knobs); the preset's provenance note says which and why."""
    from planner.published import gpu_class
    from planner.stacks import StackFactors

    base = preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
    notes: list[str] = []

    def fit(label: str, idx: list[int]):
        rs, ls = [runs[i] for i in idx], [layouts[i] for i in idx]
        use = knobs
        if use is None:
            use, why = choose_knobs(base, rs, ls)
            notes.append(f"{label} ({len(rs)} runs): {why}")
        return fit_stack_factors(base, rs, ls, use).factors

    own = [i for i, r in enumerate(runs) if not r.cluster.gpu.curve_is_borrowed]
    factors = fit("transferable", own) if own else StackFactors()
    by_class: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        if run.cluster.gpu.curve_is_borrowed:
            by_class.setdefault(gpu_class(run.cluster.gpu.name) or run.cluster.gpu.name,
                                []).append(i)
    gpu_factors = {cls: fit(cls, idx) for cls, idx in sorted(by_class.items())}
    out = base.model_copy(update={"factors": factors, "gpu_factors": gpu_factors})
    if notes:
        out = out.model_copy(update={"provenance": out.provenance.model_copy(
            update={"note": "; ".join(notes)})})
    return out

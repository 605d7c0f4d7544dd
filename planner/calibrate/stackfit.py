"""Fit a software stack's efficiency factors (StackFactors) on runs of that stack across GPUs.

One GEMM scale and one host time per layer pass per GPU class (each run predicted on its own
GPU profile with the factors applied through StackPreset.apply, the path `--stack` takes).
Robust least squares (soft-L1 at the same 5% log scale as planner.calibrate). Where the runs
cannot separate the two (too few for their estimates' correlation, MIN_SEPARATING_RUNS) one knob
is fitted; either way a factor is kept only where it predicts held-out runs better than the
stock factors (choose_knobs). benchmarks/accuracy.py --stacks fits the presets with it, split
by source.
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


def _held_out_errors(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                     folds: Sequence[np.ndarray], knobs: Sequence[str]) -> tuple[float, float]:
    """Median and p90 absolute error of the runs of each fold predicted by `knobs` fitted on
    the other folds' runs (no knob: the preset's stock factors, nothing fitted)."""
    meas = np.array([x.measured_step_time_s for x in runs], dtype=float)
    err = np.full(len(runs), np.nan)
    for held in folds:
        idx = np.flatnonzero(held)
        part = preset if not knobs else fit_stack_factors(
            preset, [x for x, h in zip(runs, held, strict=True) if not h],
            [x for x, h in zip(layouts, held, strict=True) if not h], knobs)
        err[idx] = predict_with(part, [runs[i] for i in idx],
                                [layouts[i] for i in idx]) / meas[idx] - 1
    err = np.abs(err[~np.isnan(err)])
    return float(np.median(err)), float(np.quantile(err, 0.9))


def choose_knobs(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                 ) -> tuple[tuple[str, ...], str]:
    """The knobs to fit on the runs (none: the stock factors), and why. The candidates: both
    (KNOBS) where the runs separate them, their count discounted by the variance inflation of
    the two estimates' correlation r (knob_correlation, at the stock factors), n (1 - r^2), at
    least MIN_SEPARATING_RUNS; else each knob alone. Each candidate, and no knob at all, is
    judged held out: each fold (each source left out, or each model where there is one source)
    predicted by a fit on the others; the smallest median error wins (then p90), no knob on a
    tie. A factor that does not predict held-out runs better than the stock factors is not kept
    (issue 19: nemo fitted on one of its sources made the other worse, 9.5% against 7.0% and
    16.0% against 13.9%). Fewer than two folds: nothing can judge a factor, stock."""
    r = knob_correlation(preset, runs, layouts)
    n_sep = len(runs) * (1.0 - r * r)
    stat = f"{len(runs)} runs x (1 - {r:.3f}^2) = {n_sep:.2f}"
    if n_sep >= MIN_SEPARATING_RUNS:
        head, candidates = f"both knobs separable ({stat})", [KNOBS]
    else:
        head = (f"one knob: {stat} < {MIN_SEPARATING_RUNS:g} (20 runs per knob at a variance "
                "inflation of 10), the runs cannot separate the GEMM scale from the layer-pass "
                "overhead")
        candidates = [(k,) for k in KNOBS]
    folds = _folds(runs)
    if len(folds) < 2:
        return (), f"{head}; stock factors (fewer than two folds to judge a factor by)"
    scores = {(): _held_out_errors(preset, runs, layouts, folds, ())}
    for knobs in candidates:
        scores[knobs] = _held_out_errors(preset, runs, layouts, folds, knobs)
    best = min(scores, key=lambda k: scores[k])  # stock first: it wins a tie
    held_by = "source" if len({x.source_id for x in runs}) > 1 else "model"
    return best, (f"{head}; {' + '.join(best) or 'stock factors'}, by each {held_by} held "
                  "out: " + ", ".join(f"{' + '.join(k) or 'stock'} {m:.1%} median / {p:.1%} p90"
                                      for k, (m, p) in scores.items()))


def fit_stack_by_class(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                       knobs: Sequence[str] | None = None):
    """The preset fitted per GPU class: the runs of each class (planner.published.gpu_class,
    else the GPU's name) fit that class's `gpu_factors`, relative to each GPU's own profile, and
    no factor travels to another class: the transferable `factors` stay stock, so a GPU class
    without runs of the stack predicts as the stock profile does (issue 19: "a factor fitted on
    one GPU must not travel to another as if it were a property of the software"). Measured:
    nemo fitted on Megatron-Bridge's runs (36 of its 49 own-curve runs Blackwell) carried a
    555 us layer pass to dgxc's H100 FP8 runs, +3.9% -> +9.8%; the Megatron-LM 2021 preset's
    V100 factor carried to A100 turned -15% into +32..+43%. Each set of factors records the
    precisions of its runs (fit_stack_factors).
    `knobs` None: each class fits the knobs its runs can separate and that beat the stock
    factors held out, or none (choose_knobs); the preset's provenance note says which and why."""
    from planner.published import gpu_class
    from planner.stacks import StackFactors

    base = preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
    notes: list[str] = []
    by_class: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        by_class.setdefault(gpu_class(run.cluster.gpu.name) or run.cluster.gpu.name,
                            []).append(i)
    gpu_factors = {}
    for cls, idx in sorted(by_class.items()):
        rs, ls = [runs[i] for i in idx], [layouts[i] for i in idx]
        use = knobs
        if use is None:
            use, why = choose_knobs(base, rs, ls)
            notes.append(f"{cls} ({len(rs)} runs): {why}")
        if use:
            gpu_factors[cls] = fit_stack_factors(base, rs, ls, use).factors
    out = base.model_copy(update={"gpu_factors": gpu_factors})
    if notes:
        out = out.model_copy(update={"provenance": out.provenance.model_copy(
            update={"note": "; ".join(notes)})})
    return out

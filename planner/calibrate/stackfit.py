"""Fit a software stack's efficiency factors (StackFactors) on runs of that stack across GPUs.

One GEMM scale and one host time per layer pass, shared by every GPU the runs used (each run
predicted on its own GPU profile with the factors applied through StackPreset.apply, the path
`--stack` takes). Robust least squares (soft-L1 at the same 5% log scale as planner.calibrate).
benchmarks/accuracy.py --stacks fits the presets with it, split by source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from planner.calibrate.fit import ROBUST_SCALE, predict_step_times
from planner.layout import Layout
from planner.measured.runs import MeasuredRun

GEMM_SCALE_BOUNDS = (0.3, 2.0)  # a stack 3x slower or 2x faster than the stock profiles' GEMMs
LAYER_OVERHEAD_MAX_US = 2e4  # 20 ms per layer pass: beyond any host overhead in the table


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


def fit_stack_factors(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                      fit_overhead: bool = True):
    """The preset with its GEMM scale (and layer overhead) fitted to the runs' measured step
    times; the runs' own GPU profiles are the base. The factors are set as the transferable ones
    and as the gpu_factors of every borrowed-curve class among the runs (StackPreset.factors_for
    gives such a class stock factors otherwise), so they apply on every run's GPU, and they
    record the runs' precisions (StackFactors.precisions: another precision kind keeps stock)."""
    from scipy.optimize import least_squares

    from planner.published import gpu_class
    from planner.stacks import StackFactors

    borrowed = sorted({gpu_class(r.cluster.gpu.name) or r.cluster.gpu.name for r in runs
                       if r.cluster.gpu.curve_is_borrowed})

    def placed(factors):
        return preset.model_copy(update={"factors": factors, "gpu_factors": {
            **preset.gpu_factors, **{cls: factors for cls in borrowed}}})

    measured = np.log(np.array([r.measured_step_time_s for r in runs], dtype=float))
    lo = [math.log(GEMM_SCALE_BOUNDS[0])] + ([0.0] if fit_overhead else [])
    hi = [math.log(GEMM_SCALE_BOUNDS[1])] + ([LAYER_OVERHEAD_MAX_US / 1e3] if fit_overhead
                                             else [])

    def with_x(x: np.ndarray):
        factors = StackFactors(gemm_scale=math.exp(x[0]),
                               layer_overhead_us=(1e3 * x[1]) if fit_overhead else None)
        return placed(factors)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict_with(with_x(x), runs, layouts)) - measured

    best = None
    for start in ([0.0, 0.0], [0.0, 1.0], [math.log(0.7), 0.5]):  # a few starts: flat spots
        x0 = np.array(start[: len(lo)])
        res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1",
                            f_scale=ROBUST_SCALE, diff_step=1e-3)
        if best is None or res.cost < best.cost:
            best = res
    fitted = with_x(best.x)
    factors = fitted.factors.model_copy(update={
        "gemm_scale": round(fitted.factors.gemm_scale, 4),
        "layer_overhead_us": None if fitted.factors.layer_overhead_us is None
        else round(fitted.factors.layer_overhead_us, 1),
        "precisions": precisions_of(runs)})
    return placed(factors)


def fit_stack_by_class(preset, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
                       fit_overhead: bool = True):
    """The preset fitted so that its factors mean the same on every GPU. Runs on a GPU whose
    GEMM curve is the chip's own (measured on it, GpuProfile.curve_is_borrowed false) fit
    the transferable `factors`: relative to each GPU's own curve, they carry to any GPU. Runs on
    a GPU whose curve is borrowed from another chip fit `gpu_factors` of that GPU class only:
    there the factor also absorbs the borrowed curve's error (the Megatron-LM 2021 preset's 0.68
    on V100, which carried to A100 turned -15% into +32..+43% on held-out runs, issue 19). With
    no run on an own-curve GPU the transferable factors stay the stock ones. Each set of factors
    records the precisions of its runs (fit_stack_factors)."""
    from planner.published import gpu_class
    from planner.stacks import StackFactors

    base = preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
    own = [i for i, r in enumerate(runs) if not r.cluster.gpu.curve_is_borrowed]
    factors = StackFactors()
    if own:
        factors = fit_stack_factors(base, [runs[i] for i in own], [layouts[i] for i in own],
                                    fit_overhead).factors
    by_class: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        if run.cluster.gpu.curve_is_borrowed:
            by_class.setdefault(gpu_class(run.cluster.gpu.name) or run.cluster.gpu.name,
                                []).append(i)
    gpu_factors = {cls: fit_stack_factors(base, [runs[i] for i in idx],
                                          [layouts[i] for i in idx], fit_overhead).factors
                   for cls, idx in sorted(by_class.items())}
    return base.model_copy(update={"factors": factors, "gpu_factors": gpu_factors})

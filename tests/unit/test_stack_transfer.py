"""Stack factors that mean the same on every GPU (issue 19 section 2): a factor fitted on a GPU
whose GEMM curve is borrowed from another chip stays on that GPU class; one fitted on a GPU
with its own curve travels, checked by fitting a stack on one GPU's runs and predicting another
GPU's runs."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from planner.calibrate.stackfit import fit_stack_by_class, fit_stack_factors, predict_with
from planner.registry import load_gpu
from planner.stacks import StackFactors, resolve_stack


@cache
def _runs(stack: str, gpu: str, every: int = 1) -> tuple:
    """Timed published runs of a stack on one GPU whose layout the table states in full."""
    from planner.measured.runs import load_table

    runs, _ = load_table()
    out = [r for r in runs if r.stack == stack and r.cluster.gpu.name == gpu
           and r.measured_step_time_s and r.layout is not None]
    return tuple(out[::every])


def _median_err(preset, runs) -> tuple[float, float]:
    layouts = [r.layout for r in runs]
    meas = np.array([r.measured_step_time_s for r in runs])
    err = predict_with(preset, list(runs), layouts) / meas - 1
    return float(np.median(np.abs(err))), float(np.median(err))


@pytest.mark.parametrize("gpu,borrowed", [("V100-SXM2-16GB", True), ("GB300-NVL72", True),
                                          ("A100-SXM4-80GB", False), ("H100-SXM", False),
                                          ("GB200-NVL72", False)])
def test_borrowed_curves_are_the_ones_their_sources_say(gpu, borrowed):
    assert load_gpu(gpu).curve_is_borrowed is borrowed


def test_a_factor_fitted_on_a_borrowed_curve_stays_on_its_gpu_class():
    """The Megatron-LM 2021 runs are all V100 (DLPerf), whose profile borrows the A100's GEMM
    curve: the fit keeps its factor on the V100 class and leaves the transferable factors at the
    stock ones, so on an A100 the preset predicts what the stock profile does (issue 19: the old
    shared x0.68 made held-out A100 runs +32..+43%)."""
    runs = _runs("megatron-lm-2021", "V100-SXM2-16GB")
    assert len(runs) >= 10
    base = resolve_stack("megatron-lm-2021")
    fitted = fit_stack_by_class(base, list(runs), [r.layout for r in runs],
                                knobs=("gemm_scale",))
    assert fitted.factors == StackFactors()
    v100 = fitted.gpu_factors["V100-SXM2"]
    assert v100.gemm_scale < 0.85  # DLPerf's V100 runs are slower than the borrowed A100 curve
    a100 = load_gpu("A100-SXM4-80GB")
    assert fitted.apply(a100) == a100
    assert fitted.factors_for("V100-SXM2-32GB") == v100  # the class, both memory sizes
    # the class factor improves its own runs over the stock factors (computed, not assumed)
    stock = base.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
    assert _median_err(fitted, runs)[0] < _median_err(stock, runs)[0]


def test_committed_preset_keeps_the_v100_factor_off_other_gpus():
    """The V100 class has its own factor, one knob (DLPerf's runs cannot separate the two:
    stackfit.choose_knobs, test_stack_knobs), and no other GPU gets it."""
    preset = resolve_stack("megatron-lm-2021")
    assert preset.factors_for("A100-SXM4-80GB") == StackFactors()
    v100 = preset.factors_for("V100-SXM2-16GB")
    assert v100 != StackFactors()
    assert (v100.gemm_scale != 1.0) != (v100.layer_overhead_us is not None)


def test_transferable_factors_do_not_carry_to_a_borrowed_curve():
    """A preset fitted on own-curve GPUs only (no gpu_factors): its factors apply on GB200
    (the curve measured on it), not on GB300 (GB200's curve borrowed), which keeps stock; a class
    with its own factors gets them. Old code gave GB300 the transferable x1.2 / 500 us."""
    fitted = resolve_stack("nemo").model_copy(update={
        "factors": StackFactors(gemm_scale=1.2, layer_overhead_us=500.0), "gpu_factors": {}})
    gb200, gb300 = load_gpu("GB200-NVL72"), load_gpu("GB300-NVL72")
    assert fitted.apply(gb300) == gb300
    assert fitted.factors_for("GB300-NVL72") == StackFactors()  # built-in profile looked up
    assert fitted.factors_for("V100-SXM2-16GB") == StackFactors()
    assert fitted.factors_for("B200-SXM") == fitted.factors
    on200 = fitted.apply(gb200)
    assert on200.layer_overhead_us == 500.0
    for (n0, e0), (n1, e1) in zip(gb200.gemm_efficiency.points, on200.gemm_efficiency.points,
                                  strict=True):
        assert n0 == n1 and e1 == pytest.approx(min(1.0, 1.2 * e0))
    own = StackFactors(gemm_scale=1.8, layer_overhead_us=1240.0)
    with_own = fitted.model_copy(update={"gpu_factors": {"GB300": own}})
    assert with_own.apply(gb300).layer_overhead_us == 1240.0
    assert with_own.factors_for("GB300-NVL72") == own


# the stock band when this bound was set (6.9%, the error between layouts of a job on BLOOM and
# DLPerf); the ranking band is now measured data (planner/data/step_time_bands.yaml) and wider
# with the nanotron sweep, so the bound keeps its number rather than loosening with the data
BETWEEN_LAYOUTS_BAND = 0.069


def test_a_stack_fitted_on_one_gpu_predicts_another():
    """llm-foundry's FSDP runs: fit the pytorch-fsdp factors on the A100-80GB runs (relative to
    the A100 profile) and predict the H100 runs on the H100 profile. Bound: the H100 runs' own
    fit (the floor two factors can reach there) plus one stock band (the model's documented 1-sigma
    error between layouts of a job, 6.9%): a factor that means the same on both GPUs loses at
    most the band by travelling. Measured: 7.7% against an own-fit floor of 4.9% (all runs)."""
    fit_runs = _runs("pytorch-fsdp", "A100-SXM4-80GB", 2)
    target = _runs("pytorch-fsdp", "H100-SXM", 2)
    assert len(fit_runs) >= 20 and len(target) >= 20
    stock = resolve_stack("pytorch-fsdp").model_copy(update={"factors": StackFactors(),
                                                             "gpu_factors": {}})
    moved = fit_stack_factors(stock, list(fit_runs), [r.layout for r in fit_runs])
    own = fit_stack_factors(stock, list(target), [r.layout for r in target])
    moved_err, moved_signed = _median_err(moved, target)
    own_err, _ = _median_err(own, target)
    assert moved_err <= own_err + BETWEEN_LAYOUTS_BAND
    assert abs(moved_signed) <= 0.10  # no large bias travels with the factor

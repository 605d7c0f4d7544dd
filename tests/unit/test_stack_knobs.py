"""A stack preset's knobs where the runs cannot separate them (planner.calibrate.stackfit):
DLPerf's 18 V100 runs of Megatron-LM 2021 move the GEMM scale and the layer-pass overhead
alike and are too few for it, so the fitter fits one of them, the one that predicts held-out
models better. Checked on synthetic runs made from the cost model with a known factor: the fit
must recover it, and pick the knob the runs were made with."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from planner.calibrate.stackfit import (
    KNOBS,
    MIN_SEPARATING_RUNS,
    choose_knobs,
    fit_stack_by_class,
    fit_stack_factors,
    knob_correlation,
    predict_with,
)
from planner.stacks import StackFactors, resolve_stack
from tests.unit.test_stack_transfer import _runs


def _stock(name: str):
    return resolve_stack(name).model_copy(update={"factors": StackFactors(), "gpu_factors": {}})


def _synthetic(factors: StackFactors):
    """DLPerf's runs (models, layouts, one-NIC cluster) with step times made by the cost model
    with `factors` on the V100 class: what a fit must give back."""
    runs = list(_runs("megatron-lm-2021", "V100-SXM2-16GB"))
    made = _stock("megatron-lm-2021").model_copy(update={"gpu_factors": {"V100-SXM2": factors}})
    times = predict_with(made, runs, [r.layout for r in runs])
    return [replace(r, measured_step_time_s=float(t)) for r, t in zip(runs, times, strict=True)]


@pytest.mark.parametrize("knob,made", [
    ("gemm_scale", StackFactors(gemm_scale=0.7)),
    ("layer_overhead_us", StackFactors(layer_overhead_us=1500.0)),
])
def test_one_knob_fit_recovers_a_known_factor(knob, made):
    runs = _synthetic(made)
    fitted = fit_stack_factors(_stock("megatron-lm-2021"), runs, [r.layout for r in runs],
                               (knob,))
    v100 = fitted.gpu_factors["V100-SXM2"]
    assert v100.gemm_scale == pytest.approx(made.gemm_scale, abs=2e-4)
    if made.layer_overhead_us is None:
        assert v100.layer_overhead_us is None  # the knob not fitted keeps the profile's
    else:
        assert v100.layer_overhead_us == pytest.approx(made.layer_overhead_us, abs=1.0)


def test_dlperf_runs_cannot_separate_the_two_knobs():
    """The correlation of the two estimates, by a second method: for two knobs (JtJ)^-1 has
    off-diagonal -b / det and diagonal d / det, a / det, so r = -cos of the angle between the
    two columns of J (each run's d log t by d log gemm, and by the layer overhead in ms),
    here by forward differences."""
    runs = list(_runs("megatron-lm-2021", "V100-SXM2-16GB"))
    lays = [r.layout for r in runs]
    stock = _stock("megatron-lm-2021")
    base = np.log(predict_with(stock, runs, lays))
    d = 1e-2  # 10 us of overhead: above the 1 us floor that stands for none (specs.adjust)
    gemm = np.log(predict_with(stock.model_copy(update={"gpu_factors": {"V100-SXM2": StackFactors(
        gemm_scale=float(np.exp(d)))}}), runs, lays)) - base
    over = np.log(predict_with(stock.model_copy(update={"gpu_factors": {"V100-SXM2": StackFactors(
        layer_overhead_us=1e3 * d)}}), runs, lays)) - base  # the V100 profile's overhead is 0
    assert np.all(gemm < 0) and np.all(over > 0)
    r = -gemm @ over / np.linalg.norm(gemm) / np.linalg.norm(over)
    assert knob_correlation(stock, runs, lays) == pytest.approx(r, abs=2e-3)
    assert r > 0.95  # a variance inflation 1 / (1 - r^2) above 10
    assert len(runs) * (1 - r * r) < MIN_SEPARATING_RUNS


def test_separable_runs_fit_both_knobs():
    """llm-foundry's FSDP runs on A100 (1B-70B, micro-batches 1-32) separate the knobs: the
    candidate is both together, judged held out against the stock factors (which one is kept
    is test_stack_naming's subject)."""
    runs = list(_runs("pytorch-fsdp", "A100-SXM4-80GB"))
    assert len(runs) >= 40
    knobs, why = choose_knobs(_stock("pytorch-fsdp"), runs, [r.layout for r in runs])
    assert knobs in (KNOBS, ()) and "both knobs separable" in why, why
    assert "gemm_scale + layer_overhead_us" in why
    assert not re.search(r", (gemm_scale|layer_overhead_us) \d", why)  # no one-knob candidate


@pytest.mark.parametrize("knob,made", [
    ("gemm_scale", StackFactors(gemm_scale=0.7)),
    ("layer_overhead_us", StackFactors(layer_overhead_us=1500.0)),
])
def test_collinear_runs_fit_the_knob_they_were_made_with(knob, made):
    """On DLPerf's runs (below the threshold) the fitter keeps one knob, chosen by each model
    held out: the one the synthetic times were made with predicts them exactly, so it wins and
    its value comes back; the transferable factors stay stock (V100's curve is borrowed)."""
    runs = _synthetic(made)
    fitted = fit_stack_by_class(_stock("megatron-lm-2021"), runs, [r.layout for r in runs])
    assert fitted.factors == StackFactors()
    v100 = fitted.gpu_factors["V100-SXM2"]
    assert v100.gemm_scale == pytest.approx(made.gemm_scale, abs=2e-4)
    assert (v100.layer_overhead_us is None) == (made.layer_overhead_us is None)
    if made.layer_overhead_us is not None:
        assert v100.layer_overhead_us == pytest.approx(made.layer_overhead_us, abs=1.0)
    assert f"; {knob}, by each model held out" in fitted.provenance.note

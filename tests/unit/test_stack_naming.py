"""Naming the stack never makes a source worse (issue 19): a stack's factors are fitted per GPU
class (no factor travels to a class without runs) and kept only where, fitted without a source,
they predict that source better than the stock factors (planner.calibrate.stackfit.choose_knobs).
Checked on synthetic runs made from the cost model with known factors: two sources of one
stack that disagree (the fit on either moves the other the wrong way: stock must be kept) and
two that agree (the factor must be kept, at the value the runs were made with)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.calibrate.stackfit import choose_knobs, fit_stack_by_class, predict_with
from planner.stacks import StackFactors, resolve_stack
from tests.unit.test_stack_transfer import _runs

CLASS = "A100-SXM"  # planner.published.GPU_CLASSES of A100-SXM4-80GB


def _stock():
    return resolve_stack("pytorch-fsdp").model_copy(update={"factors": StackFactors(),
                                                            "gpu_factors": {}})


def _two_sources(gemm_a: float, gemm_b: float):
    """llm-foundry's A100 runs (every other one) split into two sources 'a' and 'b' by
    alternating rows, their step times made by the cost model with GEMM scale gemm_a on the
    first and gemm_b on the second."""
    runs = list(_runs("pytorch-fsdp", "A100-SXM4-80GB", 2))
    assert len(runs) >= 20
    out = []
    for i, run in enumerate(runs):
        gemm = gemm_a if i % 2 == 0 else gemm_b
        made = _stock().model_copy(update={"gpu_factors": {CLASS: StackFactors(gemm_scale=gemm)}})
        t = predict_with(made, [run], [run.layout])[0]
        out.append(replace(run, source_id="a" if i % 2 == 0 else "b",
                           measured_step_time_s=float(t)))
    return out


def _abs_err(preset, runs) -> np.ndarray:
    meas = np.array([r.measured_step_time_s for r in runs])
    return np.abs(predict_with(preset, runs, [r.layout for r in runs]) / meas - 1)


def test_sources_that_disagree_keep_the_stock_factors():
    """Source a runs 25% faster GEMMs than stock, source b 20% slower (1 / 1.25): a factor fitted
    on either predicts the other worse than stock does. The errors are computed here directly
    with the factors the fits recover (each source's own, exactly: the times were made with
    it): carried, the other source's factor misses by t(1.25) / t(0.8) - 1, stock by
    t(1) / t(0.8) - 1, smaller since the step time falls with the GEMM scale."""
    runs = _two_sources(1.25, 0.8)
    a = [r for r in runs if r.source_id == "a"]
    b = [r for r in runs if r.source_id == "b"]
    with_a = _stock().model_copy(update={"gpu_factors": {CLASS: StackFactors(gemm_scale=1.25)}})
    with_b = _stock().model_copy(update={"gpu_factors": {CLASS: StackFactors(gemm_scale=0.8)}})
    carried = np.median(np.concatenate([_abs_err(with_b, a), _abs_err(with_a, b)]))
    stock = np.median(np.concatenate([_abs_err(_stock(), a), _abs_err(_stock(), b)]))
    assert stock < carried and stock > 0.05  # the premise, by the second method
    knobs, why = choose_knobs(_stock(), runs, [r.layout for r in runs])
    assert knobs == (), why
    assert f"stock {stock:.1%} median" in why  # the held-out judge saw the same stock error
    fitted = fit_stack_by_class(_stock(), runs, [r.layout for r in runs])
    assert fitted.gpu_factors == {} and fitted.factors == StackFactors()
    assert "stock factors, by each source held out" in fitted.provenance.note


def test_sources_that_agree_keep_the_factor():
    """Both sources made with GEMM x0.8: a fit on either predicts the other exactly, better
    than stock (its error there is t(1) / t(0.8) - 1, computed directly), so the class keeps a
    factor, x0.8 where it is the GEMM scale; a class without runs (H100, B200) stays stock."""
    runs = _two_sources(0.8, 0.8)
    stock_err = np.median(_abs_err(_stock(), runs))
    assert stock_err > 0.05
    knobs, why = choose_knobs(_stock(), runs, [r.layout for r in runs])
    assert knobs, why
    fitted = fit_stack_by_class(_stock(), runs, [r.layout for r in runs])
    a100 = fitted.gpu_factors[CLASS]
    if "gemm_scale" in knobs:
        assert a100.gemm_scale == pytest.approx(0.8, abs=2e-3)
    assert np.median(_abs_err(fitted, runs)) < 0.005
    assert fitted.factors == StackFactors()
    assert fitted.factors_for("H100-SXM") == StackFactors()
    assert fitted.factors_for("B200-SXM") == StackFactors()
    assert fitted.factors_for("A100-SXM4-40GB", precision="bf16") == a100  # its class


def test_a_class_factor_does_not_travel_to_another_class():
    """Runs on two GPU classes fitted together: each class gets its own factor (A100 made with
    x0.8, H100 with stock), never one shared value. A factor shared by both would put the
    H100 runs off by what x0.8 does to them; the class fit leaves H100 stock or at a value that
    predicts its runs as stock does."""
    a100 = _two_sources(0.8, 0.8)
    h100 = [replace(r, source_id="a" if i % 2 == 0 else "b")
            for i, r in enumerate(_runs("pytorch-fsdp", "H100-SXM", 2))]
    stock_h = _stock()
    h100 = [replace(r, measured_step_time_s=float(t)) for r, t in zip(
        h100, predict_with(stock_h, h100, [r.layout for r in h100]), strict=True)]
    runs = a100 + h100
    fitted = fit_stack_by_class(_stock(), runs, [r.layout for r in runs])
    assert CLASS in fitted.gpu_factors
    assert "H100/H200-SXM" not in fitted.gpu_factors  # stock predicts them exactly: ties keep it
    shared = _stock().model_copy(update={"factors": fitted.gpu_factors[CLASS]})
    assert np.median(_abs_err(shared, h100)) > 0.05  # what travelling would have cost
    assert np.median(_abs_err(fitted, h100)) < 1e-9

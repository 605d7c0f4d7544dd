"""planner.calibrate.bounds: a fit stops at the best measured kernel of its kind (a machine whose
best fit lies beyond it is fitted at it), and every committed profile lies within the bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import planner.calibrate.fit as fit_module
from planner.calibrate import (
    FewShotPrior,
    apply_values,
    calibrate,
    few_shot_fit,
    predict_step_times,
)
from planner.calibrate.bounds import bound_rows, fit_knobs
from planner.layout import Layout
from planner.measured.runs import MeasuredRun
from planner.registry import builtin_gpus, load_gpu
from planner.specs import ClusterSpec, JobSpec, ModelSpec
from planner.specs.adjust import LAYER_OVERHEAD_FLOOR_US, knobs_for, stock_values

MODEL = ModelSpec(name="gpt-h4096", num_hidden_layers=4, hidden_size=4096,
                  num_attention_heads=32, intermediate_size=16384, vocab_size=32000,
                  activation="gelu")
LAYOUTS = [Layout(tp=tp, dp=16 // tp, mbs=mbs, zero=1) for tp in (1, 2, 4, 8) for mbs in (1, 2)]


def _runs(truth, attention: str):
    """Runs on 2 nodes x 8 H100 (TP inside a node, DP across the NICs), seq 8192 so that the
    attention core is a large share; 'measured' = the cost model on `truth`, no noise."""
    base = load_gpu("H100-SXM")
    cluster = ClusterSpec(gpu=base, num_nodes=2, gpus_per_node=8)
    job = JobSpec(seq_len=8192, global_batch=64, attention=attention)
    runs = [MeasuredRun(f"syn:{i}", "synthetic", MODEL, cluster, job, lay.as_dict(), 1.0)
            for i, lay in enumerate(LAYOUTS)]
    times = predict_step_times(truth, runs, LAYOUTS)
    return base, [dataclasses.replace(r, measured_step_time_s=float(t))
                  for r, t in zip(runs, times, strict=True)]


# knob -> (attention kernel of the runs, how far beyond its measured bound the truth lies)
BEYOND = {"fused_attention_efficiency": ("cudnn", 1.25), "attention_efficiency": ("flash", 1.4),
          "gemm_scale": ("cudnn", 1.15), "intra_bw_scale": ("cudnn", 1.5),
          "inter_bw_scale": ("cudnn", 1.2)}


@pytest.mark.parametrize("knob", sorted(BEYOND))
def test_a_fit_stops_at_the_measured_bound(knob, monkeypatch):
    """The synthetic machine's `knob` lies beyond its measured bound on the H100 (fused attention
    0.94 against FlashAttention-3's 0.75, ...): the fit puts it at the bound, and with only the
    physical bounds (specs.adjust.knobs_for) the same fit goes past the bound toward the truth
    (within 10%: the weak stock prior pulls a knob that moves the runs little, the DP traffic
    mostly hidden under backward), so the bound is what stops it."""
    attention, factor = BEYOND[knob]
    base = load_gpu("H100-SXM")
    bound = {k.name: k for k in fit_knobs(base)}[knob]
    physical = {k.name: k for k in knobs_for(base)}[knob]
    truth_value = min(bound.hi * factor, physical.hi)
    assert truth_value > bound.hi * 1.1
    base, runs = _runs(apply_values(base, {knob: truth_value}), attention)
    fitted = calibrate(base, runs, layouts=LAYOUTS, names=[knob], cross_validate=False)
    assert fitted.values[knob] == pytest.approx(bound.hi, rel=2e-3)
    monkeypatch.setattr(fit_module, "fit_knobs", knobs_for)
    free = calibrate(base, runs, layouts=LAYOUTS, names=[knob], cross_validate=False)
    assert free.values[knob] > 1.05 * bound.hi
    assert free.values[knob] == pytest.approx(truth_value, rel=0.1)


def test_the_few_shot_fit_stops_at_the_same_bound(monkeypatch):
    """few_shot_fit takes its knobs (and _theta_bounds its box) from fit_knobs too: the same
    machine's fused attention (0.94), the one candidate of the prior, is fitted at
    FlashAttention-3's 0.75 (the MAP step and the uniform bias step both stop there); with the
    physical bounds it goes past."""
    import planner.calibrate.fewshot as fewshot

    base = load_gpu("H100-SXM")
    base, runs = _runs(apply_values(base, {"fused_attention_efficiency": 0.94}), "cudnn")
    prior = FewShotPrior(sd={"fused_attention_efficiency": 0.3}, noise=0.02)
    fit = few_shot_fit(base, runs, layouts=LAYOUTS, prior=prior, cross_validate=False)
    assert fit.fitted == ["fused_attention_efficiency"]
    assert fit.profile.fused_attention_efficiency == pytest.approx(0.75, rel=2e-3)
    monkeypatch.setattr(fewshot, "fit_knobs", knobs_for)
    free = few_shot_fit(base, runs, layouts=LAYOUTS, prior=prior, cross_validate=False)
    assert free.profile.fused_attention_efficiency > 0.8


# The measured ceilings typed from docs/hardware.md 2.1 (MAMF tables, FlashAttention), not read
# from planner.calibrate.bounds: the committed (fitted) profiles must lie below them
HAND = {
    "H100-SXM": {"gemm": 794.5 / 989, "fp8": 1402.6 / 1979, "attention": 370 / 989,
                 "fused": 0.75},
    "H200-SXM": {"gemm": 794.5 / 989, "fp8": 1453.4 / 1979, "attention": 370 / 989,
                 "fused": 0.75},
    "A100-SXM4-80GB": {"gemm": 271.2 / 312, "attention": 0.73},
    "GB200-NVL72": {"gemm": 1822 / 2500, "fp8": 3615.6 / 5000},
    "B200-SXM": {"gemm": 1745 / 2250, "fp8": 3432.5 / 4500},
}
ROUNDING = 5e-4  # the YAMLs keep curve points to 3 decimals (accuracy.write_stock_profile)


def test_committed_profiles_lie_within_the_measured_ceilings():
    gpus = builtin_gpus()
    for name, ceilings in HAND.items():
        gpu = gpus[name]
        got = {"gemm": max(y for _, y in gpu.gemm_efficiency.points),
               "fp8": max(y for _, y in (gpu.fp8_gemm_efficiency or gpu.gemm_efficiency).points),
               "attention": gpu.attention_efficiency,
               "fused": gpu.fused_attention_efficiency or 0.0}
        for quantity, top in ceilings.items():
            assert got[quantity] <= top + ROUNDING, (name, quantity, got[quantity], top)


def test_every_committed_profile_knob_lies_within_its_bound():
    """Every fitted knob of every committed profile, at its stock value (the profile as it is),
    inside [lo, hi] of fit_knobs; each bound names its source (a measurement, or says it is the
    physical one). A layer overhead of 0 is the knob's floor (1 us stands for none)."""
    for gpu in builtin_gpus().values():
        value = stock_values(gpu)
        value["layer_overhead_us"] = max(value["layer_overhead_us"], LAYER_OVERHEAD_FLOOR_US)
        for knob, lo, hi, source in bound_rows(gpu):
            assert lo - 1e-12 <= value[knob] <= hi * (1 + ROUNDING), (gpu.name, knob, value[knob])
            assert source, (gpu.name, knob)


def test_bounds_only_tighten_the_physical_ones():
    """fit_knobs never loosens knobs_for (efficiency <= 1, the search ranges): the measured
    bound is at most the physical one, and a GPU without any measurement keeps it (L40S)."""
    for gpu in builtin_gpus().values():
        for tight, loose in zip(fit_knobs(gpu), knobs_for(gpu), strict=True):
            assert tight.name == loose.name and tight.lo == loose.lo
            assert tight.hi <= loose.hi
    l40s = load_gpu("L40S")
    by_name = {k.name: k for k in fit_knobs(l40s)}
    free = {k.name: k for k in knobs_for(l40s)}
    for name in ("gemm_scale", "attention_efficiency", "hbm_efficiency", "intra_bw_scale"):
        assert by_name[name].hi == free[name].hi
    # the scale-out tier: a ring's bus bandwidth is at most the NIC's line rate (12.5 GB/s per
    # L40S, curve plateau 12.0): 12.5 / 12.0
    assert by_name["inter_bw_scale"].hi == pytest.approx(12.5 / 12.0)
    assert np.isclose(by_name["inter_bw_scale"].hi * 12.0, l40s.inter_node.link_gb_per_s)

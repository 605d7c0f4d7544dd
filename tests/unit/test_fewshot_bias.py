"""The default few-shot fit removes a uniform bias (issue 20, "Runs a user made"): on the
recorded CPU loop (validate/measured: a `planner profile` of this machine and ten validate runs)
and when the prior holds every knob at the preset; the calibrate figure's band is the fitted
profile's step_time_rel_error."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
from calib_fixtures import a100_like

from planner.calibrate.fewshot import UNIFORM, FewShotPrior, few_shot_fit
from planner.calibrate.fit import predict_step_times
from planner.layout import Layout
from planner.measured.runs import MeasuredRun, load_records
from planner.registry import load_gpu
from planner.specs import ClusterSpec, JobSpec, ModelSpec
from planner.stacks import resolve_stack

ROOT = Path(__file__).resolve().parents[2]


def _cpu_loop():
    gpu = load_gpu(str(ROOT / "validate/measured/cpu-gloo-2proc.yaml"))
    runs, skipped = load_records(ROOT / "validate/measured/runs-cpu.jsonl", gpu)
    assert not skipped and len(runs) == 10
    return gpu, runs


def test_the_cpu_loop_leaves_no_bias_beyond_the_noise_floor():
    gpu, runs = _cpu_loop()
    fit = few_shot_fit(gpu, runs, stack=resolve_stack(None), cross_validate=False)
    before = np.median(np.log(fit.pred_before / fit.measured))
    after = np.median(np.log(fit.pred_after / fit.measured))
    assert before < -0.5  # the profile's peaks are not what DTensor + gloo runs reach
    assert abs(after) <= fit.prior.noise  # no bias left beyond the model's own floor
    # and the runs are reproduced better than before, run by run in the median
    assert np.median(np.abs(fit.err_after)) < 0.6 * np.median(np.abs(fit.err_before))


def _model(hidden: int) -> ModelSpec:
    return ModelSpec(name=f"h{hidden}", num_hidden_layers=8, hidden_size=hidden,
                     num_attention_heads=16, num_key_value_heads=16, intermediate_size=4 * hidden,
                     vocab_size=32000, seq_len=2048, global_batch=64, activation="gelu")


def test_a_bias_the_prior_holds_the_knobs_against_is_removed_uniformly():
    """Runs 1.6x slower than the profile predicts, every one, and a prior so tight (1% on each
    knob) that MAP cannot move the knobs: the fit's last step scales every rate the runs move
    by one factor, so the runs' median error goes to ~0 (the factor is 1 / 1.6 up to the parts
    of the step no knob moves)."""
    gpu = a100_like()
    runs, layouts = [], []
    for hidden, tp in ((1024, 1), (2048, 2), (4096, 8)):
        cluster = ClusterSpec(gpu=gpu, num_nodes=1, gpus_per_node=8)
        layout = Layout(tp=tp, dp=8 // tp, mbs=1, zero=1)
        runs.append(MeasuredRun(f"r{len(runs)}", "syn", _model(hidden), cluster,
                                JobSpec(seq_len=2048, global_batch=64), layout.as_dict(), 1.0))
        layouts.append(layout)
    truth = 1.6 * predict_step_times(gpu, runs, layouts)
    runs = [dataclasses.replace(r, measured_step_time_s=float(t))
            for r, t in zip(runs, truth, strict=True)]
    tight = FewShotPrior(sd={k: 0.01 for k in ("gemm_scale", "layer_overhead_us",
                                               "attention_efficiency", "intra_bw_scale",
                                               "inter_bw_scale", "dp_overlap")}, noise=0.03)
    fit = few_shot_fit(gpu, runs, layouts=layouts, prior=tight, cross_validate=False)
    assert np.median(fit.err_before) < -0.35  # 1 / 1.6 - 1 = -37.5%
    assert abs(np.median(np.log(fit.pred_after / fit.measured))) < 0.01
    # the times of the terms it scales go up by at least 1.6 (the rest of the step, the parts
    # no knob moves such as fixed latencies, does not move)
    factor = float(re.search(r"times by ([0-9.]+)", fit.kept[UNIFORM]).group(1))
    assert 1.6 <= factor < 2.0


def test_the_calibrate_figure_draws_the_profiles_band():
    from planner.figures import calibration_figure

    gpu, runs = _cpu_loop()
    fit = few_shot_fit(gpu, runs[:4], stack=resolve_stack(None), cross_validate=True)
    fig = calibration_figure(fit)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    band = next(label for label in labels if label.startswith("band"))
    assert band == f"band +/-{fit.profile.step_time_rel_error:.1%} (1 sigma)"

"""planner.calibrate: the fit recovers known parameters from synthetic runs, stays in physical
bounds, shrugs off an outlier, writes a loadable profile; prediction bands; the CLI."""

from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from calib_fixtures import a100_like

from planner.calibrate import (
    apply_values,
    calibrate,
    knobs_for,
    predict_step_times,
    profile_yaml,
)
from planner.layout import Layout
from planner.measured.runs import MeasuredRun
from planner.registry import load_gpu
from planner.search.bands import plans_indistinguishable
from planner.specs import ClusterSpec, JobSpec, ModelSpec

# The parameters the synthetic "machine" really has (the fixture profile is the starting point).
TRUE = {"gemm_scale": 0.85, "gemm_size_log2": 1.0, "intra_bw_scale": 0.6, "step_overhead_s": 0.02}
NOISE = 0.01  # 1% log-normal measurement noise


def _model(hidden: int) -> ModelSpec:
    return ModelSpec(name=f"gpt-h{hidden}", num_hidden_layers=4, hidden_size=hidden,
                     num_attention_heads=16, intermediate_size=4 * hidden, vocab_size=32000,
                     activation="gelu")


def synthetic_runs(noise: float = NOISE, seed: int = 0, hiddens=(1024, 2048, 4096),
                   tps=(1, 2, 4, 8), mbss=(1, 4)):
    """Runs whose 'measured' step time is the cost model's prediction on the TRUE profile times
    log-normal noise: one node of 8 GPUs, three widths (GEMM sizes), TP 1-8 (TP traffic)."""
    base = a100_like()
    runs, layouts = [], []
    cluster = ClusterSpec(gpu=base, num_nodes=1, gpus_per_node=8)
    job = JobSpec(seq_len=1024, global_batch=32)
    for hidden in hiddens:
        model = _model(hidden)
        for tp in tps:
            for mbs in mbss:
                layout = Layout(tp=tp, dp=8 // tp, mbs=mbs, zero=1)
                runs.append(MeasuredRun(f"syn:{len(runs)}", "synthetic", model, cluster, job,
                                        layout.as_dict(), 1.0))
                layouts.append(layout)
    truth = predict_step_times(apply_values(base, TRUE), runs, layouts)
    rng = np.random.default_rng(seed)
    measured = truth * np.exp(rng.normal(0.0, noise, len(runs)))
    runs = [dataclasses.replace(r, measured_step_time_s=float(t))
            for r, t in zip(runs, measured, strict=True)]
    return base, runs, layouts


def test_fit_recovers_known_parameters():
    base, runs, layouts = synthetic_runs()
    fit = calibrate(base, runs, layouts=layouts, names=list(TRUE), cross_validate=False)
    assert set(fit.fitted) == set(TRUE)
    assert fit.values["gemm_scale"] == pytest.approx(0.85, abs=0.03)
    assert fit.values["gemm_size_log2"] == pytest.approx(1.0, abs=0.35)
    assert fit.values["intra_bw_scale"] == pytest.approx(0.6, abs=0.06)
    assert fit.values["step_overhead_s"] == pytest.approx(0.02, abs=0.004)
    # the stock profile is far off; the fit is within the noise
    assert np.median(np.abs(fit.err_before)) > 0.2
    assert np.median(np.abs(fit.err_after)) < 2 * NOISE


def test_robust_loss_ignores_an_outlier():
    base, runs, layouts = synthetic_runs(hiddens=(1024, 4096), mbss=(1,))
    runs[3] = dataclasses.replace(runs[3], measured_step_time_s=runs[3].measured_step_time_s * 2)
    fit = calibrate(base, runs, layouts=layouts, names=["gemm_scale", "step_overhead_s"],
                    cross_validate=False)
    # gemm_size/intra_bw stay stock here, so only the scale is compared, loosely
    err = np.abs(fit.err_after)
    assert err[3] > 0.4  # the outlier stays an outlier ...
    assert np.median(np.delete(err, 3)) < np.median(np.abs(np.delete(fit.err_before, 3)))


def test_cross_validation_holds_runs_out():
    base, runs, layouts = synthetic_runs(hiddens=(1024, 4096), tps=(1, 8), mbss=(1,))
    fit = calibrate(base, runs, layouts=layouts, names=["gemm_scale", "step_overhead_s"])
    assert fit.cv_method == "leave-one-out" and fit.pred_cv is not None
    assert len(fit.pred_cv) == len(runs) == 4
    # held-out predictions differ from in-sample ones (each was fitted without its own run)
    assert not np.allclose(fit.pred_cv, fit.pred_after, rtol=1e-9)
    sigma = 1.4826 * np.median(np.abs(np.log(fit.pred_cv / fit.measured)))
    assert fit.profile.step_time_rel_error == pytest.approx(sigma, abs=1e-4)


def test_bounds_keep_efficiencies_physical():
    base = a100_like()
    knobs = {k.name: k for k in knobs_for(base)}
    top = apply_values(base, {"gemm_scale": knobs["gemm_scale"].hi,
                              "attention_efficiency": knobs["attention_efficiency"].hi})
    assert max(y for _, y in top.gemm_efficiency.points) <= 1.0 + 1e-12
    assert top.attention_efficiency <= 1.0
    assert knobs["dp_overlap"].hi == 1.0 and knobs["hbm_efficiency"].hi == 1.0
    for knob in knobs.values():
        for u in (0.0, 0.3, 1.0):
            assert knob.to_unit(knob.to_value(u)) == pytest.approx(u, abs=1e-12)


def test_stock_values_change_nothing():
    base, runs, layouts = synthetic_runs(hiddens=(2048,), tps=(2,), mbss=(1,))
    same = apply_values(base, {})
    assert predict_step_times(same, runs, layouts)[0] == predict_step_times(base, runs, layouts)[0]


def test_written_profile_loads_with_provenance(tmp_path):
    base, runs, layouts = synthetic_runs(hiddens=(1024, 4096), tps=(1, 8), mbss=(1,))
    fit = calibrate(base, runs, layouts=layouts, names=["gemm_scale"])
    path = tmp_path / "fitted.yaml"
    path.write_text(profile_yaml(fit.profile))
    loaded = load_gpu(str(path))
    assert loaded.name == base.name
    assert loaded.provenance["runs"] == [r.run_id for r in runs]
    assert set(loaded.provenance["residuals"]) == {r.run_id for r in runs}
    assert loaded.step_time_rel_error == fit.profile.step_time_rel_error
    assert "gemm_efficiency" in loaded.sources and "fitted" in loaded.sources["gemm_efficiency"]
    factor = fit.values["gemm_scale"]
    assert loaded.gemm_efficiency.points[-1][1] == pytest.approx(
        min(1.0, base.gemm_efficiency.points[-1][1] * factor))


def _plan(t: float, rel: float):
    est = SimpleNamespace(step_time_s=t, step_time_low_s=t * (1 - rel),
                          step_time_high_s=t * (1 + rel))
    return SimpleNamespace(estimate=est)


def test_plans_indistinguishable():
    # best 10 s +-5% = [9.5, 10.5]; 10.9 s -> low 10.355 overlaps; 11.1 s -> low 10.545 does not
    plans = [_plan(10.0, 0.05), _plan(10.9, 0.05), _plan(11.1, 0.05), _plan(12.0, 0.05)]
    assert plans_indistinguishable(plans) == 2
    assert plans_indistinguishable([_plan(10.0, 0.0), _plan(10.0, 0.0), _plan(10.1, 0.0)]) == 2
    assert plans_indistinguishable([]) == 0


def _write_records(path, runs, layouts):
    with open(path, "w") as f:
        for run, layout in zip(runs, layouts, strict=True):
            f.write(json.dumps({
                "model_spec": run.model.model_dump(mode="json"), **layout.as_dict(),
                "seq_len": run.job.seq_len, "global_batch": run.job.global_batch,
                "world_size": 8, "measured_step_time_s": run.measured_step_time_s,
                "ok": True, "error": None}) + "\n")


def test_cli_calibrate_from_records(tmp_path, monkeypatch, capsys):
    from planner.cli import main

    base, runs, layouts = synthetic_runs(hiddens=(1024, 4096), tps=(1, 8), mbss=(1,))
    records = tmp_path / "runs.jsonl"
    _write_records(records, runs, layouts)
    start = tmp_path / "base.yaml"
    start.write_text(profile_yaml(base))
    out = tmp_path / "fitted.yaml"
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the table to the terminal width
    monkeypatch.setattr(sys, "argv", ["planner", "calibrate", "--runs", str(records),
                                      "--profile", str(start), "--out", str(out),
                                      "--fit", "gemm_scale,step_overhead_s"])
    try:
        main()
    except SystemExit as exc:  # typer's standalone mode exits 0 on success
        assert exc.code in (0, None)
    text = capsys.readouterr().out
    assert "leave-one-out" in text and "runs.jsonl:4" in text
    fitted = load_gpu(str(out))
    assert fitted.provenance["fitted"].keys() == {"gemm_scale", "step_overhead_s"}


def test_cli_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    from planner.cli import main

    monkeypatch.setattr(sys, "argv", ["planner", "calibrate", "--runs", str(tmp_path / "no.jsonl"),
                                      "--profile", "A100", "--out", str(tmp_path / "x.yaml")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: runs file not found: {tmp_path / 'no.jsonl'}"]


def test_fitted_band_reaches_estimates():
    from planner.costmodel import estimate

    base, runs, layouts = synthetic_runs(hiddens=(1024, 4096), tps=(1, 8), mbss=(1,))
    fit = calibrate(base, runs, layouts=layouts, names=["gemm_scale"])
    sigma = fit.profile.step_time_rel_error
    assert sigma is not None and sigma > 0
    run = runs[0]
    est = estimate(run.model, run.cluster.model_copy(update={"gpu": fit.profile}), run.job,
                   layouts[0])
    assert est.step_time_low_s == pytest.approx(est.step_time_s * (1 - sigma))
    assert est.step_time_high_s == pytest.approx(est.step_time_s * (1 + sigma))


def test_source_weights_make_every_source_weigh_alike():
    """source_weights by hand: three runs of source a and one of b, mean 1, each source 2 in
    total; a fit with per_source=True lands nearer the middle of two sources than the plain fit,
    which follows the source with more runs."""
    from planner.calibrate.fit import source_weights

    one = SimpleNamespace(source_id="a")
    other = SimpleNamespace(source_id="b")
    assert source_weights([one, one, one, other]) == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    base, runs, layouts = synthetic_runs(noise=0.0, hiddens=(1024, 2048, 4096), mbss=(1,))
    truths = {"big": 0.7, "small": 0.9}  # source "big" has 8 runs, "small" 4
    tagged = []
    for i, (run, lay) in enumerate(zip(runs, layouts, strict=True)):
        source = "big" if i < 8 else "small"
        t = predict_step_times(apply_values(base, {"gemm_scale": truths[source]}), [run], [lay])
        tagged.append(dataclasses.replace(run, source_id=source, measured_step_time_s=float(t[0])))
    plain = calibrate(base, tagged, layouts=layouts, names=["gemm_scale"], cross_validate=False)
    even = calibrate(base, tagged, layouts=layouts, names=["gemm_scale"], cross_validate=False,
                     per_source=True)
    middle = float(np.sqrt(0.7 * 0.9))
    assert 0.7 < plain.values["gemm_scale"] < even.values["gemm_scale"] < 0.9
    assert abs(even.values["gemm_scale"] - middle) < abs(plain.values["gemm_scale"] - middle)


def test_a_profile_without_fused_attention_calibrates_one_attention_rate():
    """Below Hopper TE runs attention=cudnn as FlashAttention-2 (the cost model falls back to
    attention_efficiency): such a profile offers no fused knob, and a fit of attention_efficiency
    moves cudnn and flash jobs alike (the old apply_values wrote a stale fused value into it, so
    the default stack's jobs kept the unfitted rate)."""
    a100 = a100_like()
    assert a100.fused_attention_efficiency is None
    assert "fused_attention_efficiency" not in {k.name for k in knobs_for(a100)}
    fitted = apply_values(a100, {"attention_efficiency": 0.3})
    assert fitted.attention_efficiency == 0.3 and fitted.fused_attention_efficiency is None
    hopper = a100.model_copy(update={"fused_attention_efficiency": 0.7})
    assert "fused_attention_efficiency" in {k.name for k in knobs_for(hopper)}
    refit = apply_values(hopper, {"fused_attention_efficiency": 0.6})
    assert refit.fused_attention_efficiency == 0.6
    assert apply_values(hopper, {}).fused_attention_efficiency == 0.7


def test_a_gemm_scale_fitted_on_bf16_runs_moves_the_fp8_curve():
    """A machine whose GEMMs reach 0.8 of both measured H100 curves (BF16 and FP8 given
    explicitly, so the truth does not lean on the tie): gemm_scale fitted on its BF16 runs alone
    predicts its FP8 runs, because the FP8 curve follows it (specs.adjust.fp8_tied_values).
    Left at the benchmark, the FP8 GEMMs would be 1 / 0.8 = 1.25x too fast."""
    base = load_gpu("H100-SXM")
    true = apply_values(base, {"gemm_scale": 0.8, "fp8_gemm_scale": 0.8})
    cluster = ClusterSpec(gpu=base, num_nodes=1, gpus_per_node=8)

    def runs_of(precision):
        job = JobSpec(seq_len=2048, global_batch=32, precision=precision)
        out, lays = [], []
        for hidden in (2048, 4096):
            for tp in (1, 2, 4):
                layout = Layout(tp=tp, dp=8 // tp, mbs=2, zero=1)
                run = MeasuredRun(f"{precision}:{len(out)}", "synthetic", _model(hidden),
                                  cluster, job, layout.as_dict(), 1.0)
                t = float(predict_step_times(true, [run], [layout])[0])
                out.append(dataclasses.replace(run, measured_step_time_s=t))
                lays.append(layout)
        return out, lays

    bf16, bf16_lay = runs_of("bf16")
    fp8, fp8_lay = runs_of("fp8")
    fit = calibrate(base, bf16, layouts=bf16_lay, names=["gemm_scale"], cross_validate=False)
    assert fit.fitted == ["gemm_scale"]
    assert fit.values["gemm_scale"] == pytest.approx(0.8, abs=0.01)
    top8 = base.fp8_gemm_efficiency.points[-1][1]
    assert fit.profile.fp8_gemm_efficiency.points[-1][1] == pytest.approx(
        fit.values["gemm_scale"] * top8, rel=1e-9)
    measured = np.array([r.measured_step_time_s for r in fp8])
    pred = predict_step_times(fit.profile, fp8, fp8_lay)
    assert np.max(np.abs(pred / measured - 1)) < 0.01
    # the untied FP8 curve (fp8_gemm_scale given as 1) is what the fit used to leave: every FP8
    # run too fast (by less than 25%: the LM head stays BF16, attention and the layer pass too)
    untied = apply_values(base, {"gemm_scale": fit.values["gemm_scale"], "fp8_gemm_scale": 1.0})
    assert np.all(predict_step_times(untied, fp8, fp8_lay) / measured - 1 < -0.02)

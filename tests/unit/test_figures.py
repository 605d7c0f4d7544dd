"""planner.figures: the numbers behind the pictures are the cost model's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner import figures
from planner.costmodel import estimate
from planner.layout import Layout
from planner.registry import load_gpu, load_model, parse_cluster
from planner.specs import JobSpec


def test_pareto_front_by_hand():
    # (time, memory): (1, 9) and (2, 5) and (4, 1) are the front; (3, 6) and (2, 7) are beaten
    pts = [(3, 6), (1, 9), (2, 5), (4, 1), (2, 7)]
    assert sorted(figures.pareto_front(pts)) == [1, 2, 3]


@pytest.fixture(scope="module")
def case():
    model, cluster = load_model("llama2-7b"), parse_cluster("16xA100")
    job = JobSpec(seq_len=4096, global_batch=64)
    layout = Layout(tp=2, pp=4, dp=2, vpp=2, mbs=1, zero=1, recompute="selective", sp=True)
    return model, cluster, job, layout


def test_stage_memory_peak_is_the_estimate_peak(case):
    model, cluster, job, layout = case
    mem = figures.stage_memory(model, cluster, job, layout)
    assert mem["stage"] == [0, 1, 2, 3]
    totals = [sum(mem[k][i] for k in figures.MEM_COLORS) for i in range(4)]
    est = estimate(model, cluster, job, layout)
    assert max(totals) == pytest.approx(est.peak_mem_gb, rel=1e-9)
    assert mem["stage"][int(np.argmax(totals))] == est.peak_stage


def test_gpipe_and_1f1b_timelines_run_every_pass(case):
    model, cluster, job, layout = case
    for schedule, vpp in (("gpipe", 1), (None, 2)):
        tl = figures.schedule_timeline(model, cluster, job, layout, schedule)
        assert tl["vpp"] == vpp
        per_stage = [sum(1 for s in tl["slots"] if s.stage == st) for st in range(4)]
        assert per_stage == [2 * tl["m"] * vpp] * 4


def test_calibration_figure_saves(tmp_path: Path):
    from planner.calibrate import FitResult

    gpu = load_gpu("H100")
    meas = np.array([1.0, 2.0, 4.0])
    fit = FitResult(base=gpu, profile=gpu, values={}, fitted=[], runs=[], layouts=[],
                    measured=meas, pred_before=meas * 0.6, pred_after=meas * 1.02,
                    pred_cv=meas * np.array([1.05, 0.97, 1.1]), cv_method="leave-one-out")
    out = figures.save(figures.calibration_figure(fit), tmp_path / "cal.svg")
    text = out.read_text()
    assert "<svg" in text
    sigma = fit.rel_error_sigma
    assert sigma == pytest.approx(1.4826 * np.log(1.05), rel=1e-6)  # median |log| residual
    from planner.errors import SpecError

    with pytest.raises(SpecError):
        figures.save(figures.calibration_figure(fit), tmp_path / "cal.jpg")


@pytest.mark.parametrize("corner", ["right", "left"])
def test_pareto_winner_label_stays_inside_the_axes(corner):
    """Plan 1 at the largest memory (right edge, the case that ran off the axes) or the
    smallest: its label, drawn, lies inside the axes' box."""
    from dataclasses import replace

    from planner.plan import Plan

    model, cluster = load_model("llama3-70b"), parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=1024)
    layout = Layout(tp=2, pp=16, dp=4, vpp=5, mbs=1, zero=1, recompute="none", sp=True)
    est = estimate(model, cluster, job, layout)
    mems = [70.0, 40.0, 55.0, 62.0] if corner == "right" else [30.0, 70.0, 55.0, 62.0]
    plans = [Plan(layout, replace(est, step_time_s=t, peak_mem_gb=m), rank=i + 1)
             for i, (t, m) in enumerate(zip([10.0, 13.0, 11.0, 12.0], mems, strict=True))]
    fig = figures.pareto_figure({"128xA100": plans})
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text() == str(layout)]
    assert len(labels) == 1
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box, axes_box = labels[0].get_window_extent(renderer), ax.get_window_extent(renderer)
    assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
    assert axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1

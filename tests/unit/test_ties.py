"""Ties: bands overlapping the fastest plan's, the robustness order inside a tie, the stock band."""

from __future__ import annotations

import numpy as np
import pytest

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.data import bands as measured_bands
from planner.search import build_space, search
from planner.search.bands import overlaps_best, plans_indistinguishable, robust_step_time


def test_robust_score_by_hand() -> None:
    # high end 11 s + (tp 1 + pp 0.5 + bubble 2 + dp 0.25) s of uncertain terms = 14.75 s;
    # compute and the optimizer do not count
    cols = {"step_time_s": np.array([10.0]), "step_time_high_s": np.array([11.0]),
            "time_compute_s": np.array([6.0]), "time_tp_comm_s": np.array([1.0]),
            "time_pp_comm_s": np.array([0.5]), "time_pp_bubble_s": np.array([2.0]),
            "time_dp_comm_exposed_s": np.array([0.25]), "time_optimizer_s": np.array([0.25])}
    assert robust_step_time(cols)[0] == pytest.approx(14.75)
    # without a band column the score starts from the step time
    assert robust_step_time({"step_time_s": np.array([3.0])})[0] == pytest.approx(3.0)


def test_overlap_by_hand() -> None:
    low, high = np.array([9.0, 10.5, 11.1, 8.0]), np.array([11.0, 12.0, 13.0, 8.9])
    # row 0 = [9, 11]: [10.5, 12] overlaps, [11.1, 13] does not, [8, 8.9] does not
    assert overlaps_best(low, high, 0).tolist() == [True, True, False, False]


def test_stock_profile_bands_are_the_measured_ones() -> None:
    """A stock profile carries the two measured bands of planner/data/step_time_bands.yaml: the
    step time's (held-out sources, the 'stock' cell: no stack named, own GEMM curve) and the
    ranking band (between layouts of one job), never wider than the first."""
    model, cluster = load_model("llama2-7b"), parse_cluster("8xH100")
    est = estimate(model, cluster, JobSpec(seq_len=4096, global_batch=64),
                   Layout(tp=2, dp=4, zero=1, recompute="selective", sp=True))
    assert cluster.gpu.step_time_rel_error is None
    data = measured_bands.load()
    stock, rank = data["absolute"]["stock"]["width"], data["ranking"]["width"]
    assert est.step_time_low_s == pytest.approx(est.step_time_s * (1 - stock))
    assert est.step_time_high_s == pytest.approx(est.step_time_s * (1 + stock))
    assert est.ranking_band == pytest.approx(min(rank, stock))


def test_tie_group_and_robust_first_on_the_real_model() -> None:
    """Llama 2 70B on 128 A100: the tie counted by hand over the evaluated space (fitting
    layouts whose low end is at most the fastest's high end: ranking bands are t(1 -+ r)), and
    the first plan is the tie's most robust layout (argmin of the score over the whole tie)."""
    model, cluster = load_model("llama70b"), parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=1024)
    result = search(model, cluster, job, {}, 10)
    space = result.space  # the evaluated space (with the uneven splits the search found)
    assert len(space) == len(build_space(model, cluster, job, {}))
    cols = {k: np.asarray(v) for k, v in space.columns.items()}
    fits = cols["fits"].astype(bool)
    t = cols["step_time_s"]
    r = cluster.gpu.ranking_band  # ties: the error between layouts of one job
    assert np.allclose(cols["ranking_band"], r)
    fastest = t[fits].min()
    tie = fits & (t * (1 - r) <= fastest * (1 + r))
    assert result.tied_total == int(tie.sum()) > 10
    score = robust_step_time(cols)
    plans = result.plans()
    assert all(p.tied_with_best for p in plans)  # more tied layouts than plans shown
    first = plans[0].estimate
    expected = score[tie].min()
    got = first.step_time_s * (1 + r) + sum(getattr(first, c) for c in (
        "time_tp_comm_s", "time_cp_comm_s", "time_ep_comm_s", "time_pp_comm_s",
        "time_pp_bubble_s", "time_dp_comm_exposed_s"))
    assert got == pytest.approx(expected, rel=1e-6)
    # the fastest layout is not the most robust one here: the order is not the step time's
    assert first.step_time_s > fastest
    assert plans_indistinguishable(plans) == 10
    # fastest_plan (the accuracy benchmark's stand-in for a tuned recipe) is the minimum over
    # the space counted here, not the first plan; ranked after the 10 shown when outside them
    quick = result.fastest_plan()
    assert quick.estimate.step_time_s == pytest.approx(fastest, rel=1e-12)
    assert quick.rank == next((p.rank for p in plans if p.layout == quick.layout), 11)


def test_a_clear_winner_is_alone() -> None:
    """A calibrated profile with a tiny band: nothing ties, the order is the step time's."""
    model = load_model("llama2-7b")
    cluster = parse_cluster("8xH100")
    gpu = cluster.gpu.model_copy(update={"step_time_rel_error": 1e-6})
    cluster = cluster.model_copy(update={"gpu": gpu})
    result = search(model, cluster, JobSpec(seq_len=4096, global_batch=64), {}, 5)
    plans = result.plans()
    assert result.tied_total == 1 and [p.tied_with_best for p in plans] == [True] + [False] * 4
    times = [p.estimate.step_time_s for p in plans]
    assert times == sorted(times)


def test_order_ties_on_plans_agrees_with_the_search() -> None:
    """bands.order_ties (plain Python over Plans, what benchmarks/ranking.py ranks with) and the
    search's second CP-SAT selection give the same head of the ranking over the same layouts."""
    from planner.costmodel import Estimate
    from planner.plan import Plan
    from planner.search import with_stage_layers
    from planner.search.bands import order_ties

    model, cluster = load_model("llama2-7b"), parse_cluster("8xH100")
    job = JobSpec(seq_len=4096, global_batch=64)
    result = search(model, cluster, job, {}, 5)
    space = result.space
    rows = np.flatnonzero(space.fits)
    layers = model.num_hidden_layers
    plans = [Plan(with_stage_layers(space.layout(i), layers), Estimate.from_batch(space.columns, i))
             for i in rows]
    plans.sort(key=lambda p: (p.estimate.step_time_s, p.estimate.peak_mem_gb))
    ordered = order_ties(plans)
    searched = result.plans()
    assert [p.layout for p in ordered[:5]] == [p.layout for p in searched]
    assert sum(p.tied_with_best for p in ordered) == result.tied_total
    assert [p.rank for p in ordered[:3]] == [1, 2, 3]

"""Ties: bands overlapping the fastest plan's, the robustness order inside a tie, the stock band."""

from __future__ import annotations

import numpy as np
import pytest

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.data import bands as measured_bands
from planner.search import build_space, search, with_stage_layers
from planner.search.bands import overlaps_best, plans_indistinguishable, robust_step_time


def test_robust_score_by_hand() -> None:
    # high end 11 s + each uncertain term times its weight (its 1-sigma error on published
    # sources where they pin it, else 1): TP inside the node without overlap 0.28 x 1, PP sends
    # 1 x 0.5, bubble 1 x 2, exposed DP 1 x 0.25 = 11 + 0.28 + 0.5 + 2 + 0.25 = 14.03 s;
    # compute and the optimizer do not count
    cols = {"step_time_s": np.array([10.0]), "step_time_high_s": np.array([11.0]),
            "time_compute_s": np.array([6.0]), "time_tp_comm_s": np.array([1.0]),
            "time_pp_comm_s": np.array([0.5]), "time_pp_bubble_s": np.array([2.0]),
            "time_dp_comm_exposed_s": np.array([0.25]), "time_optimizer_s": np.array([0.25])}
    assert robust_step_time(cols)[0] == pytest.approx(14.03)
    # TP overlapped with the GEMMs or across nodes (1): 11 + 1 + 2.75
    assert robust_step_time(cols, tp_weight=1.0)[0] == pytest.approx(14.75)
    # without a band column the score starts from the step time
    assert robust_step_time({"step_time_s": np.array([3.0])})[0] == pytest.approx(3.0)


def test_tp_term_weight_by_kind() -> None:
    """TP 1-8 on 8-GPU nodes is inside the node (0.28, 1 overlapped); TP 16 crosses (1)."""
    from planner.search.bands import tp_term_weight

    assert tp_term_weight([1, 8, 16], 8, False).tolist() == [0.28, 0.28, 1.0]
    assert tp_term_weight([1, 8, 16], 8, True).tolist() == [1.0, 1.0, 1.0]
    assert tp_term_weight([8], 4, True).tolist() == [1.0]


def test_tp_weight_in_the_node_holds_on_korthikanti_table5() -> None:
    """The TP term's weight inside the node (0.28, the 1-sigma error of three sources) is not
    below what the cleanest of them shows: Korthikanti 2022 Table 5 (Megatron-LM, A100, TP 8,
    TP 7-28% of the step) read by hand with one level for its 8 points, log(measured /
    predicted) = a + b x TP share (numpy least squares, a second method to the benchmark's),
    gives a TP factor 1 + b within 0.15 of 1."""
    import sys
    from pathlib import Path

    from planner.search.bands import TP_WEIGHT_IN_DOMAIN

    sys.path.insert(0, str(Path(__file__).parent))
    from test_costmodel_published import table5_estimates

    share, ratio = [], []
    for measured, est in table5_estimates():
        share.append(est.time_tp_comm_s / est.step_time_s)
        ratio.append(np.log(measured / est.step_time_s))
    x = np.column_stack([np.ones(len(share)), share])
    (_, b), *_ = np.linalg.lstsq(x, np.array(ratio), rcond=None)
    assert min(share) > 0.07 and max(share) < 0.3
    assert abs(b) < 0.15 < TP_WEIGHT_IN_DOMAIN


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
    # TP inside the A100 node without overlap 0.28, the others 1
    got = first.step_time_s * (1 + r) + sum(w * getattr(first, c) for c, w in (
        ("time_tp_comm_s", 0.28), ("time_cp_comm_s", 1), ("time_ep_comm_s", 1),
        ("time_pp_comm_s", 1), ("time_pp_bubble_s", 1), ("time_dp_comm_exposed_s", 1)))
    assert got == pytest.approx(expected, rel=1e-6)
    # the fastest layout is not the most robust one here: the order is not the step time's
    assert first.step_time_s > fastest
    assert plans_indistinguishable(plans) == 10
    # fastest_plan (the accuracy benchmark's stand-in for a tuned recipe) is the minimum over
    # the space counted here, not the first plan; ranked after the 10 shown when outside them
    quick = result.fastest_plan()
    assert quick.estimate.step_time_s == pytest.approx(fastest, rel=1e-12)
    assert quick.rank == next((p.rank for p in plans if p.layout == quick.layout), 11)


def test_every_layout_that_may_tie_gets_its_split_solved() -> None:
    """The split search solves every layout that may join the tie with the fastest, whatever
    --top: the tie's robust order picks plan 1 among them, and a tied layout left at its even
    split (it could not reach the top K by time) let plan 1 change with --top (Qwen3 32B on 64
    H100: tp1-pp2-dp32-vpp16 at --top 1-3, tp1-pp8-dp8 with a solved split at --top 10). The
    tie is counted exactly at any K: checked against the tie counted by hand over the space
    with every layout's split solved (improve_splits with K = every row)."""
    from planner.report import tie_note
    from planner.search.stages import improve_splits

    model, cluster = load_model("llama70b"), parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=1024)
    every, _, floor = improve_splits(build_space(model, cluster, job, {}), {}, 10**9)
    assert np.isinf(floor).all()
    cols = {k: np.asarray(v) for k, v in every.columns.items()}
    fits, t, r = cols["fits"].astype(bool), cols["step_time_s"], cluster.gpu.ranking_band
    exact = int((fits & (t * (1 - r) <= t[fits].min() * (1 + r))).sum())
    for k in (1, 10):
        result = search(model, cluster, job, {}, k)
        assert not result.tied_at_least and result.tied_total == exact
    note = tie_note(result.plans(), result.tied_total, False, result.tied_at_least)
    assert note.startswith(f"{exact} layouts tie")
    qwen, h100 = load_model("qwen3-32b"), parse_cluster("64xH100")
    heads = {k: str(search(qwen, h100, job, {}, k).plans()[0].layout) for k in (1, 3, 10)}
    assert len(set(heads.values())) == 1, heads


@pytest.mark.parametrize("model_name,cluster_name", [("llama70b", "128xA100"),
                                                     ("qwen3-32b", "64xH100")])
def test_the_plans_shown_are_those_of_the_space_with_every_split_solved(
        model_name: str, cluster_name: str) -> None:
    """The K plans shown, with their splits, are exactly those ranked over the space with every
    layout's split solved (the search's own selection and tie order run on improve_splits with
    K = every row): the split search leaves unsolved only layouts that can neither reach the
    top K by time nor join the tie with the fastest."""
    from planner.search import _rank_ties
    from planner.search.cpsat import SelectionModel
    from planner.search.stages import improve_splits

    model, cluster = load_model(model_name), parse_cluster(cluster_name)
    job = JobSpec(seq_len=4096, global_batch=1024)
    every, _, floor = improve_splits(build_space(model, cluster, job, {}), {}, 10**9)
    for k in (1, 10):
        by_time = SelectionModel(every, {}, k).solve().indices
        indices, _, total, _ = _rank_ties(every, {}, k, by_time, None, floor)
        want = [str(with_stage_layers(every.layout(i), model.num_hidden_layers))
                for i in indices]
        result = search(model, cluster, job, {}, k)
        got = [str(p.layout) for p in result.plans()]
        assert got == want and result.tied_total == total


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


def test_adverse_cluster_by_hand() -> None:
    """bands.adverse_cluster: the stock H100 profile (no ring slowdown of its own) on 32 nodes
    gets x = ADVERSE_RING_SLOWDOWN; a DP ring of one rank per node over 16 nodes then runs at
    busbw / (1 + 0.045 x 14) = busbw / 1.63. Nothing changes on 2 nodes (no ring spans more
    than 2) or where the profile states its own slowdown (a measured fabric)."""
    from planner.costmodel.comm import Group
    from planner.search.bands import ADVERSE_RING_SLOWDOWN, adverse_cluster

    assert ADVERSE_RING_SLOWDOWN == 0.045
    cluster = parse_cluster("256xH100")
    assert cluster.gpu.inter_node.ring_slowdown_per_domain is None
    worse = adverse_cluster(cluster)
    assert worse.gpu.inter_node.ring_slowdown_per_domain == 0.045
    assert worse.gpu.intra_node == cluster.gpu.intra_node  # only the scale-out tier changes
    ring = Group(worse, np.array([16.0]), 8)  # dp 16 across tp 8: one rank per node
    assert ring.ring_slowdown[0] == pytest.approx(1.63)
    assert Group(cluster, np.array([16.0]), 8).ring_slowdown[0] == 1.0
    two = parse_cluster("16xH100")
    assert adverse_cluster(two) is two
    link = cluster.gpu.inter_node.model_copy(update={"ring_slowdown_per_domain": 0.01})
    measured = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(
        update={"inter_node": link})})
    assert adverse_cluster(measured) is measured


def test_adverse_slowdown_is_the_sweeps_logged_fit() -> None:
    """ADVERSE_RING_SLOWDOWN is what benchmarks/dp_scale.py fits on the nanotron sweep's
    logged all-gather / reduce-scatter busbw (8-32 nodes; no step time), to its 3 decimals."""
    from bench_fixtures import load_bench

    from planner.search.bands import ADVERSE_RING_SLOWDOWN

    dp_scale = load_bench("dp_scale")
    _, slow, _ = dp_scale.fit_network(dp_scale.logged())
    assert slow == pytest.approx(ADVERSE_RING_SLOWDOWN, abs=5e-4)


def test_the_tie_is_ordered_on_the_adverse_fabric() -> None:
    """Llama 3 8B on 256 H100 (32 nodes), global batch 256: the plans are the tie's order by
    the robustness score computed by hand on the rows costed again with the stock profile's
    inter-node link given ring_slowdown_per_domain 0.045 (built here, not by adverse_cluster):
    step x (1 + ranking band) + TP, CP, EP, PP, bubble and exposed DP seconds, each times its
    weight. With the score on the stock columns the first plan was tp1-pp1-dp256-mbs1-z2
    (ZeRO-2 rings over 32 nodes); the adverse fabric moves it. The exhaustive oracle ranks the
    same."""
    from planner.search.bands import UNCERTAIN_TERMS
    from planner.search.exhaustive import exhaustive_ranking, exhaustive_space
    from planner.search.problem import evaluate

    model, cluster = load_model("llama3-8b"), parse_cluster("256xH100")
    job = JobSpec(seq_len=4096, global_batch=256)
    result = search(model, cluster, job, {}, 5, even_stages=True)
    space = result.space
    tie = np.flatnonzero(space.fits & (np.asarray(space.columns["step_time_s"]) * (
        1 - cluster.gpu.ranking_band) <= space.columns["step_time_s"][result.fastest] * (
        1 + cluster.gpu.ranking_band)))
    assert result.tied_total == len(tie) > 100
    link = cluster.gpu.inter_node.model_copy(update={"ring_slowdown_per_domain": 0.045})
    slow = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"inter_node": link})})
    worse = evaluate(model, slow, job, {k: np.asarray(v)[tie] for k, v in space.knobs.items()})
    w = worse.columns
    weight = {t: 1.0 for t in UNCERTAIN_TERMS}  # TP inside the node, not overlapped: 0.28
    weight.update(time_tp_comm_s=0.28)
    score = np.asarray(w["step_time_s"]) * (1 + cluster.gpu.ranking_band) + sum(
        weight[t] * np.asarray(w[t]) for t in UNCERTAIN_TERMS)
    first = result.indices[0]
    assert first == tie[int(np.argmin(score))]
    assert list(result.indices) == [int(tie[i]) for i in np.argsort(score, kind="stable")[:5]]
    stock = dict(space.columns)
    old = np.asarray(stock["step_time_s"])[tie] * (1 + cluster.gpu.ranking_band) + sum(
        weight[t] * np.asarray(stock[t])[tie] for t in UNCERTAIN_TERMS)
    assert str(space.layout(tie[int(np.argmin(old))])) == "tp1-pp1-dp256-mbs1-z2-none"
    assert str(space.layout(first)) != "tp1-pp1-dp256-mbs1-z2-none"
    # the predicted step times and the tie are the stock profile's
    assert space.columns["step_time_s"][first] < worse.columns["step_time_s"][
        int(np.flatnonzero(tie == first)[0])] + 1e-12
    oracle = exhaustive_space(model, cluster, job, {})
    indices, tied = exhaustive_ranking(oracle, {}, 5)
    assert [str(oracle.layout(i)) for i in indices] == [str(space.layout(i))
                                                         for i in result.indices]
    assert tied == result.tied


def test_order_ties_with_the_adverse_estimates_agrees_with_the_search() -> None:
    """On 32 nodes (where the adverse fabric moves the first plan, test above) bands.order_ties
    given each plan's estimate on adverse_cluster orders the tie as the search's second CP-SAT
    selection does."""
    from planner.costmodel import Estimate, estimate_many
    from planner.plan import Plan
    from planner.search import with_stage_layers
    from planner.search.bands import adverse_cluster, order_ties

    model, cluster = load_model("llama3-8b"), parse_cluster("256xH100")
    job = JobSpec(seq_len=4096, global_batch=256)
    result = search(model, cluster, job, {}, 5, even_stages=True)
    space = result.space
    layers = model.num_hidden_layers
    plans = [Plan(with_stage_layers(space.layout(i), layers), Estimate.from_batch(space.columns, i))
             for i in np.flatnonzero(space.fits)]
    plans.sort(key=lambda p: (p.estimate.step_time_s, p.estimate.peak_mem_gb))
    worse = estimate_many(model, adverse_cluster(cluster), job, [p.layout for p in plans])
    ordered = order_ties(plans, worse)
    assert [p.layout for p in ordered[:5]] == [p.layout for p in result.plans()]
    assert sum(p.tied_with_best for p in ordered) == result.tied_total
    assert [p.layout for p in order_ties(plans)[:1]] != [p.layout for p in ordered[:1]]


def test_plan_one_does_not_depend_on_top_when_a_cp_twin_ties_exactly() -> None:
    """Llama 3 70B on 64 H100 under the nemo stack at seq 8192 (cp searched from 8192 on,
    search.problem.CP_MIN_SEQ_LEN): tp8-pp4-dp1-cp2-mbs4 is costed exactly as tp8-pp4-dp2-mbs2
    (the same tokens per GPU and micro-batch, no exposed ring exchange), so the robustness key
    ties; plan 1 is the same for any --top and is the one without cp (ties.unique_keys)."""
    from planner.search.ties import robust_keys, unique_keys
    from planner.stacks import resolve_stack

    stack = resolve_stack("nemo")
    model, cluster = load_model("llama3-70b"), parse_cluster("64xH100")
    cluster = cluster.model_copy(update={"gpu": stack.profile_for(cluster.gpu, ["bf16"])})
    job = stack.job(JobSpec(seq_len=8192, global_batch=512))
    firsts = {top: search(model, cluster, job, {}, top).plans()[0].layout for top in (1, 3, 10)}
    assert len(set(firsts.values())) == 1
    first = firsts[1]
    twin = Layout(**{**first.__dict__, "dp": first.dp // 2, "cp": 2, "mbs": first.mbs * 2}) \
        if first.dp % 2 == 0 and first.cp == 1 else None
    assert twin is not None  # the tie this test is about exists for plan 1
    a, b = estimate(model, cluster, job, first), estimate(model, cluster, job, twin)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    # unique_keys by hand: equal keys order by lower cp, then the knob tuple
    space = search(model, cluster, job, {}, 1).space
    rows = np.zeros(len(space), dtype=bool)
    rows[:50] = True
    keys = np.zeros(len(space), dtype=np.int64)  # every row ties on the key
    order = unique_keys(space, keys, rows)
    ranked = sorted(np.flatnonzero(rows), key=lambda i: order[i])
    expect = sorted(np.flatnonzero(rows), key=lambda i: (
        int(space.knobs["cp"][i]), tuple(space.knobs[k][i] for k in space.knobs)))
    assert ranked == expect and (order[~rows] == 50).all()
    assert len(robust_keys(space, rows)) == len(space)

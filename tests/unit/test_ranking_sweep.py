"""The nanotron layout sweep (planner/data/sweeps/nanotron_sweep_dev.csv) ranks above the floor
measured when its stack's recipe came in (docs/ranking.md, "The nanotron sweep")."""

from __future__ import annotations

import numpy as np
import pytest
from bench_fixtures import load_bench, nanotron_sweep

from planner.costmodel.batch import estimate_batch

rk = load_bench("ranking")
SWEEP = nanotron_sweep()


@pytest.fixture(scope="module")
def sweep_groups():
    runs, skipped = rk.load_all([SWEEP])
    assert skipped == 0  # every row resolves: the nanotron stack preset reads its framework text
    return rk.build_groups(runs, rk.frameworks_of([SWEEP]), rk.Predictor())


def _by_time(groups, **job_update) -> tuple[float, float]:
    """(pooled pairwise, mean regret of the fastest predicted layout) over the groups."""
    right = total = 0.0
    regrets = []
    for g in groups:
        run = g.runs[0]
        job = run.job.model_copy(update=job_update) if job_update else run.job
        pred = estimate_batch(run.model, run.cluster, job, g.layouts)["step_time_s"]
        r, t = rk.pair_counts(pred, g.measured)
        right, total = right + r, total + t
        regrets.append(rk.regret_of(int(np.argmin(pred)), g.measured))
    return right / total, float(np.mean(regrets))


def test_the_sweep_loads_as_shipped(sweep_groups) -> None:
    # 755 layouts in 16 groups (the table's README); nothing refused or merged
    assert len(sweep_groups) == 16
    assert sum(len(g.layouts) for g in sweep_groups) == 755
    assert all(g.runs[0].stack == "nanotron" for g in sweep_groups)
    assert not any(g.runs[0].job.param_gather_overlap for g in sweep_groups)
    # torch DDP's 25 MiB buckets (nanotron ddp_bucket_cap_mb) from the stack's recipe
    assert all(g.runs[0].job.dp_bucket_mb == 25 for g in sweep_groups)
    # ZeRO-1 without DDP: one blocking fp32 all-reduce after the backward (nanotron trainer.py)
    assert all(g.runs[0].job.zero1_grad_all_reduce for g in sweep_groups)


def test_zero1_cost_over_zero0_follows_the_measured_twins(sweep_groups) -> None:
    """8.86B on 128 H100, tp8-pp1-dp16, the same layout at ZeRO 0 and 1 (healthy allocations,
    logged all-reduce 111-191 GB/s): measured ZeRO-1 - ZeRO-0 = +0.051 / +0.098 / +0.155 /
    +0.258 s at micro-batch 1 / 2 / 4 / 8 (the table's step times), growing as the last
    backward that hides ZeRO-0's bucketed all-reduce grows while ZeRO-1's whole-buffer
    all-reduce and parameter gather wait after it. Nothing fitted: the model's difference is
    within 0.02 s of each (it was -0.10 / -0.10 / -0.08 / +0.03 s with a hidden reduce-scatter)."""
    g = next(g for g in sweep_groups if g.runs[0].cluster.num_gpus == 128
             and g.runs[0].model.hidden_size == 4096)
    pred = estimate_batch(g.runs[0].model, g.runs[0].cluster, g.runs[0].job,
                          g.layouts)["step_time_s"]
    index = {str(lay): i for i, lay in enumerate(g.layouts)}
    for mbs, measured in ((1, 0.051), (2, 0.098), (4, 0.155), (8, 0.258)):
        z0, z1 = (index[f"tp8-pp1-dp16-mbs{mbs}-z{z}-none-sp"] for z in (0, 1))
        assert g.measured[z1] - g.measured[z0] == pytest.approx(measured, abs=0.001)
        assert pred[z1] - pred[z0] == pytest.approx(measured, abs=0.02)


def test_ranking_floor(sweep_groups) -> None:
    """Floors measured with the nanotron recipe, the H100 gather bandwidth and the
    unequal-stage bubble (pairwise 84.4%, regret of the fastest predicted layout 60.4% mean over
    groups; main before them: the sweep did not load, and with its equal-stage bubble, the
    all-reduce curve for gathers and the ZeRO-1 gather hidden the same groups gave 82.7% and
    64.4%). With the ZeRO-1 parameter all-gather hidden behind the next forward (Megatron's
    overlap_param_gather, the default recipe) the mean regret is 64.0%, above the floor."""
    pairwise, regret = _by_time(sweep_groups)
    # 87.1% with nanotron's cost-balanced stage split (84.4% before); 86.2% once the stock H100
    # profile was refitted under the measured bounds, the FP8 tie and the FP8-cast term (its
    # layer pass 650 -> 370 us, fitted on dgxc and llm-foundry; the unbounded refit gave 86.6%)
    assert pairwise >= 0.86
    # 60.3% with the H100 FlashAttention-2 rate fitted at 0.158 (half its benchmark: llm-foundry's
    # Triton-kernel rows fitted as FA2); 62.3% at 0.284 since they run attention="triton"
    # 70.9% once nanotron's ZeRO-1 runs its blocking fp32 all-reduce after the backward
    # (zero1_grad_all_reduce; 59.4% before): the fastest predicted layout moves from a ZeRO-1
    # to its ZeRO-0 twin in two groups whose ZeRO-0 run is an outlier: 1.34B on 64 GPUs
    # tp1-dp64-mbs2-z0 measured 1.02 s against 0.53 s for its z1 twin on the same logged
    # 94-97 GB/s (regret 1.5% -> 94.9%), and 8.86B on 512 tp16-dp32-mbs8-z0 on a 12.7 GB/s
    # allocation (3.7x its prediction; 138.6% -> 269.1%); 8.86B on 256 goes 39.3% -> 0.0%
    assert regret <= 0.71
    _, hidden = _by_time(sweep_groups, param_gather_overlap=True)
    assert hidden > 0.62


def test_degraded_network_runs_are_found_from_their_logs() -> None:
    """--healthy: a run whose logged all-reduce busbw is below F x the best of its job leaves.
    The 8.86B on one node logged 45.14 GB/s on tp1-pp2-dp4-mbs1-z1 against 427-460 for its 11
    neighbours (the table's notes; best 459.76): it leaves at F = 1/3 (threshold 153 GB/s),
    nothing else of that group does; at F = 0 nothing leaves."""
    runs, _ = rk.load_all([SWEEP])
    frameworks = rk.frameworks_of([SWEEP])
    eight = [r for r in runs if r.cluster.num_gpus == 8 and r.model.hidden_size == 4096]
    assert len(eight) == 12
    logged = sorted(rk.logged_allreduce_busbw(r) for r in eight)
    assert logged[0] == pytest.approx(45.14) and logged[1] == pytest.approx(427.35)
    assert logged[-1] == pytest.approx(459.76)
    kept, dropped = rk.healthy_runs(eight, frameworks, 1 / 3)
    assert dropped == 1 and rk.logged_allreduce_busbw(
        next(r for r in eight if r not in kept)) == pytest.approx(45.14)
    assert rk.healthy_runs(runs, frameworks, 0.0)[1] == 0


def test_solve_order_on_the_adverse_fabric(sweep_groups) -> None:
    """solve's order (the tie with the fastest by robustness, scored on the adverse fabric,
    planner.search.bands.adverse_cluster: x = 0.045 from the sweep's logged busbw, no step time)
    puts the first pick within 3% of the best measured in 10 of the 16 groups, regret mean 54.1%
    (the tie scored on the stock profile: 8 of 16, 65.5%); 9 of 16 and 56.1% once the stock H100
    profile was refitted under the measured bounds, the FP8 tie and the FP8-cast term (its
    layer pass 650 -> 370 us, fitted on dgxc and llm-foundry). The dev sweep is in sample for x
    (the same cluster's logs), not for the step times."""
    regrets = [rk.score_group(g, rk.rank_plans(g, g.runs[0].cluster.gpu))["regret"]
               for g in sweep_groups]
    assert sum(r <= rk.PAIR_MARGIN for r in regrets) >= 9
    assert float(np.mean(regrets)) <= 0.57

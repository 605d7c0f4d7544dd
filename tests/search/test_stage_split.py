"""Uneven pipeline stages: CP-SAT's split against the exact DP oracle on random problems, the
split tables against the full cost model on every split of small models (brute force), and the
search on Llama 3 405B with Meta's 16 stages."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from planner.costmodel import estimate, estimate_batch
from planner.costmodel.pipeline import stage_layer_counts
from planner.errors import InfeasibleError, SpecError
from planner.layout import Layout, format_stage_layers
from planner.registry import load_model, parse_cluster
from planner.search import build_space, search
from planner.search.cpsat import SplitModel
from planner.search.problem import MEM_UNIT_GIB, scale_time
from planner.search.stages import SplitProblem, split_dp, split_problems
from planner.specs import JobSpec
from tests.search.standin import make_cluster, make_gpu, make_job, make_model

NUM_PROBLEMS = 320


def random_split_problem(rng: np.random.Generator) -> SplitProblem:
    """Linear stage times with end-stage extras and noise, memory falling with the stage index
    (fewer micro-batches in flight), a capacity that cuts some counts."""
    stages = int(rng.integers(2, 7))
    layers = int(rng.integers(stages, 4 * stages + 3))
    width = layers - stages + 1
    n = np.arange(1, width + 1)
    extra = rng.integers(0, 80, size=stages)
    extra[1:-1] = 0
    time = rng.integers(1, 50) * n[None, :] + extra[:, None] + rng.integers(0, 3, (stages, width))
    flight = stages - np.arange(stages)
    memory = rng.integers(1, 9) * n[None, :] * flight[:, None] + rng.integers(0, 40, (stages, 1))
    cap = int(rng.integers(memory.min(), memory.max() + 1))
    return SplitProblem(layers, time.astype(np.int64),
                        np.minimum(memory, cap + 1).astype(np.int64), memory <= cap)


def test_cpsat_split_matches_the_dp_oracle() -> None:
    rng = np.random.default_rng(20261124)
    infeasible = 0
    for _ in range(NUM_PROBLEMS):
        problem = random_split_problem(rng)
        got, oracle = SplitModel(problem).solve(), split_dp(problem)
        assert split_dp(problem.pruned(oracle.slowest or None)).slowest == oracle.slowest
        assert bool(got.counts) == bool(oracle.counts)
        if not oracle.counts:
            infeasible += 1
            continue
        assert (got.slowest, got.peak) == (oracle.slowest, oracle.peak)  # ties are fine
        for split in (got, oracle):
            assert sum(split.counts) == problem.layers and min(split.counts) >= 1
            assert problem.objective(split.counts) == (split.slowest, split.peak)
            assert all(problem.fits[i, n - 1] for i, n in enumerate(split.counts))
    assert 0 < infeasible < NUM_PROBLEMS // 2  # both kinds of answers were exercised


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("layers,pp,gpus,mem", [(7, 3, 6, 80.0), (9, 4, 8, 80.0), (10, 3, 6, 3.0)])
def test_split_tables_are_the_cost_model(layers, pp, gpus, mem) -> None:
    """Brute force over every split of a small model: each split evaluated by estimate_batch
    (its slowest stage per micro-batch and its peak memory), the best one (time first, then
    memory, among those that fit) equals what CP-SAT finds on the split tables."""
    model = make_model(layers=layers, hidden=512, heads=8, kv=4, ffn=1536, vocab=50000)
    cluster = make_cluster(gpus, make_gpu(memory_gib=mem, gpus_per_node=gpus))
    job = make_job(seq_len=1024, global_batch=16)
    space = build_space(model, cluster, job, {"pp": pp, "vpp": 1})
    rows = np.flatnonzero(space.pin_mask({"pp": pp, "vpp": 1}))[::7][:12].tolist()
    for row, problem in zip(rows, split_problems(space, rows), strict=True):
        base = space.layout(row)
        splits = list(_compositions(layers, pp))
        cols = estimate_batch(model, cluster, job,
                              [Layout(**{**base.as_dict(), "stage_layers": s}) for s in splits])
        m = cols["grad_accum"].astype(float)
        slow = (cols["time_compute_s"] + cols["time_tp_comm_s"] + cols["time_cp_comm_s"]
                + cols["time_ep_comm_s"]) / m
        slow_units = scale_time(slow, space.time_unit_s)
        mem_units = np.rint(cols["peak_mem_gb"] / MEM_UNIT_GIB).astype(np.int64)
        ok = cols["fits"]
        got = SplitModel(problem).solve()
        if not ok.any():
            assert not got.counts
            continue
        best = min((int(slow_units[i]), int(mem_units[i])) for i in np.flatnonzero(ok))
        assert (got.slowest, got.peak) == best
        assert problem.objective(got.counts) == best


def test_llama3_405b_on_meta_cluster_finds_meta_split() -> None:
    """Llama 3 405B on 16384 H100 with 16 plain-1F1B stages: the search finds Meta's split (one
    layer off the first and the last stage, Dubey et al. 2024 sec. 3.3.2), or one that the cost
    model proves at least as fast as the best plan that fits with Meta's split (the knobs
    searched again: under the best plan's own knobs Meta's split may not fit)."""
    model, cluster = load_model("llama3-405b"), parse_cluster("16384xH100")
    job = JobSpec(seq_len=8192, global_batch=2048)
    meta = (7,) + (8,) * 14 + (7,)
    pins = {"pp": 16, "vpp": 1, "tp": 8}
    best = search(model, cluster, job, pins, top_k=1).plans()[0]
    assert sum(best.layout.stage_layers) == 126 and len(best.layout.stage_layers) == 16
    meta_best = search(model, cluster, job, pins, top_k=1, stage_layers=meta).plans()[0]
    assert meta_best.layout.stage_layers == meta and meta_best.estimate.fits
    meta_est = estimate(model, cluster, job, Layout(**{**best.layout.as_dict(),
                                                       "stage_layers": meta}))
    assert best.layout.stage_layers == meta or (
        best.estimate.step_time_s <= meta_best.estimate.step_time_s
        and (best.estimate.step_time_s <= meta_est.step_time_s or not meta_est.fits))
    assert best.estimate.fits


def test_uneven_split_beats_the_even_rule_where_the_head_is_heavy() -> None:
    """Llama 3 8B (128k vocabulary) on 4 A100 stages: the LM head costs most of a layer, so the
    best split gives the last stage fewer layers than the even rule's 8; the step time falls."""
    model, cluster = load_model("llama3-8b"), parse_cluster("8xA100-40GB")
    job = JobSpec(seq_len=4096, global_batch=64)
    pins = {"pp": 4, "vpp": 1, "tp": 1, "dp": 2, "mbs": 1, "zero": 2, "recompute": "none"}
    even = search(model, cluster, job, pins, top_k=1, even_stages=True).plans()[0]
    split = search(model, cluster, job, pins, top_k=1).plans()[0]
    assert even.layout.stage_layers == (8, 8, 8, 8)
    assert split.layout.stage_layers[-1] < 8 and sum(split.layout.stage_layers) == 32
    assert split.estimate.step_time_s < even.estimate.step_time_s
    again = estimate(model, cluster, job, split.layout)
    assert again.step_time_s == pytest.approx(split.estimate.step_time_s, rel=1e-12)


def test_pinned_split_and_its_errors() -> None:
    model, cluster = load_model("llama3-8b"), parse_cluster("8xA100-40GB")
    job = JobSpec(seq_len=4096, global_batch=64)
    plans = search(model, cluster, job, {"tp": 1}, top_k=3, stage_layers=(7, 9, 9, 7)).plans()
    assert all(p.layout.stage_layers == (7, 9, 9, 7) and p.layout.pp == 4 for p in plans)
    assert all(p.layout.vpp == 1 for p in plans)
    with pytest.raises(SpecError, match="sums to 31"):
        search(model, cluster, job, {}, stage_layers=(7, 9, 8, 7))
    with pytest.raises(SpecError, match="--pp is 2"):
        search(model, cluster, job, {"pp": 2}, stage_layers=(8, 8, 8, 8))


def test_count_features_match_stage_rows() -> None:
    """The split tables' stage rows (one layer's increment per extra layer) equal the rows
    built layer by layer."""
    from planner.costmodel import pipeline

    for model in (load_model("llama3-405b"), load_model("mixtral-8x7b"), make_model(layers=5)):
        for pp, width in ((2, 4), (4, 3), (16, 10)):
            if pp > model.num_hidden_layers:
                continue
            got = pipeline.count_features(model, pp, width)
            rows = [pipeline._stage_row(model, i, pp, range(n))
                    for i in range(pp) for n in range(1, width + 1)]
            want = pipeline._features(rows, prune=False)
            for name in pipeline.StageFeatures.__dataclass_fields__:
                assert np.array_equal(getattr(got, name), getattr(want, name)), name


def test_stage_layers_format_and_label() -> None:
    assert format_stage_layers((7,) + (8,) * 14 + (7,)) == "7,8x14,7"
    assert format_stage_layers((3, 3, 4)) == "3,3,4"
    even = Layout(pp=4, stage_layers=tuple(stage_layer_counts(30, 4)))
    assert even.even_split and "L" not in str(even)
    assert str(Layout(pp=3, stage_layers=(4, 3, 3))).endswith("-L4,3,3")
    assert Layout(**Layout(pp=2, stage_layers=(1, 2)).as_dict()).stage_layers == (1, 2)


def test_search_with_random_small_problems_never_worse_than_even() -> None:
    """With the split searched, the best plan is never slower than with the even rule."""
    rng = random.Random(7)
    for _ in range(12):
        model = make_model(layers=rng.choice([5, 7, 9, 11]), hidden=512, heads=8, kv=4,
                           ffn=1536, vocab=rng.choice([32000, 128000]))
        cluster = make_cluster(8, make_gpu(memory_gib=rng.choice([8.0, 80.0]), gpus_per_node=8))
        job = make_job(seq_len=2048, global_batch=32)
        pins = {"pp": rng.choice([2, 4]), "vpp": 1}
        try:
            even = search(model, cluster, job, pins, top_k=3, even_stages=True).plans()
        except InfeasibleError:  # nothing fits evenly: the split may still fit
            even = []
        try:
            split = search(model, cluster, job, pins, top_k=3).plans()
        except InfeasibleError:
            assert not even
            continue
        assert len(split) >= len(even)
        for s, e in zip(split, even, strict=False):  # the k-th best is never slower
            assert s.estimate.step_time_s <= e.estimate.step_time_s * (1 + 1e-12)


def test_pooled_dp_matches_cpsat_over_pool_orders() -> None:
    """Two or three pools, each with its own (time, memory) tables at every stage position: the
    DP over (pools placed, layers, stages) finds the same (slowest stage, peak memory) as CP-SAT
    solved for every pool order, on 320 random problems; its split and order reproduce it."""
    from itertools import permutations

    from planner.search.stages import split_dp_pools

    rng = np.random.default_rng(1124)
    infeasible = 0
    for _ in range(NUM_PROBLEMS):
        k = int(rng.integers(2, 4))
        stages_per = [int(rng.integers(1, 3)) for _ in range(k)]
        stages = sum(stages_per)
        layers = int(rng.integers(stages, 3 * stages + 3))
        width = layers - stages + 1
        n = np.arange(1, width + 1)
        tables = []
        for _j in range(k):
            extra = rng.integers(0, 60, size=stages)
            extra[1:-1] = 0
            time = rng.integers(1, 40) * n[None, :] + extra[:, None]
            flight = stages - np.arange(stages)
            mem = rng.integers(1, 6) * n[None, :] * flight[:, None] + rng.integers(0, 30)
            cap = int(rng.integers(mem.min(), mem.max() + 1))
            tables.append(SplitProblem(layers, time.astype(np.int64),
                                       np.minimum(mem, cap + 1).astype(np.int64), mem <= cap))
        oracle, order = split_dp_pools(layers, tables, stages_per)
        best = None
        for perm in permutations(range(k)):
            rows = [j for j in perm for _ in range(stages_per[j])]
            prob = SplitProblem(layers, np.stack([tables[j].time[i] for i, j in enumerate(rows)]),
                                np.stack([tables[j].memory[i] for i, j in enumerate(rows)]),
                                np.stack([tables[j].fits[i] for i, j in enumerate(rows)]))
            got = SplitModel(prob).solve()
            if got.counts and (best is None or (got.slowest, got.peak) < best):
                best = (got.slowest, got.peak)
            if perm == order and oracle.counts:
                assert prob.objective(oracle.counts) == (oracle.slowest, oracle.peak)
        if best is None:
            assert not oracle.counts
            infeasible += 1
            continue
        assert (oracle.slowest, oracle.peak) == best
    assert 0 < infeasible < NUM_PROBLEMS // 2


@pytest.mark.parametrize("mem", [2.5, 3.0, 4.0])
def test_memory_prefilter_drops_only_splits_that_cannot_fit(mem) -> None:
    """_balanced_bound's can_fit (the line through 1 and 2 layers bounds the layers a stage can
    hold: its memory is convex in them) is never False for a layout some split fits: checked
    against the exact oracle on every plain and interleaved layout of a small model."""
    from planner.search.stages import _balanced_bound

    model = make_model(layers=12, hidden=512, heads=8, kv=4, ffn=1536, vocab=50000)
    cluster = make_cluster(8, make_gpu(memory_gib=mem, gpus_per_node=8))
    job = make_job(seq_len=1024, global_batch=16)
    space = build_space(model, cluster, job, {})
    rows = np.flatnonzero(space.knobs["pp"] > 1)
    assert (space.knobs["vpp"][rows] > 1).any()
    _, _, can_fit = _balanced_bound(space, rows)
    assert 0 < can_fit.sum() < len(rows)  # both answers exercised
    for r, problem in zip(rows[~can_fit].tolist(), split_problems(space, rows[~can_fit]),
                          strict=True):
        assert not split_dp(problem).counts, space.layout(r)

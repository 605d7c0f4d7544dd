"""The split search over mixed layer kinds (the first layers dense, the rest MoE): its dynamic
program against enumeration of every split, its tables against the full cost model, and
DeepSeek-V3's published pipeline layout (pp 8 x vpp 4) found by the search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.costmodel import estimate, estimate_batch, pipeline
from planner.costmodel.batch import stage_costs
from planner.layout import Layout, chunks_of_stages, parse_pipeline_layout
from planner.registry import load_model, parse_cluster
from planner.search import build_space, enumerate_layouts, search
from planner.search.problem import MEM_UNIT_GIB, scale_time
from planner.search.stages import kind_split_brute, kind_split_problems, solve_kind_splits
from planner.specs import JobSpec, ModelSpec
from tests.search.standin import make_cluster, make_gpu, make_job


def small_moe(layers: int = 8, dense: int = 2) -> ModelSpec:
    """A small DeepSeek-like model: the first `dense` layers dense, the rest MoE."""
    return ModelSpec(name="mini-moe", num_hidden_layers=layers, hidden_size=512,
                     num_attention_heads=8, num_key_value_heads=4, intermediate_size=2048,
                     vocab_size=32000, activation="swiglu", num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=512,
                     first_k_dense_replace=dense)


@pytest.mark.parametrize("pp,vpp,mem", [(2, 1, 80.0), (3, 1, 80.0), (2, 2, 80.0), (3, 2, 80.0),
                                        (3, 1, 3.0), (3, 2, 3.0)])
def test_kind_split_is_the_enumerators_and_the_cost_models(pp, vpp, mem) -> None:
    """Every split of an 8-layer model (2 dense, 6 MoE) enumerated: the dynamic program's
    (slowest stage, peak memory) is the enumerator's best on the same tables, its split the
    enumerator's where that is unique, and the tables are the cost model's: each split's
    chunks evaluated by estimate_batch give the same slowest stage and peak memory."""
    model = small_moe()
    cluster = make_cluster(6 if pp == 3 else 4, make_gpu(memory_gib=mem, gpus_per_node=8))
    job = make_job(seq_len=1024, global_batch=12)
    pins = {"pp": pp, "vpp": vpp}
    space = build_space(model, cluster, job, pins)
    rows = np.flatnonzero(space.pin_mask(pins))[::5][:6].tolist()
    assert rows
    problems = kind_split_problems(space, rows, 2)
    answers = solve_kind_splits(problems)
    solved = 0
    for row, problem, got in zip(rows, problems, answers, strict=True):
        best, where = kind_split_brute(problem)
        if best is None:
            assert not got.counts
            continue
        solved += 1
        assert (got.slowest, got.peak) == best
        assert problem.objective(got.counts) == best
        if len(where) == 1:
            assert got.counts == where[0]
        # the tables are the cost model: every allowed split costed as a layout
        base = space.layout(row).as_dict()
        splits = [c for c in itertools.product(range(1, 8), repeat=pp)
                  if sum(c) == 8 and problem.objective(c) is not None]
        layouts = [Layout(**{**base, "stage_layers": c if vpp == 1
                             else tuple(chunks_of_stages(c, vpp))}) for c in splits]
        cols = estimate_batch(model, cluster, job, layouts)
        m = cols["grad_accum"].astype(float)
        slow = (cols["time_compute_s"] + cols["time_tp_comm_s"] + cols["time_cp_comm_s"]
                + cols["time_ep_comm_s"]) / m
        slow_units = scale_time(slow, space.time_unit_s)
        mem_units = np.rint(cols["peak_mem_gb"] / MEM_UNIT_GIB).astype(np.int64)
        for j, c in enumerate(splits):
            t, p = problem.objective(c)
            assert int(slow_units[j]) == t
            if cols["fits"][j]:
                assert int(mem_units[j]) == p
    assert solved


def test_deepseek_v3_published_pp8_vpp4_is_searched() -> None:
    """The published run of planner/data/published_runs.csv row 941 (Megatron-Bridge 25.11,
    DeepSeek-V3 on 256 GB200: TP 1, PP 8, VPP 4, DP 32, EP 32, micro-batch 1, 4096 sequences
    of 4096). pp 8 x vpp 4 = 32 chunks divide neither 61 nor 63 layers: the unpinned space
    holds these degrees now (a layout string states the chunks), and the split search gives
    them the split worked out here by hand from the stage terms (stage i holding n layers, d of
    them dense, the embedding on stage 0, MTP and the LM head on stage 7; each stage's layers
    spread over its chunks by layout.stage_chunks, so stage 0 holds floor(n/4) of the dense
    layers in its first chunk and stage 1 the rest of the first three). The last stage with 5
    layers is slower than an inner stage with 8 MoE layers. With 4 on the last, 57 layers on
    7 stages put 9 on one of them, and each 9-layer stage is slower still; so the last holds 5
    and, every other stage at most 8, the others hold exactly 8: (8, 8, 8, 8, 8, 8, 8, 5). The
    program minimizes the slowest stage; interleaved rounds then run at the head's chunk, as
    NVIDIA's 'Et|(tt|)*30mL' does (below)."""
    model, cluster = load_model("deepseek-v3"), parse_cluster("256xGB200")
    job = JobSpec(seq_len=4096, global_batch=4096)
    degrees = {"tp": 1, "pp": 8, "dp": 32, "ep": 32, "vpp": 4, "mbs": 1}
    knobs = enumerate_layouts(model, cluster, job)
    there = np.ones(len(knobs["tp"]), dtype=bool)
    for key, value in degrees.items():
        there &= knobs[key] == value
    assert there.any()  # unpinned: the published degrees are among the candidates
    result = search(model, cluster, job, degrees, top_k=3)
    assert result.timings["stage_splits_solved"] > 0
    plan = result.plans()[0]
    lo = plan.layout
    assert lo.virtual_split and len(lo.stage_layers) == 32 and sum(lo.stage_layers) == 61
    # the stage terms by (stage, layers, dense layers), from the cost model
    t, _ = stage_costs(model, cluster, job, [Layout(**{**lo.as_dict(), "stage_layers": ()})],
                       pipeline.kind_features(model, 8, 10, 3))
    t = t.reshape(8, 10, 4)  # [stage, layers - 1, dense]
    last5, inner8 = t[7, 4, 0], t[3, 7, 0]
    assert last5 > inner8
    nine = [t[0, 8, 2],  # stage 0: 9 layers, first chunk floor(9/4) = 2 of them dense
            t[1, 8, 1],  # stage 1 after it: the third dense layer
            t[3, 8, 0]]  # an inner stage
    assert min(nine) > last5 and t[7, 5, 0] > last5  # 9 elsewhere, or 6 on the last: slower
    assert lo.layers_per_stage == (8, 8, 8, 8, 8, 8, 8, 5)
    slowest = result.space.columns["stage_mb_s"][result.indices[0]]
    assert slowest == pytest.approx(last5, rel=1e-9)
    # interleaved rounds move at their slowest chunk (costmodel.batch.round_period): the
    # search writes the last chunk empty, as NVIDIA's layout does, so the last round runs at the
    # LM head + MTP chunk alone; every round before it at two MoE layers: 3 x 2 a_m + (t[7, 0, 0]
    # - a_m), one MoE layer less than the last stage with one layer
    assert lo.stage_layers[-1] == 0
    a_m = t[3, 1, 0] - t[3, 0, 0]
    by_hand = 6 * a_m + (t[7, 0, 0] - a_m)
    nvidia = Layout(**{**lo.as_dict(), "stage_layers": tuple(
        c for _, c, _, _ in parse_pipeline_layout("Et|(tt|)*30mL"))})
    from planner.costmodel.batch import _Knobs, layout_arrays, round_period

    cols = layout_arrays([lo, nvidia])
    period = round_period(model, cluster, job, _Knobs.of(cols, job, model), cols)
    assert period == pytest.approx([by_hand, by_hand], rel=1e-9)
    # both run at that round, so their steps differ only in the fill and drain the stage totals
    # give (pipeline.bubble_time): under 0.1% here
    theirs = estimate(model, cluster, job, nvidia)
    assert plan.estimate.step_time_s == pytest.approx(theirs.step_time_s, rel=1e-3)

"""Megatron's pipeline layout (--pipeline-model-parallel-layout): layers per virtual stage, read,
costed, searched, exported and read back; the schedule of an uneven interleaved layout worked
out by hand and checked against pipeline.simulate()."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.costmodel import estimate, estimate_batch, pipeline
from planner.errors import LayoutError
from planner.launchers import export_plan
from planner.launchers.common import Imported, LaunchPlan
from planner.launchers.megatron import parse_args_text, read_args
from planner.layout import Layout, chunks_of_stages, parse_pipeline_layout
from planner.registry import load_model, parse_cluster
from planner.specs import JobSpec

# NVIDIA's DeepSeek-V3 layouts: PP 8 x VPP 4 (embedding + 1 layer, 30 chunks of 2, MTP + loss)
# and Megatron-LM's docs example for PP 16 x VPP 2 (MTP and the loss each a chunk of their own)
DSV3_PP8 = "Et|(tt|)*30mL"
DSV3_PP16 = "Et*3|(tt|)*29,m|L"


def _makespan(pp, vpp, m, chunks, f=1.0, b=2.0):
    slots = pipeline.simulate(pp, vpp, m, [f * n for n in chunks], [b * n for n in chunks])
    return max(s.end for s in slots)


def test_uneven_interleaved_schedule_by_hand():
    """pp 2, vpp 2, m 2; chunks of 1, 2, 2, 1 layers (virtual stages 0..3; 0 and 2 on stage 0),
    a layer's forward 1 and backward 2 time units. Stage 0 warms up with 2(pp-1) + pp = 4
    forwards (all), stage 1 with 2, then F/B alternate. By hand (start-end):
      stage 0: F0v0 0-1, F1v0 1-2, F0v2 3-5 (after F0v1), F1v2 5-7, B0v2 8-12 (after B0v3),
               B1v2 12-16, B0v0 16-18 (after B0v1), B1v0 20-22 (after B1v1)
      stage 1: F0v1 1-3, F1v1 3-5, F0v3 5-6, B0v3 6-8, F1v3 8-9, B1v3 9-11, B0v1 12-16,
               B1v1 16-20
    so the step takes 22. Each stage holds 3 layers: 9 units per micro-batch, 18 busy of the 22:
    a bubble of 4. The cost model's closed form (pipeline.bubble_time, from the stages' totals)
    gives (pp - 1)/vpp x the other stage's 9 = 4.5: half a unit (2%) above, because the light
    chunks at both ends fill and drain the pipeline faster than equal chunks would."""
    assert pipeline.chunk_totals([1, 2, 2, 1], 2) == [3, 3]
    assert _makespan(2, 2, 2, [1, 2, 2, 1]) == 22.0
    per_stage = [(1.0 + 2.0) * n for n in pipeline.chunk_totals([1, 2, 2, 1], 2)]
    assert per_stage == [9.0, 9.0]
    closed = float(pipeline.bubble_time(2, 2, 2, max(per_stage), sum(per_stage)))
    assert closed == 4.5
    assert _makespan(2, 2, 2, [1, 2, 2, 1]) - 2 * max(per_stage) == 4.0  # the simulated bubble
    # equal chunks: the closed form is the schedule (Narayanan 2021 sec. 2.2.2)
    assert _makespan(2, 2, 4, [2, 2, 2, 2]) == 4 * 12.0 + float(
        pipeline.bubble_time(2, 2, 4, 12.0, 24.0)) == 54.0
    # per-virtual-stage times given as one per stage repeat over the chunks (the old form)
    assert _makespan(2, 2, 4, [2, 2]) == 54.0


def test_virtual_split_is_costed_per_stage_total():
    """Llama 3 8B (32 layers) on pp 4 x vpp 2 with chunks 3,4,4,4,4,4,4,5: the stages hold
    7, 8, 8, 9 layers. Its slowest stage's compute per micro-batch is the vpp-1 layout's with
    those per-stage counts (a second layout, the same stage), and its bubble is that layout's
    over vpp (m >= pp: (pp-1)/vpp x the mean of the other stages)."""
    model, cluster = load_model("llama3-8b"), parse_cluster("32xH100")
    job = JobSpec(seq_len=4096, global_batch=64)
    chunks = (3, 4, 4, 4, 4, 4, 4, 5)
    virt = Layout(tp=8, pp=4, dp=1, vpp=2, sp=True, stage_layers=chunks)
    plain = replace(virt, vpp=1, stage_layers=(7, 8, 8, 9))
    feats = pipeline.stage_features(model, 4, 2, chunks, prune=False)
    assert feats.n_dense.tolist() == [7, 8, 8, 9]
    assert feats.emb.tolist() == [1, 0, 0, 0] and feats.head.tolist() == [0, 0, 0, 1]
    cols = estimate_batch(model, cluster, job, [virt, plain])
    assert cols["slow_stage"].tolist() == [3, 3]
    assert cols["fwd_mb_s"][0] == pytest.approx(cols["fwd_mb_s"][1], rel=1e-12)
    assert cols["stage_mb_s"][0] == pytest.approx(cols["stage_mb_s"][1], rel=1e-12)
    assert cols["grad_accum"][0] == 64  # m >= pp: the steady-state bubble form
    assert cols["time_pp_bubble_s"][0] == pytest.approx(cols["time_pp_bubble_s"][1] / 2,
                                                        rel=1e-12)
    assert virt.layers_per_stage == (7, 8, 8, 9) and not virt.even_split


@pytest.mark.parametrize("text,pp,vpp,per_stage", [
    (DSV3_PP8, 8, 4, (7,) + (8,) * 6 + (6,)),  # stage 0: 1+2+2+2, stage 7: 2+2+2+0
    (DSV3_PP16, 16, 2, (5,) + (4,) * 13 + (2, 2)),  # rank 14: 2 + MTP, rank 15: 2 + loss
])
def test_deepseek_v3_layouts_are_expressible(text, pp, vpp, per_stage, tmp_path):
    """DeepSeek-V3 (61 layers) on PP 8 x VPP 4 and PP 16 x VPP 2 with NVIDIA's layouts: read by
    `estimate --stage-layers`, costed per stage total, exported to Megatron-LM and
    Megatron-Bridge as the same layout, and read back to the same chunks."""
    chunks = tuple(t for _, t, _, _ in parse_pipeline_layout(text))
    result = CliRunner().invoke(app, [
        "estimate", "--model", "deepseek-v3", "--cluster", "1024xH100", "--tp", "2",
        "--pp", str(pp), "--ep", "64", "--stage-layers", text, "--seq-len", "4096",
        "--global-batch", "8192", "--recompute", "full", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["vpp"] == vpp and tuple(got["stage_layers"]) == chunks
    layout = Layout(**{k: got[k] for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero",
                                           "recompute", "sp", "etp")}, stage_layers=chunks)
    assert layout.layers_per_stage == per_stage
    model, cluster = load_model("deepseek-v3"), parse_cluster("1024xH100")
    from planner.stacks import DEFAULT_STACK, resolve_stack

    # the job the CLI builds: the default stack's (Megatron-Core: cuDNN attention on Hopper)
    job = resolve_stack(DEFAULT_STACK).job(JobSpec(seq_len=4096, global_batch=8192))
    assert estimate(model, cluster, job, layout).step_time_s == pytest.approx(
        got["step_time_s"], rel=1e-9)
    # the even rule cannot split 61 layers into 32 chunks by Megatron's flags: refused without
    # the layout, costed with it
    if pp * vpp == 32:
        with pytest.raises(LayoutError, match="divide neither"):
            estimate(model, cluster, job, replace(layout, stage_layers=()))
    plan = LaunchPlan(model, cluster, job, layout, got["step_time_s"])
    text_out = export_plan("megatron", plan).text
    assert "--pipeline-model-parallel-layout" in text_out
    # the layout states vpp (its chunks / pp): split_args writes no virtual-stages flag beside it
    args = text_out[text_out.index("pretrain_gpt.py"):] if "pretrain_gpt.py" in text_out \
        else text_out
    back = read_args(parse_args_text(args), Imported("megatron", "x.sh"))
    assert back.stage_layers == chunks and back.pins["vpp"] == vpp and back.pins["pp"] == pp
    bridge = export_plan("nemo", plan)
    assert "pipeline_model_parallel_layout: " in bridge.text and "|" in bridge.text
    path = tmp_path / "bridge.yaml"  # Megatron-Bridge's ConfigContainer overrides
    path.write_text(bridge.text)
    from planner.launchers import read_config

    again = read_config(path)
    assert again.stage_layers == chunks and again.pins["vpp"] == vpp


def test_layout_strings_follow_megatrons_rules():
    assert parse_pipeline_layout("Et|(tt|)*30mL")[-1] == (0, 0, 1, 1)
    for bad, why in (("t|EL", "embedding E must open"), ("Et|tL|L", "once each"),
                     ("Etm|tL", "before the MTP"), ("Ex|L", "characters")):
        with pytest.raises(LayoutError, match=why):
            parse_pipeline_layout(bad)


def test_chunks_of_stages_keep_totals_and_lighten_end_chunks():
    chunks = chunks_of_stages((7, 8, 8, 8, 8, 8, 8, 6), 4)
    assert pipeline.chunk_totals(chunks, 8) == [7, 8, 8, 8, 8, 8, 8, 6]
    assert chunks[0] == 1 and chunks[-1] == 1  # the embedding's and the loss's chunks lightest
    assert chunks_of_stages((3, 4, 4, 3), 4)[0] == 0  # vpp - 1 layers: an embedding-only chunk


def test_split_search_over_virtual_stages():
    """Llama 3 8B on 64 H100, pp 8 x vpp 2 pinned: the search finds layers per virtual stage
    where the even rule's do not fit (or are slower); the plan it returns is the cost model's
    own estimate of that layout, its stages' totals the CP-SAT split's, every chunk a layer
    but the embedding's and the loss's (which may hold none, as NVIDIA's layouts do)."""
    from planner.search import search

    model, cluster = load_model("llama3-8b"), parse_cluster("64xH100")
    job = JobSpec(seq_len=4096, global_batch=128)
    result = search(model, cluster, job, {"pp": 8, "vpp": 2}, top_k=3)
    assert result.timings["stage_splits_solved"] > 0
    uneven = [p for p in result.plans() if p.layout.virtual_split and not p.layout.even_split]
    assert uneven
    for p in uneven:
        lo = p.layout
        assert len(lo.stage_layers) == 16 and sum(lo.stage_layers) == 32
        assert min(lo.stage_layers[1:-1]) >= 1
        again = estimate(model, cluster, job, lo)
        assert again.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-12)
        even = estimate(model, cluster, job, replace(lo, stage_layers=()))
        assert (not even.fits) or even.step_time_s > again.step_time_s


def test_solve_with_a_pinned_layout_string():
    """`solve --stage-layers` with a layout string whose chunks the even rule cannot give (pp 8
    x vpp 4 on 61 layers): every plan keeps it."""
    result = CliRunner().invoke(app, [
        "solve", "--model", "deepseek-v3", "--cluster", "1024xH100", "--pp", "8",
        "--stage-layers", DSV3_PP8, "--seq-len", "4096", "--global-batch", "8192", "--top",
        "2", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)
    assert plans and all(p["vpp"] == 4 and p["stage_layers"] == [1] + [2] * 30 + [0]
                         for p in plans)
    np.testing.assert_array_less(0, [p["step_time_s"] for p in plans])


def test_mtp_module_costs_one_layer_and_one_head_pass_on_the_last_stage():
    """DeepSeek-V3's MTP module (num_nextn_predict_layers 1) sits on the last stage: one more MoE
    layer like the last and one more pass through the LM head. Its time is the time of the same
    stage holding one more MoE layer and counting the head twice on the model without MTP (a
    second construction of the same terms); its parameters are ModelSpec.mtp_params."""
    from planner.costmodel.batch import stage_costs

    with_mtp = load_model("deepseek-v3")
    without = with_mtp.model_copy(update={"num_nextn_predict_layers": 0})
    cluster, job = parse_cluster("1024xH100"), JobSpec(seq_len=4096, global_batch=8192)
    chunks = (1,) + (2,) * 30 + (0,)
    f = pipeline.stage_features(with_mtp, 8, 4, chunks, prune=False)
    g = pipeline.stage_features(without, 8, 4, chunks, prune=False)
    assert f.mtp.tolist() == [0] * 7 + [1]
    assert f.n_moe[-1] == g.n_moe[-1] + 1 and f.n_dense[-1] == g.n_dense[-1]
    expert = with_mtp.num_experts * with_mtp.mlp_params(with_mtp.expert_ffn)
    assert f.p_expert[-1] - g.p_expert[-1] == expert
    assert f.p_dense[-1] - g.p_dense[-1] == with_mtp.mtp_params - expert
    assert f.p_dense[:-1].tolist() == g.p_dense[:-1].tolist()
    layout = Layout(tp=2, pp=8, dp=64, ep=64, etp=1, vpp=4, sp=True, zero=1, recompute="full",
                    stage_layers=chunks)
    twin = pipeline.StageFeatures(**{**{k: getattr(g, k)[-1:] for k in g.__dataclass_fields__},
                                     "n_moe": g.n_moe[-1:] + 1, "head": np.array([2.0])})
    t_mtp, _ = stage_costs(with_mtp, cluster, job, [layout], pipeline.StageFeatures(
        **{k: getattr(f, k)[-1:] for k in f.__dataclass_fields__}))
    t_twin, _ = stage_costs(without, cluster, job, [layout], twin)
    assert t_mtp[0, 0] == pytest.approx(t_twin[0, 0], rel=1e-12)
    t_plain, _ = stage_costs(without, cluster, job, [layout], pipeline.StageFeatures(
        **{k: getattr(g, k)[-1:] for k in g.__dataclass_fields__}))
    assert t_mtp[0, 0] > t_plain[0, 0]


def _rounds(pp: int, vpp: int, chunk_s) -> float:
    """Interleaved 1F1B's steady-state time per micro-batch by hand: the sum over the vpp
    rounds of the slowest chunk (chunk c * pp + s on stage s)."""
    return sum(max(chunk_s[c * pp + s] for s in range(pp)) for c in range(vpp))


@pytest.mark.parametrize("chunks,m,stalls", [
    ((1,) + (2,) * 30 + (0,), 16, False),  # NVIDIA's DeepSeek-V3 'Et|(tt|)*30mL'
    ((2,) * 23 + (1,) + (2,) * 7 + (1,), 16, True),  # one layer beside the head: a slow round
    ((2,) * 23 + (1,) + (2,) * 7 + (0,), 16, False),  # the split search's (last chunk empty)
    ((1,) + (2,) * 29 + (1, 1), 8, False),  # the even chunk rule
])
def test_uneven_interleaved_step_against_simulate(chunks, m, stalls):
    """DeepSeek-V3-like pp 8 x vpp 4 chunks in abstract units: an MoE layer's forward 1 and
    backward 2, a dense layer 2/3 of that (the first three), the LM head + MTP 3 layers on the
    last chunk. The cost model's pipeline time m x max(slowest stage, the rounds' period) + the
    closed-form fill and drain (pipeline.bubble_time on the stage totals) against simulate():
    within 2% of the step. The stage totals alone (the form before the round period) are 8.5%
    under for one layer beside the head (425.25 against 465 units): its last round runs at one
    layer + the head, 4 layers' time, where the other rounds run at 2 and the stage totals
    never see it."""
    pp, vpp = 8, 4
    layer = [2.0 if i < 3 else 3.0 for i in range(61)]
    chunk_s, start = [], 0
    for c, n in enumerate(chunks):
        chunk_s.append(sum(layer[start:start + n]) + (9.0 if c == len(chunks) - 1 else 0.0))
        start += n
    stages = [sum(chunk_s[c] for c in range(s, len(chunks), pp)) for s in range(pp)]
    slowest, whole = max(stages), sum(stages)
    slots = pipeline.simulate(pp, vpp, m, [t / 3 for t in chunk_s], [2 * t / 3 for t in chunk_s])
    simulated = max(s.end for s in slots)
    fill = float(pipeline.bubble_time(pp, vpp, m, slowest, whole))
    closed = m * max(slowest, _rounds(pp, vpp, chunk_s)) + fill
    assert closed == pytest.approx(simulated, rel=0.02)
    if stalls:
        assert (m * slowest + fill) < 0.95 * simulated


def test_a_split_per_virtual_stage_searches_each_layout_once():
    """--stage-layers with one count per virtual stage pins pp and vpp; the space holds each
    layout once (it held every vpp's rows relabelled to the pinned vpp: 1920 rows, 480 distinct,
    plans repeated four times on Llama 3 8B pp 4 x vpp 2)."""
    from planner.search import search
    from planner.search.problem import KNOBS

    model, cluster = load_model("llama3-8b"), parse_cluster("64xH100")
    result = search(model, cluster, JobSpec(seq_len=4096, global_batch=512), {"pp": 4, "vpp": 2},
                    10, stage_layers=(4,) * 8)
    space = result.space
    rows = [tuple(int(space.knobs[k][i]) for k in KNOBS)
            for i in np.flatnonzero(space.pin_mask({"pp": 4, "vpp": 2}))]
    assert rows and len(rows) == len(set(rows))
    layouts = [p.layout for p in result.plans()]
    assert len(layouts) == 10 == len(set(layouts))

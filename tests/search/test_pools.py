"""Clusters of GPU pools: the grammar and YAML, the pooled cost model against the homogeneous
one (two pools of the same GPU), the pooled search against an exhaustive oracle (every layout,
both pool orders, every split by the DP oracle), and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from planner.costmodel import Estimate, estimate_batch
from planner.costmodel.pools import estimate_pooled, estimate_pooled_batch
from planner.errors import SpecError
from planner.layout import RECOMPUTE_LEVELS, Layout
from planner.registry import load_gpu, load_model, parse_cluster, parse_cluster_or_pools
from planner.search.pools import _problem, _tables, pooled_knobs, search_pooled
from planner.search.problem import normalize_pins
from planner.search.stages import split_dp, split_width
from planner.specs import ClusterSpec, JobSpec, PooledCluster
from tests.search.standin import make_cluster, make_gpu, make_job, make_model


def test_grammar_and_yaml(tmp_path):
    c = parse_cluster_or_pools("64xH100+128xA100")
    assert isinstance(c, PooledCluster) and c.num_gpus == 192
    assert [p.gpu.name for p in c.pools] == ["H100-SXM", "A100-SXM4-80GB"]
    shaped = parse_cluster_or_pools("8x8xH100+16x8xA100")
    assert [(p.num_nodes, p.gpus_per_node) for p in shaped.pools] == [(8, 8), (16, 8)]
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - {gpu: H100, num_nodes: 8, gpus_per_node: 8}\n"
                    "  - {gpu: A100-40GB, num_nodes: 4}\n")
    yc = parse_cluster_or_pools(str(path))
    assert [p.gpu.name for p in yc.pools] == ["H100-SXM", "A100-SXM4-40GB"]
    assert yc.pools[1].gpus_per_node == 8 and yc.num_gpus == 96
    assert isinstance(parse_cluster_or_pools("128xA100"), ClusterSpec)
    with pytest.raises(SpecError, match="explain, report and export only"):  # the others: one GPU
        parse_cluster("64xH100+128xA100")
    for bad, why in (("64xH100+", "empty pool"), ("64xH100+64xH100", "two pools"),
                     ("64xH100+8xNOPE", "unknown GPU")):
        with pytest.raises(SpecError, match=why):
            parse_cluster_or_pools(bad)
    path.write_text("pools:\n  - {gpu: H100, num_nodes: 8, color: red}\n  - {gpu: A100}\n")
    with pytest.raises(SpecError, match=r"pools\[0\].*color"):
        parse_cluster_or_pools(str(path))


def test_same_gpu_pools_match_the_homogeneous_model():
    """Two pools of one GPU (renamed) against one cluster of both: every stage term is the same
    function of the same GPU, so time and memory columns agree exactly; the DP/optimizer term
    takes the slower pool's heaviest stage (the homogeneous model takes the one heaviest
    stage), within 2% of the step."""
    model, h = load_model("llama3-70b"), load_gpu("H100")
    a = ClusterSpec(gpu=h, num_nodes=4, gpus_per_node=8)
    b = ClusterSpec(gpu=h.model_copy(update={"name": "H100-twin"}), num_nodes=4, gpus_per_node=8)
    whole = ClusterSpec(gpu=h, num_nodes=8, gpus_per_node=8)
    job = JobSpec(seq_len=4096, global_batch=128)
    layouts = [Layout(tp=8, pp=4, dp=2, zero=z, recompute=r, sp=True, stage_layers=(20,) * 4)
               for z in (0, 1, 3) for r in ("none", "selective", "full")]
    layouts.append(Layout(tp=4, pp=8, dp=2, mbs=2, zero=1, sp=True,
                          stage_layers=(9, 10, 10, 11, 10, 10, 10, 10)))
    hom = estimate_batch(model, whole, job, layouts)
    pooled = estimate_pooled_batch(model, PooledCluster(pools=(a, b)), job, layouts, (0, 1))
    for name in ("time_compute_s", "time_tp_comm_s", "time_pp_bubble_s", "time_pp_comm_s",
                 "peak_mem_gb", "mem_activations_gb", "mem_weights_gb", "fits", "peak_stage"):
        np.testing.assert_allclose(np.asarray(pooled[name], float), np.asarray(hom[name], float),
                                   rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(pooled["step_time_s"], hom["step_time_s"], rtol=0.02)
    assert (pooled["stage_pool"][0, :4] == [0, 0, 1, 1]).all()


def test_one_pool_is_the_homogeneous_cluster_bit_for_bit():
    """One assembly (costmodel.batch._assemble) serves both: a cluster of one pool gives the
    homogeneous path's columns exactly (np.array_equal, not approx) over a whole space: every
    layout of llama3-8b on 16 H100 with pp <= 4 and vpp 1, its layers per stage written out."""
    from planner.layout import KNOBS
    from planner.search import enumerate_layouts, with_stage_layers

    model, cluster = load_model("llama3-8b"), parse_cluster("16xH100")
    job = JobSpec(seq_len=4096, global_batch=64)
    knobs = enumerate_layouts(model, cluster, job, {"vpp": 1})
    layouts = [with_stage_layers(Layout(**{
        k: (RECOMPUTE_LEVELS[int(knobs[k][i])] if k == "recompute" else bool(knobs[k][i])
            if k == "sp" else int(knobs[k][i])) for k in KNOBS}), model.num_hidden_layers)
        for i in np.flatnonzero(knobs["pp"] <= 4)]
    assert len(layouts) > 500
    hom = estimate_batch(model, cluster, job, layouts)
    one = PooledCluster.model_construct(pools=(cluster,))  # the grammar asks for two or more
    pooled = estimate_pooled_batch(model, one, job, layouts, (0,))
    shared = sorted(set(hom) & set(pooled))
    assert {"step_time_s", "step_time_low_s", "mfu", "peak_mem_gb", "fits",
            "time_dp_comm_exposed_s", "p2p_send_s"} <= set(shared)
    for name in shared:
        assert np.array_equal(hom[name], pooled[name]), name


def test_a_pooled_plan_has_the_band_of_its_slowest_stage():
    """The step-time band of a plan on pools is its slowest stage's profile's: the stock error
    (the held-out error of a stock profile, planner.data.bands) with stock profiles (it was 0
    on pools, so pooled plans never tied), and a pool's calibrated error when its stage is the
    slowest."""
    from planner.data.bands import absolute_band

    model = load_model("llama3-8b")
    pooled = parse_cluster_or_pools("32xH100+32xA100")
    job = JobSpec(seq_len=4096, global_batch=512)
    lo = Layout(tp=8, pp=2, dp=4, zero=1, recompute="selective", sp=True, stage_layers=(16, 16))
    cols = estimate_pooled_batch(model, pooled, job, [lo], (0, 1))
    step = cols["step_time_s"][0]
    stock = absolute_band(pooled.pools[0].gpu)
    assert stock == absolute_band(pooled.pools[1].gpu)  # both own-curve stock profiles
    assert cols["step_time_high_s"][0] == pytest.approx(step * (1 + stock))
    assert cols["step_time_low_s"][0] == pytest.approx(step * (1 - stock))
    slow_pool = int(cols["stage_pool"][0, int(np.nanargmax(cols["stage_time_s"][0]))])
    assert pooled.pools[slow_pool].gpu.name == "A100-SXM4-80GB"  # the A100 stage is slower
    for calibrated, rel in ((slow_pool, 0.2), (1 - slow_pool, 0.01)):
        pools = list(pooled.pools)
        gpu = pools[calibrated].gpu.model_copy(update={"step_time_rel_error": rel})
        pools[calibrated] = pools[calibrated].model_copy(update={"gpu": gpu})
        c = estimate_pooled_batch(model, PooledCluster(pools=tuple(pools)), job, [lo], (0, 1))
        want = rel if calibrated == slow_pool else stock
        assert c["step_time_high_s"][0] / c["step_time_s"][0] - 1 == pytest.approx(want)


def test_estimate_batch_takes_pools_in_the_order_the_plan_names():
    """costmodel.estimate_batch is one entry for every cluster: on pools it places the stages
    in the order the layout's stage_gpu names the pools (the A100 pool first here)."""
    model = load_model("llama3-8b")
    pooled = parse_cluster_or_pools("32xH100+32xA100")
    job = JobSpec(seq_len=4096, global_batch=512)
    lo = Layout(tp=8, pp=2, dp=4, zero=1, sp=True, stage_layers=(10, 22),
                stage_gpu=("A100-SXM4-80GB", "H100-SXM"))
    got = estimate_batch(model, pooled, job, [lo])
    want = estimate_pooled_batch(model, pooled, job, [lo], (1, 0))
    assert got["step_time_s"][0] == want["step_time_s"][0]
    assert got["stage_pool"][0, :2].tolist() == [1, 0]
    other = estimate_pooled_batch(model, pooled, job, [lo], (0, 1))
    assert other["step_time_s"][0] != want["step_time_s"][0]


def _pooled_toy(layers: int, mem_a: float, mem_b: float) -> tuple:
    fast = make_gpu(memory_gib=mem_a, gpus_per_node=4, name="FAST").model_copy(
        update={"peak_bf16_tflops": 900.0, "hbm_tb_per_s": 3.3})
    slow = make_gpu(memory_gib=mem_b, gpus_per_node=4, name="SLOW")
    pooled = PooledCluster(pools=(make_cluster(4, fast), make_cluster(8, slow)))
    model = make_model(layers=layers, hidden=512, heads=8, kv=4, ffn=1536, vocab=32000)
    return model, pooled


def _oracle(model, pooled, job, pins, top_k):
    """Every layout of the pooled space, both orders, the DP oracle's split, evaluated and
    sorted: the top_k step times."""
    knobs = pooled_knobs(model, pooled, job, normalize_pins(pins))
    layers, caps = model.num_hidden_layers, [p.gpu.usable_memory_gib for p in pooled.pools]
    steps = []
    for row in range(len(knobs["tp"])):
        pp = int(knobs["pp"][row])
        width = split_width(layers, pp)
        one = {k: v[row:row + 1] for k, v in knobs.items()}
        tables = _tables(model, pooled, job, one, pp, width)
        per = [p.num_gpus // int(knobs["tp"][row] * knobs["cp"][row] * knobs["dp"][row])
               for p in pooled.pools]
        for order in ((0, 1), (1, 0)):
            stage_pool = [j for j in order for _ in range(per[j])]
            split = split_dp(_problem(tables, stage_pool, 0, pp, width, layers, caps))
            if not split.counts:
                continue
            lo = Layout(**{k: (RECOMPUTE_LEVELS[int(v[0])] if k == "recompute" else
                               bool(v[0]) if k == "sp" else int(v[0])) for k, v in one.items()},
                        stage_layers=split.counts)
            cols = estimate_pooled_batch(model, pooled, job, [lo], order)
            if cols["fits"][0]:
                steps.append(float(cols["step_time_s"][0]))
    return sorted(steps)[:top_k]


@pytest.mark.parametrize("layers,mem_a,mem_b,pins", [
    (6, 80.0, 80.0, {}), (9, 8.0, 16.0, {}), (7, 80.0, 4.0, {"zero": 1}),
    (12, 6.0, 6.0, {"tp": 1})])
def test_search_matches_the_exhaustive_oracle(layers, mem_a, mem_b, pins):
    model, pooled = _pooled_toy(layers, mem_a, mem_b)
    job = make_job(seq_len=1024, global_batch=16)
    want = _oracle(model, pooled, job, pins, 5)
    # the same plans; their order is solve's (the tie first, by robustness: bands.order_ties)
    got = sorted(p.estimate.step_time_s for p in search_pooled(model, pooled, job, pins, 5))
    assert got == pytest.approx(want, rel=1e-9)
    assert len(got) == len(want) > 0


def test_split_beats_even_on_unequal_pools():
    """A FAST (900 TFLOP/s) and a SLOW (312) pool: the searched split is faster than the even
    rule's on the same layout and order, and re-estimating the plan gives the same step."""
    from dataclasses import replace

    model, pooled = _pooled_toy(12, 80.0, 80.0)
    job = make_job(seq_len=1024, global_batch=16)
    best = search_pooled(model, pooled, job, {"tp": 2, "dp": 2}, 1)[0]  # 3 stages
    order = (0, 1) if best.layout.stage_gpu[0] == "FAST" else (1, 0)
    again = Estimate.from_batch(estimate_pooled(model, pooled, job, best.layout, order=order)[1], 0)
    assert again.step_time_s == pytest.approx(best.estimate.step_time_s, rel=1e-12)
    even = Estimate.from_batch(estimate_pooled(
        model, pooled, job, replace(best.layout, stage_layers=(4, 4, 4)), order=order)[1], 0)
    assert best.estimate.step_time_s < even.step_time_s
    assert max(best.estimate.stage_time_s) < max(even.stage_time_s)


def test_mixed_layer_kinds_are_refused_on_pools():
    pooled = parse_cluster_or_pools("64xH100+64xA100")
    with pytest.raises(SpecError, match="layers of one kind"):
        search_pooled(load_model("deepseek-v3"), pooled, JobSpec(seq_len=4096, global_batch=64))


def test_cli_solve_and_estimate_on_pools():
    base = [sys.executable, "-m", "planner"]
    args = ["--model", "llama3-8b", "--cluster", "8xH100+16xA100", "--seq-len", "4096",
            "--global-batch", "64"]
    proc = subprocess.run([*base, "solve", *args, "--top", "2", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)
    for p in plans:
        assert len(p["stage_gpu"]) == len(p["stage_layers"]) == p["pp"]
        assert sum(p["stage_layers"]) == 32 and set(p["stage_gpu"]) == {"H100-SXM",
                                                                       "A100-SXM4-80GB"}
        assert len(p["stage_time_s"]) == p["pp"]
    proc = subprocess.run([*base, "estimate", *args, "--tp", "4", "--pp", "6", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    one = json.loads(proc.stdout)
    assert one["stage_gpu"] == ["H100-SXM"] * 2 + ["A100-SXM4-80GB"] * 4
    proc = subprocess.run([*base, "estimate", *args, "--tp", "4", "--pp", "2"],  # dp 3
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "divide every pool" in proc.stderr


def test_readme_pool_examples_run():
    """Every `$ planner ...` example of the README on a cluster of pools runs (exit 0) and prints
    what the README shows: its layout and step time. (solve on the two-pool example printed its
    table, then died with UnboundLocalError: tied_total, exit 1.)"""
    import re
    import shlex
    from pathlib import Path

    from tests.cli.inproc import invoke

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    examples = re.findall(r"^\$ (planner .*-c \S+\+\S+.*)\n((?:  .*\n)*)", text, re.M)
    assert examples, "the README shows no example on a cluster of pools"
    for command, shown in examples:
        result = invoke(*shlex.split(command)[1:])
        assert result.code == 0, (command, result.stderr)
        for line in shown.splitlines():
            layout, step = line.split()[:2]
            assert layout in result.stdout and step in result.stdout, (command, line)


def test_explain_report_and_export_on_pools(tmp_path):
    """Pools get what one GPU kind gets: explain (its one-knob changes placed as the plan is),
    report and figures; export says in one line why a launcher cannot take the plan."""
    from tests.cli.inproc import invoke

    args = ["-m", "llama3-8b", "-c", "32xH100+32xA100", "--seq-len", "4096",
            "--global-batch", "512"]
    result = invoke("explain", *args, "--rank", "1", "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    gpus = set(data["plan"]["stage_gpu"])
    assert gpus == {"H100-SXM", "A100-SXM4-80GB"}
    assert data["changes"] and all("@" in c["layout"] for c in data["changes"])  # placed
    best = min(data["changes"], key=lambda c: c["step_time_s"])
    assert best["step_time_s"] == pytest.approx(
        data["plan"]["step_time_s"] * (1 + best["d_step_rel"]), rel=1e-9)
    html = tmp_path / "r.html"
    result = invoke("report", "--html", str(html), *args, "--top", "3")
    assert result.code == 0, result.stderr
    assert "@1x" in html.read_text()
    result = invoke("export", "--to", "megatron", *args)
    assert result.code == 2 and len(result.error_lines) == 1
    assert "cluster of pools" in result.error_lines[0]


"""Warnings a user wants told about (issue 20 "Answers a user reads"): bf16 and FlashAttention
on a GPU without them (V100, compute capability 7.0), a global batch too small to keep the GPUs
busy, and a step longer than the checkpoint interval the run recommends."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.cli import app
from planner.costmodel.checks import plan_warnings
from planner.economics import RunInputs, training_run
from planner.plan import Plan


def _plan(model: str, cluster: str, job: JobSpec, layout: Layout) -> tuple:
    m, c = load_model(model), parse_cluster(cluster)
    return m, c, Plan(layout, estimate(m, c, job, layout))


def test_v100_has_no_bf16_and_no_flash_attention() -> None:
    layout = Layout(tp=1, pp=1, dp=8, zero=1, recompute="full")
    _, v100, plan = _plan("llama2-7b", "8xV100", JobSpec(seq_len=2048, global_batch=64), layout)
    assert v100.gpu.compute_capability == 7.0
    lines = plan_warnings(v100, JobSpec(seq_len=2048, global_batch=64), plan)
    assert any("no bf16" in w and "--precision fp16" in w for w in lines)
    assert any("FlashAttention" in w and "--attention unfused" in w for w in lines)
    ok = JobSpec(seq_len=2048, global_batch=64, precision="fp16", attention="unfused")
    _, _, plan16 = _plan("llama2-7b", "8xV100", ok, layout)
    assert plan_warnings(v100, ok, plan16) == []
    _, h100, plan_h = _plan("llama2-7b", "8xH100", JobSpec(seq_len=2048, global_batch=64), layout)
    assert plan_warnings(h100, JobSpec(seq_len=2048, global_batch=64), plan_h) == []


def test_a_global_batch_too_small_for_the_cluster_is_said() -> None:
    """Llama 3 70B on 1024 H100 with 16 sequences: pp 8 and one micro-batch per rank leave
    the step mostly bubble; the warning's shares are the estimate's own terms."""
    job = JobSpec(seq_len=4096, global_batch=16)
    layout = Layout(tp=8, pp=8, dp=16, zero=2, recompute="none", sp=True)
    _, cluster, plan = _plan("llama3-70b", "1024xH100", job, layout)
    e = plan.estimate
    idle = (e.time_pp_bubble_s + e.time_tp_comm_s + e.time_cp_comm_s + e.time_ep_comm_s
            + e.time_pp_comm_s + e.time_dp_comm_exposed_s) / e.step_time_s
    assert idle >= 0.5
    # 1F1B with m = 1 micro-batch over 8 stages: bubble (p - 1) / (m + p - 1) = 7/8 of the passes
    assert e.time_pp_bubble_s / e.step_time_s > 0.6
    lines = plan_warnings(cluster, job, plan)
    assert len(lines) == 1 and "too small to feed 1024 GPUs" in lines[0]
    share = e.time_pp_bubble_s / e.step_time_s
    assert f"{share:.0%} of its step in the pipeline bubble" in lines[0]
    busy = JobSpec(seq_len=4096, global_batch=2048)
    _, _, fed = _plan("llama3-70b", "1024xH100", busy, layout)
    assert plan_warnings(cluster, busy, fed) == []


def test_a_step_longer_than_the_checkpoint_interval_is_said() -> None:
    """Young's interval sqrt(2 C M): 405B x 14 B = 5.67 TB written at 10 GB/s (567 s), cluster
    MTBF 50 h / 128 nodes: ~21 min, shorter than a 65,536-sequence step on 1024 GPUs."""
    job = JobSpec(seq_len=8192, global_batch=65536)
    layout = Layout(tp=8, pp=16, dp=8, zero=1, recompute="full", sp=True)
    model, cluster, plan = _plan("llama3-405b", "1024xH100", job, layout)
    inputs = RunInputs(train_tokens=1e12, node_mtbf_hours=50.0)
    run = training_run(plan, model, cluster, inputs)
    write_h = 14 * model.num_params / 10e9 / 3600
    assert run.checkpoint_interval_min == pytest.approx(60 * math.sqrt(2 * write_h * 50.0 / 128))
    assert plan.estimate.step_time_s > run.checkpoint_interval_min * 60
    lines = plan_warnings(cluster, job, replace(plan, run=run))
    assert any("longer than the checkpoint interval" in w for w in lines)
    assert not any("checkpoint" in w for w in plan_warnings(cluster, job, plan))  # no run asked


def test_estimate_prints_the_warnings_on_stderr() -> None:
    res = CliRunner().invoke(app, ["estimate", "-m", "llama2-7b", "-c", "8xV100", "--tp", "1",
                                   "--pp", "1", "--dp", "8", "--json"])
    assert res.exit_code == 0
    assert "warning: V100-SXM2-32GB has no bf16" in res.stderr
    assert "warning" not in res.stdout

"""Real layouts under torchrun on CPU processes with gloo: tp, pp (1F1B), dp with ZeRO-3,
tp x dp; the loss and gradient norm of step 1 match a single-process run computed here, in the
test process; the record carries the contract's fields; failures leave a record and no process.

One torchrun launch per case (a launch costs ~15 s on 2 cores, mostly importing torch)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from dist_reference import train_reference

from planner.layout import Layout
from planner.plan import PLAN_COLUMNS
from planner.registry import load_gpu, load_model
from planner.specs import JobSpec
from planner.validate.config import ScaleDown, scaled_spec
from planner.validate.launch import execute, prepare

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# llama3-8b's architecture (RMSNorm, RoPE, GQA 2:1 here, SwiGLU, untied), shrunk to run in seconds.
SCALE = ScaleDown(layers=4, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=128)
JOB = JobSpec(seq_len=16, global_batch=4)
STEPS, WARMUP = 2, 1
# fp32 on CPU: the parallel layouts only reorder floating-point sums (worker.TOLERANCE_FP32).
REL_TOL = 1e-4

CONTRACT_FIELDS = (
    "predicted_step_time_s", "measured_step_time_s", "measured_step_times_s",
    "measured_peak_mem_gb", "losses", "world_size", "backend", "device", "ok", "error",
)


def _spec():
    return scaled_spec(load_model("llama3-8b"), SCALE)


@pytest.fixture(scope="module")
def reference() -> tuple[list[float], float]:
    """The same model, seed and data trained in this process without torch.distributed (AdamW,
    lr 1e-3 as the worker): the loss of every step and step 1's gradient norm."""
    return train_reference(_spec(), JOB.seq_len, JOB.global_batch, SCALE.vocab, WARMUP + STEPS)


def _validate(tmp_path: Path, layout: Layout, **kw) -> dict:
    out = tmp_path / "runs.jsonl"
    launch = prepare(_spec(), layout, JOB, out=out, steps=STEPS, warmup=WARMUP,
                     profile=load_gpu("H100"), profile_ref="H100", **kw)
    record = execute(launch, timeout_s=kw.get("timeout_s", 300))
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == json.loads(json.dumps(record))
    return record


CASES = {
    "tp2-sp-selective": Layout(tp=2, sp=True, recompute="selective"),
    "pp2-1f1b-full": Layout(pp=2, recompute="full"),
    # uneven stages: one layer with the embedding, three with the LM head (per-stage modules)
    "pp2-uneven-1-3": Layout(pp=2, stage_layers=(1, 3)),
    "dp2-zero3": Layout(dp=2, zero=3),
    "tp2-dp2-zero1": Layout(tp=2, dp=2, zero=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layout_matches_single_process(tmp_path: Path, reference, name: str) -> None:
    layout = CASES[name]
    rec = _validate(tmp_path, layout)
    assert rec["ok"] is True and rec["error"] is None, rec.get("error")
    ref_losses, ref_norm = reference
    ref_loss = ref_losses[0]
    # A random init with std 0.02 gives near-uniform logits: loss ~ ln(vocab) (by hand).
    assert abs(ref_loss - math.log(SCALE.vocab)) < 0.05
    # the worker's own single-process reference is the one computed here
    assert rec["reference_loss"] == pytest.approx(ref_loss, rel=1e-6)
    assert rec["reference_grad_norm"] == pytest.approx(ref_norm, rel=1e-6)
    # the parallel layout's step 1 matches it
    assert rec["losses"][0] == pytest.approx(ref_loss, rel=REL_TOL)
    assert rec["first_step_grad_norm"] == pytest.approx(ref_norm, rel=REL_TOL)
    assert rec["match"] is True
    # later steps too: the sharded optimizer takes the same steps as the single-process one
    assert rec["losses"] == pytest.approx(ref_losses, rel=REL_TOL)
    assert len(set(ref_losses)) == len(ref_losses)  # and the steps do move the loss
    # record: the contract's fields, the plan columns, the measured values
    for key in (*CONTRACT_FIELDS, *PLAN_COLUMNS):
        assert key in rec, key
    assert (rec["tp"], rec["pp"], rec["dp"], rec["zero"]) == (
        layout.tp, layout.pp, layout.dp, layout.zero)
    if layout.stage_layers:
        assert rec["stage_layers"] == list(layout.stage_layers)
    assert rec["grad_accum"] == JOB.global_batch // layout.dp  # mbs 1
    assert rec["world_size"] == layout.num_gpus and rec["backend"] == "gloo"
    assert len(rec["losses"]) == WARMUP + STEPS
    assert len(rec["measured_step_times_s"]) == STEPS
    assert rec["measured_step_time_s"] == statistics.median(rec["measured_step_times_s"])
    assert 0.05 < rec["measured_peak_mem_gb"] < 8  # RSS of one rank: torch alone is ~0.3 GiB
    assert rec["predicted_step_time_s"] > 0 and rec["profile_name"] == "H100-SXM"
    assert rec["torch_version"] and rec["hostname"] and rec["date"]
    assert rec["model_spec"]["hidden_size"] == SCALE.hidden and rec["compute_dtype"] == "fp32"
    assert not (tmp_path / ".planner-validate" / rec["run_id"]).exists()  # cleaned after ok


def test_offload_trains_like_the_single_process_run(tmp_path: Path, reference) -> None:
    """recompute='offload' runs every saved activation through host memory
    (torch.autograd.graph.save_on_cpu): the same losses as one process; predicted on a profile
    with a host link (GB200), where the planner offers offload."""
    out = tmp_path / "runs.jsonl"
    launch = prepare(_spec(), Layout(dp=2, recompute="offload"), JOB, out=out, steps=STEPS,
                     warmup=WARMUP, profile=load_gpu("GB200"), profile_ref="GB200")
    rec = execute(launch, timeout_s=300)
    assert rec["ok"] is True, rec.get("error")
    ref_losses, _ = reference
    assert rec["losses"] == pytest.approx(ref_losses, rel=REL_TOL)
    assert rec["recompute"] == "offload" and rec["predicted_step_time_s"] > 0


def _no_worker_left(run_id: str) -> bool:
    for proc in Path("/proc").iterdir():
        try:
            if run_id in (proc / "cmdline").read_text():
                return False
        except OSError:
            continue
    return True


def test_hang_is_killed_with_a_record_and_no_process_left(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "runs.jsonl"
    out.write_text('{"earlier": "record"}\n')
    monkeypatch.setenv("PLANNER_VALIDATE_FAULT", "hang:1")
    # 10 s: killed while starting or while hanging, the same path
    launch = prepare(_spec(), Layout(dp=2), JOB, out=out, steps=1, warmup=0, profile=None,
                     profile_ref=None, timeout_s=10)
    rec = execute(launch, timeout_s=10)
    _check_failure(out, rec, "timed out after 10 s")


def test_cli_crashed_rank_exits_1_with_the_root_cause(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    out.write_text('{"earlier": "record"}\n')
    res = _planner("validate", "--model", "llama3-8b", "--layers", "4", "--hidden", "32",
                   "--heads", "4", "--kv-heads", "2", "--ffn", "64", "--vocab", "128",
                   "--seq-len", "16", "--global-batch", "4", "--dp", "2", "--steps", "1",
                   "--warmup", "0", "--out", str(out), env={"PLANNER_VALIDATE_FAULT": "raise:1"})
    assert res.returncode == 1
    assert "run failed: rank 1: RuntimeError: injected fault" in res.stderr
    rec = [json.loads(x) for x in out.read_text().splitlines()][-1]
    _check_failure(out, rec, "rank 1: RuntimeError: injected fault")


def _check_failure(out: Path, rec: dict, reason: str) -> None:
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0] == {"earlier": "record"} and lines[1] == rec and len(lines) == 2
    assert rec["ok"] is False and rec["error"].startswith(reason)
    assert "\n" not in rec["error"]
    assert rec["measured_step_time_s"] is None and rec["losses"] == []
    assert rec["predicted_step_time_s"] is None and "no profile" in rec["prediction_error"]
    assert _no_worker_left(rec["run_id"])


def _planner(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_print_only_prints_the_torchrun_command(tmp_path: Path) -> None:
    res = _planner("validate", "--model", "llama3-8b", "--layers", "2", "--hidden", "32",
                   "--heads", "4", "--kv-heads", "2", "--ffn", "64", "--vocab", "128",
                   "--tp", "2", "--pp", "2", "--dp", "2", "--seq-len", "16",
                   "--global-batch", "8", "--nnodes", "2", "--rdzv-endpoint", "node0:29500",
                   "--out", str(tmp_path / "r.jsonl"), "--print-only")
    assert res.returncode == 0, res.stderr
    cmd = res.stdout.strip().splitlines()[-1]
    assert "-m torch.distributed.run --nnodes 2 --nproc-per-node 4" in cmd
    assert "--rdzv-endpoint node0:29500" in cmd and "-m planner.validate.worker" in cmd
    config = Path(cmd.split("--config ")[1])
    data = json.loads(config.read_text())
    assert data["layout"]["tp"] == 2 and data["model"]["hidden_size"] == 32
    assert not (tmp_path / "r.jsonl").exists()  # nothing ran


def test_unsupported_layout_is_one_line_exit_2(tmp_path: Path) -> None:
    res = _planner("validate", "--model", "llama3-8b", "--layers", "2", "--hidden", "48",
                   "--heads", "3", "--kv-heads", "3", "--tp", "2", "--out",
                   str(tmp_path / "r.jsonl"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "tp=2 must divide the heads (3)" in res.stderr


def test_profile_command_writes_a_usable_profile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.yaml"
    res = _planner("profile", "--out", str(out), "--nproc", "2", "--quick")
    assert res.returncode == 0, res.stderr[-2000:]
    prof = load_gpu(str(out))
    assert prof.name == "cpu" and prof.gpus_per_node == 2 and prof.intra_node_fabric == "loopback"
    gemm = prof.provenance["gemm_all_dtypes_flop_per_s"]["float32"]
    # the peak is the best measured fp32 rate, and the curve is the sweep over it
    assert prof.peak_bf16_tflops * 1e12 == pytest.approx(max(r for _x, r in gemm), rel=1e-3)
    assert max(y for _x, y in prof.gemm_efficiency.points) == pytest.approx(1.0, rel=1e-3)
    assert 1e8 < prof.peak_bf16_tflops * 1e12 < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s per CPU rank
    assert prof.intra_node.busbw_gb_per_s.points and prof.intra_node.latency_us > 0
    # the profile holds what the benchmark measured (provenance keeps the raw sweeps)
    assert prof.gemm_efficiency.points == [
        (x, pytest.approx(r / (prof.peak_bf16_tflops * 1e12), rel=2e-3)) for x, r in gemm]
    measured_ar = prof.provenance["collectives_intra_node"]["all_reduce"]
    assert prof.intra_node.busbw_gb_per_s.points == [
        (s, pytest.approx(bw / 1e9, rel=1e-3)) for s, _t, bw in measured_ar]
    assert prof.provenance["quick"] is True and prof.provenance["budget_s"]["point_s"] > 0
    assert "float32" not in prof.provenance["gemm_dtypes_skipped"]
    assert "wrote " in res.stderr and " s: peak " in res.stderr
    res = _planner("estimate", "--model", "gpt3-1.3b", "--cluster", str(out), "--tp", "1",
                   "--pp", "1", "--seq-len", "64", "--global-batch", "4", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["step_time_s"] > 0

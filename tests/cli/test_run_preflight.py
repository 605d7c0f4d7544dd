"""`validate` and `solve --calibrate` refuse, before launching anything, runs this machine cannot
hold or a cluster whose GPU is not this machine (issue 20, "Runs a user made"). What the host
has is fixed here (planner.validate.launch._mem_available_bytes), so the tests do not depend on
the machine that runs them; no torchrun may start."""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc import assert_one_line_exit_2, invoke

from planner.layout import Layout
from planner.registry import load_model
from planner.specs import JobSpec
from planner.validate import launch
from planner.validate.config import ScaleDown, scaled_spec

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--ffn", "64",
        "--vocab", "128", "--seq-len", "16", "--global-batch", "4"]


@pytest.fixture
def host(monkeypatch):
    """A CPU host with 64 GiB available on which launching torchrun fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("torchrun was launched")

    monkeypatch.setattr(launch, "run_torchrun", refuse)
    monkeypatch.setattr(launch, "local_gpu_count", lambda: 0)
    monkeypatch.setattr(launch, "_mem_available_bytes", lambda: 64.0 * GIB)
    return monkeypatch


def test_validate_refuses_eight_full_llama3_8b_ranks_on_a_64_gib_host(host, tmp_path):
    # every rank builds the whole model in fp32 first: 8 x 4 bytes x 8.0e9 parameters = 240 GiB
    params = load_model("llama3-8b").num_params
    assert 8 * 4 * params > 64 * GIB
    out = tmp_path / "runs.jsonl"
    result = invoke("validate", "-m", "llama3-8b", "--dp", "8", "--out", str(out))
    line = assert_one_line_exit_2(result, "host memory", "64.0 GiB available", "8 ranks")
    assert "--layers" in line  # says how to make it fit
    assert not out.exists() and not (tmp_path / ".planner-validate").exists()


def test_the_scaled_down_model_passes_and_a_small_host_refuses_it(host):
    spec = scaled_spec(load_model("llama3-8b"), ScaleDown(layers=2, hidden=32, heads=4,
                                                          kv_heads=2, ffn=64, vocab=128))
    layout = Layout(dp=2)
    job = JobSpec(seq_len=16, global_batch=4)
    launch.check_machine(spec, layout, job, None, 2)  # well under 64 GiB: no error
    host.setattr(launch, "_mem_available_bytes", lambda: 1024.0)
    with pytest.raises(Exception, match="host memory"):
        launch.check_machine(spec, layout, job, None, 2)


def test_run_memory_counts_the_whole_fp32_model_per_rank_and_the_reference():
    spec = load_model("llama2-7b")
    layout = Layout(tp=2, dp=2)
    job = JobSpec(seq_len=1024, global_batch=8)
    with_check = launch.run_memory(spec, layout, job, None, 4, cuda=False, check=True)
    without = launch.run_memory(spec, layout, job, None, 4, cuda=False, check=False)
    assert with_check.host_per_rank >= 4 * spec.num_params  # the model every rank builds
    assert with_check.reference == 8 * spec.num_params  # its copy and the copy's gradients
    assert without.reference == 0 and without.host_per_rank == with_check.host_per_rank
    assert with_check.device_per_rank == 0  # a CPU run holds nothing on a device
    gpu = launch.run_memory(spec, layout, job, None, 4, cuda=True, check=False)
    assert gpu.host_per_rank == 4 * spec.num_params and gpu.device_per_rank > 0


def test_solve_calibrate_on_a_gpu_cluster_asks_for_a_profile_of_this_machine(host, tmp_path):
    runs = tmp_path / "runs.jsonl"
    result = invoke("solve", "-m", "llama3-8b", "-c", "8xH100", "--calibrate", "2", "--runs",
                    str(runs))
    assert_one_line_exit_2(result, "--calibrate", "a CPU", "H100", "--profile")
    assert not runs.exists()


def test_solve_calibrate_refuses_plans_this_host_cannot_hold(host, tmp_path):
    """A CPU profile (this machine's kind), but a full-size model: refused before the first
    run, not after the first rank is OOM-killed."""
    import yaml

    profile = yaml.safe_load((ROOT / "validate/measured/cpu-gloo-2proc.yaml").read_text())
    profile["memory_gib"] = 1000.0  # every plan "fits" the profile; the host is what binds
    path = tmp_path / "big-cpu.yaml"
    path.write_text(yaml.safe_dump(profile))
    runs = tmp_path / "runs.jsonl"
    result = invoke("solve", "-m", "llama3-8b", "-c", f"1x2x{path}", "--calibrate", "2",
                    "--runs", str(runs), "--seq-len", "1024", "--global-batch", "64")
    assert_one_line_exit_2(result, "host memory")
    assert not runs.exists()


def test_validate_print_only_checks_nothing_about_this_host(host, tmp_path):
    result = invoke("validate", "-m", "llama3-8b", "--dp", "8", "--out",
                    str(tmp_path / "r.jsonl"), "--print-only")
    assert result.code == 0, result.stderr


def test_tiny_validate_is_not_refused(host, tmp_path):
    result = invoke("validate", "-m", "llama3-8b", *TINY, "--dp", "2", "--out",
                    str(tmp_path / "r.jsonl"), "--print-only")
    assert result.code == 0, result.stderr

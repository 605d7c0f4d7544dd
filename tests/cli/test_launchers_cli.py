"""`planner export`, `--config` (estimate, solve), `solve --export` and `calibrate --runs LOG`
end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from planner.cli import app

DATA = Path(__file__).resolve().parents[1] / "data" / "launchers"
runner = CliRunner()
BRIDGE_70B = DATA / "megatron_bridge_llama3_70b_64gpu_h100_bf16.yaml"


def _planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, timeout=120)


def test_export_pinned_layout_to_stdout_and_file(tmp_path):
    args = ["export", "--to", "megatron", "--model", "gpt3-175b", "--cluster", "16x8xA100",
            "--tp", "8", "--pp", "16", "--dp", "1", "--cp", "1", "--ep", "1", "--vpp", "1",
            "--mbs", "1", "--zero", "0", "--recompute", "none", "--no-sp", "--precision",
            "fp16", "--global-batch", "1536"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "--tensor-model-parallel-size 8" in result.stdout
    assert "--pipeline-model-parallel-size 16" in result.stdout
    out = tmp_path / "run.sh"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("#!/bin/bash")


def test_export_rank_two_differs_from_rank_one():
    base = ["export", "--to", "nemo", "--model", "llama3-8b", "--cluster", "8xH100"]
    first = yaml.safe_load(runner.invoke(app, base).stdout)
    second = yaml.safe_load(runner.invoke(app, [*base, "--rank", "2"]).stdout)
    assert first != second


def test_estimate_config_matches_the_flags():
    by_config = runner.invoke(app, ["estimate", "--config", str(BRIDGE_70B), "--cluster", "H100",
                                    "--json"])
    assert by_config.exit_code == 0, by_config.output
    by_flags = runner.invoke(app, [
        "estimate", "--model", "llama3-70b", "--cluster", "8x8xH100", "--tp", "4", "--pp", "4",
        "--cp", "2", "--vpp", "5", "--mbs", "1", "--zero", "1", "--recompute", "none", "--sp",
        "--global-batch", "256", "--seq-len", "8192", "--attention", "cudnn", "--grad-dtype",
        "half", "--tp-comm-overlap", "--stack", "Megatron-Bridge", "--json"])
    # the config names its software (NeMo / Megatron-Bridge): the same stack's factors apply
    assert json.loads(by_config.stdout) == json.loads(by_flags.stdout)


def test_config_flags_override_the_config():
    result = runner.invoke(app, ["estimate", "--config", str(BRIDGE_70B), "--cluster", "H100",
                                 "--recompute", "full", "--precision", "fp8", "--json"])
    row = json.loads(result.stdout)
    assert row["recompute"] == "full" and row["tp"] == 4 and row["cp"] == 2


def test_solve_config_ranks_the_current_layout_and_names_the_changes():
    result = runner.invoke(app, ["solve", "--config", str(BRIDGE_70B), "--cluster", "H100",
                                 "--json", "--top", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    config, best = data["config"], data["plans"][0]
    assert config["best_step_time_s"] == best["step_time_s"]
    assert config["rank"] >= 1 and config["fitting_layouts"] >= config["rank"]
    assert config["gap"] == config["step_time_s"] / best["step_time_s"] - 1
    if config["gap"] > 0.01:
        assert config["changes"] and config["target_step_time_s"] <= best["step_time_s"] * 1.01


def test_solve_export_writes_the_winner(tmp_path):
    out = tmp_path / "plan.py"
    result = runner.invoke(app, ["solve", "--model", "llama3-8b", "--cluster", "8xH100",
                                 "--json", "--export", "torchtitan", "--out", str(out)])
    assert result.exit_code == 0, result.output
    winner = json.loads(result.stdout)[0]
    assert f"tensor_parallel_degree={winner['tp']}," in out.read_text()


def test_calibrate_from_training_logs(tmp_path):
    out = tmp_path / "fitted.yaml"
    result = runner.invoke(app, ["calibrate", "--runs", str(DATA / "megatron_llama2_7b.log"),
                                 "--runs", str(DATA / "torchtitan_llama3_8b.log"),
                                 "--profile", "H100", "--out", str(out), "--json", "--no-cv"])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    summary = json.loads(result.stdout)
    assert len(summary["runs"]) == 2


def test_bad_launcher_inputs_exit_2(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    result = _planner("estimate", "--config", str(notes), "--cluster", "H100")
    assert result.returncode == 2 and "not a launcher config" in result.stderr
    assert "Traceback" not in result.stderr
    result = _planner("solve", "--model", "llama3-8b", "--cluster", "8xH100", "--out", "x.sh")
    assert result.returncode == 2 and "--out goes with --export" in result.stderr
    result = _planner("estimate", "--config", str(BRIDGE_70B))
    assert result.returncode == 2 and "--cluster" in result.stderr


def test_out_suffix_picks_the_second_form(tmp_path):
    import tomllib

    base = ["export", "--model", "llama3-8b", "--cluster", "8xH100", "--tp", "2", "--pp", "1",
            "--dp", "4", "--cp", "1", "--ep", "1", "--vpp", "1", "--mbs", "1", "--zero", "3",
            "--recompute", "full", "--sp"]
    toml_out, py_out = tmp_path / "job.toml", tmp_path / "overrides.py"
    assert runner.invoke(app, [*base, "--to", "torchtitan", "--out", str(toml_out)]).exit_code == 0
    job = tomllib.loads(toml_out.read_text())
    assert job["parallelism"]["tensor_parallel_degree"] == 2
    assert job["activation_checkpoint"]["mode"] == "full"
    assert runner.invoke(app, [*base, "--to", "nemo", "--out", str(py_out)]).exit_code == 0
    assert "cfg.model.tensor_model_parallel_size = 2" in py_out.read_text()

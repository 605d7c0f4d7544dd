"""--stage-layers and --even-stages end to end: JSON `stage_layers`, the CSV form, the table
label, pins, and one-line exit-2 errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
SMALL = ["--model", "llama3-8b", "--cluster", "8xA100-40GB", "--seq-len", "4096",
         "--global-batch", "64"]


def test_estimate_takes_the_split_and_reports_it(tmp_path):
    out = tmp_path / "plan.csv"
    result = runner.invoke(app, ["estimate", *SMALL, "--tp", "1", "--zero", "2",
                                 "--stage-layers", "8,9,9,6", "--json", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert row["pp"] == 4 and row["stage_layers"] == [8, 9, 9, 6]  # pp from the split
    even = json.loads(runner.invoke(app, ["estimate", *SMALL, "--tp", "1", "--zero", "2",
                                          "--pp", "4", "--json"]).output)
    assert even["stage_layers"] == [8, 8, 8, 8]  # the even rule, written out
    assert row["step_time_s"] != even["step_time_s"]
    with out.open() as f:
        assert next(csv.DictReader(f))["stage_layers"] == "8,9,9,6"


def test_solve_searches_pins_and_keeps_even(tmp_path):
    base = ["solve", *SMALL, "--tp", "1", "--pp", "4", "--vpp", "1", "--top", "4", "--json"]
    searched = json.loads(runner.invoke(app, base).output)
    even = json.loads(runner.invoke(app, [*base, "--even-stages"]).output)
    assert all(p["stage_layers"] == [8, 8, 8, 8] for p in even)
    # the fastest plan shown (ties are ordered by robustness and memory headroom, so with the
    # measured ranking band it need not be the first) splits unevenly and beats every even one
    fastest = min(searched, key=lambda p: p["step_time_s"])
    assert fastest["stage_layers"] != [8, 8, 8, 8]
    assert fastest["step_time_s"] < min(p["step_time_s"] for p in even)
    pinned = json.loads(runner.invoke(app, ["solve", *SMALL, "--tp", "1", "--top", "2", "--json",
                                            "--stage-layers", "7,9,9,7"]).output)
    assert all(p["stage_layers"] == [7, 9, 9, 7] and p["pp"] == 4 for p in pinned)
    table = runner.invoke(app, [a for a in base if a != "--json"])
    assert "-L" in table.output  # the uneven split in the layout label


def test_compact_form_as_the_tables_print_it():
    from planner.cli.options import parse_stage_layers

    assert parse_stage_layers("7,8x14,7") == (7,) + (8,) * 14 + (7,)
    assert parse_stage_layers(" 8, 9 ,9,6") == (8, 9, 9, 6)
    result = runner.invoke(app, ["estimate", "--model", "llama3-405b", "--cluster", "16384xH100",
                                 "--tp", "8", "--stage-layers", "7,8x14,7", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stage_layers"] == [7] + [8] * 14 + [7]


def test_bad_splits_are_one_line_exit_2():
    for args, why in ((["--stage-layers", "8,8,x"], "positive integers"),
                      (["--stage-layers", "8x0,8"], "positive integers"),
                      (["--stage-layers", "8,8,8,7"], "sums to 31"),
                      (["--stage-layers", "0,16,16"], "at least one layer"),
                      (["--pp", "2", "--stage-layers", "8,8,8,8"], "--pp is 2")):
        proc = subprocess.run([sys.executable, "-m", "planner", "solve", *SMALL, *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert why in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_export_writes_first_and_last_stage_layers():
    """Megatron-LM and Megatron-Bridge write a split by Megatron's own rule (account-for flags,
    first/last stage layers, else the pipeline layout); torchtitan by its weights or module
    lists (tests/launcher_start runs them through the launchers' own code)."""
    from planner.launchers import export_plan
    from planner.launchers.common import LaunchPlan
    from planner.layout import Layout
    from planner.registry import load_model, parse_cluster
    from planner.specs import JobSpec

    model, cluster = load_model("llama3-405b"), parse_cluster("16384xH100")
    job = JobSpec(seq_len=8192, global_batch=2048)

    def plan(counts):
        return LaunchPlan(model, cluster, job, Layout(tp=8, pp=16, dp=128, zero=1, sp=True,
                                                      stage_layers=counts), 10.0)

    # Meta's 7, 8 x 14, 7 is Megatron's own account-for rule: (126 + 2) / 16 = 8 a stage, the
    # embedding and the loss each taking one layer's slot
    meta = export_plan("megatron", plan((7,) + (8,) * 14 + (7,)))
    assert "--account-for-embedding-in-pipeline-split" in meta.text
    assert "--account-for-loss-in-pipeline-split" in meta.text
    bridge = export_plan("nemo", plan((6,) + (8,) * 14 + (8,)))
    assert "num_layers_in_first_pipeline_stage: 6" in bridge.text
    assert "num_layers_in_last_pipeline_stage: 8" in bridge.text
    # any other split is stated stage by stage (Megatron's pipeline layout), not warned about
    odd = export_plan("megatron", plan((7, 9) + (8,) * 13 + (6,)))
    assert "--pipeline-model-parallel-layout 'Et*7|t*9|(t*8|)*13t*6L'" in odd.text
    assert not odd.warnings
    titan = export_plan("torchtitan", plan((6,) + (8,) * 15))
    assert "module_fqns_per_model_part" in titan.text or "stage_less_layers" in titan.text
    assert not any("not written" in w for w in titan.warnings)

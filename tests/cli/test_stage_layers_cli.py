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
    base = ["solve", *SMALL, "--tp", "1", "--pp", "4", "--vpp", "1", "--top", "2", "--json"]
    searched = json.loads(runner.invoke(app, base).output)
    even = json.loads(runner.invoke(app, [*base, "--even-stages"]).output)
    assert all(p["stage_layers"] == [8, 8, 8, 8] for p in even)
    assert searched[0]["stage_layers"] != [8, 8, 8, 8]
    assert searched[0]["step_time_s"] < even[0]["step_time_s"]
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

"""The published-MFU ceiling (planner.published) and the faster_than_published flag."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.measured.runs import PUBLISHED_RUNS_CSV
from planner.published import (
    CEILING_CSV,
    ceiling,
    faster_than_published,
    gpu_class,
)

runner = CliRunner()


def test_table_is_derived_from_the_runs_table():
    """planner/data/published_mfu.csv is what build_table makes of published_runs.csv today (a
    change to the runs table or the FLOP count must regenerate it:
    python -m planner.measured.ceiling)."""
    from planner.measured.ceiling import build_table
    from planner.measured.runs import load_table

    runs, _ = load_table()
    fresh = {(r["gpu_class"], r["stack"], r["precision"]): r for r in build_table(runs)}
    with CEILING_CSV.open(newline="") as fh:
        stored = {(r["gpu_class"], r["stack"], r["precision"]): r for r in csv.DictReader(fh)}
    assert stored.keys() == fresh.keys()
    for key, row in stored.items():
        assert float(row["mfu"]) == pytest.approx(fresh[key]["mfu"], abs=1e-4), key
        assert row["best_run"] == fresh[key]["best_run"], key


@pytest.mark.parametrize("key", [("A100-SXM", "any", "16-bit"),
                                 ("H100/H200-SXM", "nemo", "16-bit")])
def test_ceiling_agrees_with_the_source_reported_mfu(key):
    """Second method: the best run's MFU by the planner's FLOP count is the MFU its source
    printed (llm-foundry: 6N + attention over 312; NVIDIA: over 989) within one point."""
    with CEILING_CSV.open(newline="") as fh:
        row = next(r for r in csv.DictReader(fh)
                   if (r["gpu_class"], r["stack"], r["precision"]) == key)
    runs = pd.read_csv(PUBLISHED_RUNS_CSV)
    source_id, row_id = row["best_run"].rsplit(":", 1)
    reported = runs[(runs.source_id == source_id) & (runs.row_id == int(row_id))]["mfu_pct"].item()
    assert float(row["mfu"]) == pytest.approx(reported / 100, abs=0.01)


def test_ceiling_falls_back_to_any_stack_and_to_none():
    a100 = ceiling("A100-SXM4-40GB", "megatron-core", "bf16")  # no Megatron-Core A100 run
    assert a100 is not None and a100.stack == "any"
    assert a100.mfu == ceiling("A100-SXM4-80GB", "pytorch-fsdp", "bf16").mfu  # llm-foundry's
    bloom = ceiling("A100-SXM4-80GB", "megatron-deepspeed", "bf16")
    assert bloom is not None and bloom.stack == "megatron-deepspeed" and bloom.mfu < a100.mfu
    assert ceiling("MI300X", "megatron-core", "bf16") is None  # no published run of the class
    assert gpu_class("H200-SXM") == gpu_class("H100-SXM")


def test_flag_needs_the_whole_band_above():
    limit = ceiling("A100-SXM4-80GB", "megatron-core", "bf16")
    m = limit.mfu
    # MFU 5% above, band +7%: the slow end (m * 1.05 / 1.07) is below the ceiling
    assert not faster_than_published(1.05 * m, 10.0, 10.7, limit)
    assert faster_than_published(1.10 * m, 10.0, 10.7, limit)
    assert not faster_than_published(2.0, 10.0, 10.7, None)


def _solve_json(*args: str) -> list[dict]:
    res = runner.invoke(app, ["solve", *args, "--json", "--top", "20"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # stderr carries warnings (bf16 on V100)


@pytest.mark.parametrize("model,cluster", [("llama2-70b", "128xA100"), ("llama3-8b", "8xA100"),
                                           ("gpt3-175b", "1024xA100")])
def test_a100_stock_predictions_above_the_measured_range_are_flagged(model, cluster):
    """Issue 19: no stock prediction of a dense model on A100 above the measured A100 range
    (by more than its band) goes without the flag, and none inside it carries the flag."""
    limit = ceiling("A100-SXM4-80GB", "megatron-core", "bf16")
    rows = _solve_json("--model", model, "--cluster", cluster)
    from planner.plan import PLAN_COLUMNS

    # a contract column, followed by device_mem_gb (issue 19 section 4, added after it) and
    # ranking_band (issue 19's two bands, added after that)
    assert PLAN_COLUMNS[-3:] == ("faster_than_published", "device_mem_gb", "ranking_band")
    assert list(rows[0])[: len(PLAN_COLUMNS)] == list(PLAN_COLUMNS)
    for row in rows:
        slow_end = row["mfu"] * row["step_time_s"] / row["step_time_high_s"]
        assert row["faster_than_published"] == (slow_end > limit.mfu), row


def test_v100_flag_reaches_table_and_explain():
    """The V100 profile borrows the A100's GEMM curve; its predictions exceed every DLPerf run
    (best 26.7% MFU), so the flag and its note show in the table, the CSV and explain."""
    rows = _solve_json("--model", "llama3-8b", "--cluster", "32xV100")
    assert rows[0]["faster_than_published"] is True
    table = runner.invoke(app, ["solve", "--model", "llama3-8b", "--cluster", "32xV100",
                                "--top", "3"])
    assert table.exit_code == 0 and "faster than any published run of this class" in table.output
    exp = runner.invoke(app, ["explain", "--model", "llama3-8b", "--cluster", "32xV100",
                              "--rank", "1", "--json"])
    assert exp.exit_code == 0
    out = json.loads(exp.stdout)
    assert out["plan"]["faster_than_published"] is True
    assert any("faster than any published run" in line for line in out["text"])

"""Runs tables and validate records with values outside physics (issue 15, section 4): a row that
cannot be used is skipped with its reason, never a fit input; the table is refused only when no
row is usable; tables in the sources' own words load."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from planner.measured.runs import PUBLISHED_RUNS_CSV, load_records, load_table
from planner.registry import load_gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from inproc import assert_one_line_exit_2, invoke


def published_row(source_id: str, row_id: int) -> dict:
    frame = pd.read_csv(PUBLISHED_RUNS_CSV)
    row = frame[(frame.source_id == source_id) & (frame.row_id == row_id)]
    assert len(row) == 1
    return row.iloc[0].to_dict()


# MPT-7B on 512 H100, every knob stated, 1.27 s per step derived from 9,670 tokens/s/GPU
GOOD = ("llmfoundry_mpt_bench", 231)


def write_table(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def load_with(tmp_path: Path, **change) -> tuple[list, list]:
    good = published_row(*GOOD)
    bad = {**good, **change, "row_id": 2}
    return load_table(write_table(tmp_path / "runs.csv", [good, bad]))


@pytest.mark.parametrize(("change", "fragment"), [
    ({"tp": "inf"}, "tp: inf is not a finite number"),
    ({"dp": "-Infinity"}, "dp: -inf is not a finite number"),
    ({"hidden": "{}"}, "hidden: '{}' is not a number"),
    ({"recompute": "maybe"}, "recompute 'maybe' is not one of"),
    ({"zero_or_fsdp": "ZeRO-7"}, "ZeRO has stages 0-3"),
    ({"vpp": 0}, "vpp 0 must be at least 1"),
    ({"iteration_time_s": -3.0}, "-3 s is not a positive time"),
    ({"iteration_time_s": 1e30}, "a day"),
    ({"num_gpus": 1e30}, "num_gpus 1e+30 is more than 1048576"),
    ({"pp": 2.5}, "pp 2.5 is not a whole number"),
    ({"cp": -8}, "cp -8 must be at least 1"),
    ({"dp": 0}, "dp 0 must be at least 1"),
    ({"tp": 2}, "= 1024 is not the run's 512 GPUs"),
    ({"sp": "perhaps"}, "sp 'perhaps' is not yes/no"),
    # 0.01 s for 3072 x 2048 tokens of a 6.7B model on 512 H100: 6 N D / (t n peak) = 160 x peak
    ({"iteration_time_s": 0.01}, "MFU"),
])
def test_a_row_outside_physics_is_skipped_with_its_reason(tmp_path, change, fragment):
    runs, skipped = load_with(tmp_path, **change)
    assert [r.run_id for r in runs] == [f"{GOOD[0]}:{GOOD[1]}"]  # the good row still loads
    assert len(skipped) == 1 and skipped[0].run_id.endswith(":2")
    assert fragment in skipped[0].reason, skipped[0].reason


def test_mfu_of_the_good_row_is_below_one(tmp_path):
    runs, _ = load_with(tmp_path)
    run = runs[0]
    flops = run.model.train_flops_per_token(2048, causal=True) * 3072 * 2048
    mfu = flops / (run.measured_step_time_s * 512 * 989e12)
    assert 0.3 < mfu < 0.5  # the source states MFU 42.2% (its own FLOP count)


def test_nan_cell_is_an_empty_cell(tmp_path):
    runs, skipped = load_with(tmp_path, vpp="NaN")
    assert len(runs) == 2 and not skipped


@pytest.mark.parametrize(("label", "precision"), [
    ("mixed fp16 (not stated)", "fp16"),
    ("mixed (16-bit, not specified)", "bf16"),
    ("mixed (not stated)", "bf16"),
])
def test_precision_in_the_sources_words(tmp_path, label, precision):
    runs, skipped = load_with(tmp_path, precision=label)
    assert not skipped and runs[1].job.precision == precision


def test_gpt_style_row_without_ffn_hidden_has_4h(tmp_path):
    good = published_row(*GOOD)
    gpt = {**good, "row_id": 2, "model": "GPT-3 6.7B", "ffn_hidden": None}
    runs, skipped = load_table(write_table(tmp_path / "runs.csv", [good, gpt]))
    assert not skipped
    assert runs[1].model.intermediate_size == 4 * 4096
    other = {**good, "row_id": 3, "model": "Llama-like", "ffn_hidden": None}
    _, skipped = load_table(write_table(tmp_path / "runs.csv", [good, other]))
    assert "lacks hidden, layers or ffn_hidden" in skipped[0].reason


# ---- validate records -----------------------------------------------------------------------

RECORD = {"ok": True, "model": "llama2-7b", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4,
          "ffn": 128, "vocab": 128, "tp": 1, "pp": 1, "dp": 2, "cp": 1, "seq_len": 32,
          "global_batch": 4, "nproc_per_node": 2, "measured_step_time_s": 0.05}


@pytest.mark.parametrize(("line", "fragment"), [
    ("42", "a record is a JSON object, got int"),
    ("[1, 2]", "got list"),
    (json.dumps({**RECORD, "world_size": 1e30, "nproc_per_node": None}), "world_size 1e+30"),
    (json.dumps({**RECORD, "recompute": "maybe"}), "recompute 'maybe'"),
    (json.dumps({**RECORD, "zero": 7}), "zero 7 is more than 3"),
    (json.dumps({**RECORD, "tp": True}), "tp: true is not a number"),
    (json.dumps({**RECORD, "vpp": 0}), "vpp 0 must be at least 1"),
    (json.dumps({**RECORD, "sp": "yes please"}), "sp 'yes please'"),
    (json.dumps({**RECORD, "measured_step_time_s": -1.0}), "not a positive time"),
    (json.dumps({**RECORD, "measured_step_time_s": float("inf")}), "not a finite number"),
    (json.dumps({**RECORD, "seq_len": {}}), "seq_len: dict is not a number"),
    (json.dumps({**RECORD, "ok": "yes"}), "run failed"),
])
def test_a_bad_record_is_skipped_with_its_reason(tmp_path, line, fragment):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(RECORD) + "\n" + line + "\n")
    runs, skipped = load_records(path, load_gpu("A100"))
    assert len(runs) == 1 and len(skipped) == 1
    assert fragment in skipped[0].reason, skipped[0].reason


# ---- calibrate: refuse the table only when no row is usable ------------------------------------

def test_calibrate_skips_bad_rows_and_refuses_a_table_with_none_usable(tmp_path):
    frame = pd.read_csv(PUBLISHED_RUNS_CSV)
    good = frame[frame.source_id == GOOD[0]].head(6).to_dict("records")
    bad = [{**good[0], "row_id": 9001, "pp": 2.5}, {**good[0], "row_id": 9002, "dp": 0},
           {**good[0], "row_id": 9003, "iteration_time_s": 1e30}]
    table = write_table(tmp_path / "mixed.csv", good + bad)
    out = tmp_path / "fitted.yaml"
    result = invoke("calibrate", "--runs", table, "--profile", "H100", "--out", out,
                    "--fit", "gemm_scale", "--no-cv", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    reasons = json.dumps(summary)
    for fragment in ("pp 2.5 is not a whole number", "dp 0 must be at least 1", "a day"):
        assert fragment in reasons
    assert out.is_file()
    only_bad = write_table(tmp_path / "bad.csv", bad)
    out.unlink()
    assert_one_line_exit_2(invoke("calibrate", "--runs", only_bad, "--profile", "H100",
                                  "--out", out), "no usable run")
    assert not out.exists()

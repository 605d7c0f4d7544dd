"""`planner solve --calibrate N` end to end: the top N plans run for real under torchrun (gloo,
2 CPU processes), their records are appended, the profile is refitted and the plans re-ranked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.io import read_jsonl
from planner.registry import load_gpu

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.dist]

ROOT = Path(__file__).resolve().parents[2]


def test_solve_calibrate_validates_refits_and_reranks(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text('{"ok": false, "error": "an earlier record, kept"}\n')
    fitted = tmp_path / "fitted.yaml"
    cmd = [
        sys.executable,
        "-m",
        "planner",
        "solve",
        "--model",
        str(ROOT / "examples/tiny-llama.yaml"),
        "--cluster",
        f"1x2x{ROOT / 'validate/measured/cpu-gloo-2proc.yaml'}",
        "--top",
        "3",
        "--calibrate",
        "2",
        "--runs",
        str(runs),
        "--profile-out",
        str(fitted),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    records = read_jsonl(runs)
    assert records[0]["error"] == "an earlier record, kept"  # nothing already written is lost
    assert len(records) == 3 and all(r["ok"] for r in records[1:])
    assert all(r["world_size"] == 2 and r["measured_step_time_s"] > 0 for r in records[1:])
    profile = load_gpu(str(fitted))
    assert profile.provenance["runs"] == ["runs.jsonl:2", "runs.jsonl:3"]
    assert profile.step_time_rel_error is not None
    assert "winner changed" in out.stdout or "winner unchanged" in out.stdout

"""`planner validate` on a mixture-of-experts layout with expert parallelism: Mixtral's
architecture shrunk (8 experts, top 2), ep 2 over dp 2 on 2 gloo processes (one torchrun launch,
~20 s on 2 cores). Every step's loss matches one process training the whole model on the whole
batch in this test (AdamW, lr 1e-3, as the worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dist_reference import train_reference

from planner.layout import Layout
from planner.registry import load_model
from planner.validate.config import ScaleDown, check_supported, scaled_spec

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SCALE = ScaleDown(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=128)
SEQ, BATCH, STEPS, WARMUP = 16, 4, 2, 1
ARGS = ["--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--ffn", "48",
        "--vocab", "128", "--seq-len", str(SEQ), "--global-batch", str(BATCH)]


def _reference() -> tuple[list[float], float]:
    """The whole scaled model in this process: every step's loss, step 1's gradient norm."""
    return train_reference(scaled_spec(load_model("mixtral-8x7b"), SCALE), SEQ, BATCH,
                           SCALE.vocab, WARMUP + STEPS)


def test_moe_spec_keeps_its_experts():
    spec = scaled_spec(load_model("mixtral-8x7b"), SCALE)
    assert spec.is_moe and spec.num_experts == 8 and spec.num_experts_per_tok == 2
    assert spec.expert_ffn == 48
    problems = " | ".join(check_supported(spec, Layout(tp=2, dp=2, ep=4, sp=True), 4, SEQ))
    assert "tp=1 and cp=1" in problems and "ep=4 must divide dp (2)" in problems
    assert check_supported(spec, Layout(dp=2, ep=2), BATCH, SEQ) == []
    dense = scaled_spec(load_model("llama3-8b"), SCALE)
    assert "needs a mixture-of-experts model" in check_supported(dense, Layout(dp=2, ep=2),
                                                                 BATCH, SEQ)[0]


def test_validate_moe_with_ep_matches_one_process(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "planner", "validate", "--model", "mixtral-8x7b", *ARGS,
         "--dp", "2", "--ep", "2", "--steps", str(STEPS), "--warmup", str(WARMUP),
         "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text().splitlines()[-1])
    assert rec["ok"] and rec["world_size"] == 2 and rec["backend"] == "gloo"
    assert rec["layout"].startswith("tp1-pp1-dp2-ep2")
    losses, norm = _reference()
    assert rec["losses"] == pytest.approx(losses, rel=1e-4)  # fp32: only sums reordered
    assert rec["first_step_grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert rec["match"] is True

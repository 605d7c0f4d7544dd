"""The profile's time budget, in-process (torch, no torchrun): a size sweep stops after the
first point past its budget and says what it left out; a CPU dtype far slower than fp32 is
skipped with the measured reason; rank 0's phases reach the progress file; and the profile
built from such numbers carries exactly them."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner import progress as progress_mod  # noqa: E402
from planner.validate import bench  # noqa: E402
from planner.validate.bench import Budget, Phases, gemm_sweep, slow_dtypes  # noqa: E402
from planner.validate.profile import build_profile  # noqa: E402

pytestmark = pytest.mark.dist
CPU = torch.device("cpu")


def test_a_sweep_runs_every_size_within_its_budget() -> None:
    rates, stopped = gemm_sweep(CPU, [torch.float32], [8, 16, 32], Budget(0.0, 60.0, 600.0))
    assert [x for x, _r in rates["float32"]] == [2 * 8**3, 2 * 16**3, 2 * 32**3]
    assert all(r > 0 for _x, r in rates["float32"]) and stopped == []


@pytest.mark.parametrize("budget, why", [
    (Budget(0.0, point_s=0.0, sweep_s=600.0), "the point took"),
    (Budget(0.0, point_s=60.0, sweep_s=0.0), "the sweep took"),
])
def test_a_sweep_stops_after_the_first_point_past_its_budget(budget: Budget, why: str) -> None:
    rates, stopped = gemm_sweep(CPU, [torch.float32, torch.bfloat16], [8, 16, 32], budget)
    assert [x for x, _r in rates["float32"]] == [2 * 8**3]  # measured, then stopped
    assert [x for x, _r in rates["bfloat16"]] == [2 * 8**3]
    assert stopped[0].startswith(f"GEMM float32: stopped after 8^3 ({why}")
    assert stopped[0].endswith("not measured: 16^3, 32^3") and len(stopped) == 2


def test_a_dtype_far_slower_than_fp32_is_skipped_with_the_measured_ratio(monkeypatch) -> None:
    budget = Budget(0.0, 1.0, 10.0)
    monkeypatch.setattr(bench, "SLOW_DTYPE_RATIO", 1e9)  # everything is "far slower"
    skipped = slow_dtypes(CPU, [torch.float32, torch.bfloat16], budget, n=32)
    assert list(skipped) == ["bfloat16"] and "x fp32's" in skipped["bfloat16"]
    monkeypatch.setattr(bench, "SLOW_DTYPE_RATIO", 0.0)  # nothing is
    assert slow_dtypes(CPU, [torch.float32, torch.bfloat16], budget, n=32) == {}
    assert slow_dtypes(CPU, [torch.bfloat16], budget) == {}  # no fp32 to compare with


def test_rank_0_reports_every_unit_to_the_progress_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("PLANNER_PROGRESS_FILE", str(path))
    monkeypatch.setattr(progress_mod, "REPORT_EVERY_S", 0.0)
    phases = Phases(total=3, rank=0)
    gemm_sweep(CPU, [torch.float32], [8, 16, 32], Budget(0.0, 0.0, 600.0), phases)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["done"], x["phase"]) for x in lines] == [
        (0, "GEMM float32 8^3"), (1, "GEMM float32 8^3"), (3, "GEMM float32: budget reached")]
    assert all(x["total"] == 3 for x in lines)
    Phases(total=3, rank=1).tick("rank 1 says nothing")
    assert len(path.read_text().splitlines()) == 3


def test_the_profile_carries_the_skips_and_stops_the_benchmark_made() -> None:
    from test_model_and_profile import _raw  # this folder is on sys.path (no __init__.py)

    raw = dict(_raw(), gemm_skipped={"bfloat16": "skipped: slow"},
               sweeps_stopped=["GEMM float32: stopped after 1024^3 (x); not measured: 2048^3"],
               budget={"min_time_s": 0.2, "point_s": 1.5, "sweep_s": 10.0}, quick=False)
    prof = build_profile(raw, "cpu-test")
    assert prof.provenance["gemm_dtypes_skipped"] == {"bfloat16": "skipped: slow"}
    assert prof.provenance["sweeps_stopped"] == raw["sweeps_stopped"]
    assert prof.provenance["budget_s"]["point_s"] == 1.5
    assert "not measured: 2048^3" in prof.sources["gemm_efficiency"]
    # the curve is the measured rates over the best one, nothing else
    rates = raw["gemm"]["float32"]
    assert prof.gemm_efficiency.points == [(x, r / 8e9) for x, r in rates]

"""How well a profile predicts real runs: run a set of layouts with `planner validate`'s launcher
and print predicted vs measured step time per run and the median error.

    python -m planner.validate.accuracy --profile cpu.yaml --out runs.jsonl

The default set is the CPU set of docs/validate.md: a llama3-8b-shaped model scaled down to
4 layers x 512 hidden, seq 256, global batch 8, every 2-process layout family (dp with ZeRO 0-3,
tp with and without sp, pp with 1F1B, recompute). The records land in --out, so
`planner calibrate --runs` can fit the profile to them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from planner.interrupts import Interrupted
from planner.layout import Layout
from planner.progress import progress
from planner.registry import load_gpu, load_model
from planner.specs import JobSpec

from .config import ScaleDown, scaled_spec
from .launch import execute, prepare

CPU_SCALE = ScaleDown(layers=4, hidden=512, heads=8, kv_heads=4, ffn=1536, vocab=4096)
CPU_JOB = JobSpec(seq_len=256, global_batch=8)
CPU_LAYOUTS = (
    Layout(dp=2, zero=0),
    Layout(dp=2, zero=1),
    Layout(dp=2, zero=2),
    Layout(dp=2, zero=3),
    Layout(dp=2, zero=1, recompute="full"),
    Layout(dp=2, zero=1, mbs=2),
    Layout(pp=2),
    Layout(pp=2, recompute="selective"),
    Layout(tp=2),
    Layout(tp=2, sp=True),
)


def run_set(profile_path: str, out: Path, steps: int, warmup: int, model: str = "llama3-8b",
            layouts: tuple[Layout, ...] = CPU_LAYOUTS) -> list[dict]:
    """Validate every layout with the profile's prediction; returns the records."""
    spec = scaled_spec(load_model(model), CPU_SCALE)
    gpu = load_gpu(profile_path)
    records = []
    with progress(f"validating {len(layouts)} layouts", len(layouts)) as bar:
        for layout in layouts:
            launch = prepare(spec, layout, CPU_JOB, out=out, steps=steps, warmup=warmup,
                             profile=gpu, profile_ref=profile_path, check=False)
            rec = execute(launch, timeout_s=900)
            records.append(rec)
            print(_row(rec), flush=True)
            bar.advance()
    return records


def _row(rec: dict) -> str:
    meas, pred = rec.get("measured_step_time_s"), rec.get("predicted_step_time_s")
    if not rec.get("ok") or not meas or not pred:
        why = rec.get("error") or rec.get("prediction_error")
        return f"{rec['layout']:<28} failed or unpredicted: {why}"
    return (f"{rec['layout']:<28} measured {meas:8.3f} s  predicted {pred:8.3f} s  "
            f"error {(pred - meas) / meas:+7.1%}  peak memory measured (RSS) "
            f"{rec['measured_peak_mem_gb']:.2f} GiB, predicted {rec['peak_mem_gb']:.2f} GiB")


def relative_errors(records: list[dict]) -> list[float]:
    """(predicted - measured) / measured of the ok, predicted runs."""
    return [(r["predicted_step_time_s"] - r["measured_step_time_s"]) / r["measured_step_time_s"]
            for r in records if r.get("ok") and r.get("predicted_step_time_s")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="GPU profile YAML (planner profile)")
    parser.add_argument("--out", required=True, type=Path, help="runs JSON-lines to append to")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    ns = parser.parse_args(argv)
    try:
        errors = relative_errors(run_set(ns.profile, ns.out, ns.steps, ns.warmup))
    except Interrupted as exc:  # the run in flight has its record; say so and stop
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if errors:
        print(f"median |error| {statistics.median(abs(e) for e in errors):.1%} over {len(errors)} "
              f"runs; median signed {statistics.median(errors):+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

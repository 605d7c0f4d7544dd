"""FP8 over BF16 within jobs: the published runs that differ only in precision ("twins": same
source, model, GPU, GPU count, layout knobs, batch, sequence and stack; planner/data/
published_runs.csv), their measured FP8 speedup (BF16 step / FP8 step) against the predicted
one, per GPU. A ratio predicted / measured above 1 means FP8 is predicted too fast relative to
its BF16 twin; free of any level the two share (a source's software, a GPU's GEMM scale).

    python benchmarks/fp8_twins.py                      # committed profiles (dgxc in sample)
    python benchmarks/fp8_twins.py --held-out           # + profiles refitted without dgxc
    python benchmarks/fp8_twins.py --loso-rows R.loso.csv   # from accuracy.py --loso --rows R

The held-out column is accuracy.leave_one_source_out(only=[source])'s stock prediction (a
few minutes); --loso-rows reads the same numbers from a LOSO run's per-run file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import Predictor, leave_one_source_out  # noqa: E402

from planner.errors import run_script  # noqa: E402
from planner.measured.runs import PUBLISHED_RUNS_CSV, MeasuredRun, load_table  # noqa: E402
from planner.registry import load_gpu  # noqa: E402

SOURCE = "dgxc_benchmarking"


def _twin_key(run: MeasuredRun) -> tuple:
    """Everything but the precision: a BF16 run and an FP8 run with one key are twins."""
    job = run.job.model_copy(update={"precision": "bf16"})
    return (run.source_id, run.model.model_dump_json(exclude={"name"}), run.cluster.gpu.name,
            run.cluster.num_nodes, run.cluster.gpus_per_node, job.model_dump_json(),
            tuple(sorted(run.pins.items())), run.stack, run.stage_layers)


def fp8_twins(runs: Sequence[MeasuredRun]) -> list[tuple[MeasuredRun, MeasuredRun]]:
    """(BF16 run, FP8 run) pairs of timed runs with one twin key; where a key holds several of
    one precision (the same job in two tables) each FP8 run is paired with the BF16 run listed
    nearest to it in the table (row order), each run used once."""
    groups: dict[tuple, dict[str, list[MeasuredRun]]] = {}
    for run in runs:
        if run.oom or not run.measured_step_time_s or run.job.precision not in ("bf16", "fp8"):
            continue
        groups.setdefault(_twin_key(run), {}).setdefault(run.job.precision, []).append(run)
    order = {r.run_id: i for i, r in enumerate(runs)}
    pairs = []
    for g in groups.values():
        bf16 = list(g.get("bf16", []))
        for f in g.get("fp8", []):
            if not bf16:
                break
            b = min(bf16, key=lambda r: abs(order[r.run_id] - order[f.run_id]))
            bf16.remove(b)
            pairs.append((b, f))
    return pairs


def speedup_table(pairs: Sequence[tuple[MeasuredRun, MeasuredRun]],
                  predicted: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Per GPU and overall: twins, median measured and predicted FP8 speedup, and the median,
    25th and 75th percentile of predicted / measured, for each column of `predicted` (column
    name -> run_id -> predicted step seconds; a pair missing either run is skipped there)."""
    rows = []
    for col, pred in predicted.items():
        recs = []
        for b, f in pairs:
            if b.run_id in pred and f.run_id in pred and np.isfinite([pred[b.run_id],
                                                                       pred[f.run_id]]).all():
                meas = b.measured_step_time_s / f.measured_step_time_s
                p = pred[b.run_id] / pred[f.run_id]
                recs.append({"gpu": b.cluster.gpu.name, "measured": meas, "predicted": p,
                             "ratio": p / meas})
        frame = pd.DataFrame(recs)
        if frame.empty:
            continue
        for gpu, g in [*frame.groupby("gpu"), ("all", frame)]:
            rows.append({"profiles": col, "gpu": gpu, "twins": len(g),
                         "measured_speedup": g["measured"].median(),
                         "predicted_speedup": g["predicted"].median(),
                         "pred/meas median": g["ratio"].median(),
                         "p25": g["ratio"].quantile(0.25), "p75": g["ratio"].quantile(0.75)})
    return pd.DataFrame(rows)


def committed_predictions(runs: Sequence[MeasuredRun]) -> dict[str, float]:
    """Step seconds of each run on the committed profiles (the search fills open knobs)."""
    predictor = Predictor()
    out = {}
    for run in runs:
        row = predictor.row(run, run.cluster.gpu)
        if row is not None:
            out[run.run_id] = float(row["step_time_s"])
    return out


def loso_predictions(frame: pd.DataFrame, runs: Sequence[MeasuredRun]) -> dict[str, float]:
    """Step seconds from leave_one_source_out's per-run relative errors (column `stock`)."""
    meas = {r.run_id: r.measured_step_time_s for r in runs}
    return {r: meas[r] * (1.0 + e) for r, e in zip(frame["run"], frame["stock"], strict=True)
            if r in meas and meas[r]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=SOURCE)
    parser.add_argument("--held-out", action="store_true",
                        help="also predict with the profiles refitted without the source")
    parser.add_argument("--loso-rows", type=Path,
                        help="the per-run file of accuracy.py --loso --rows (the .loso.csv)")
    ns = parser.parse_args(argv)
    runs, _ = load_table(PUBLISHED_RUNS_CSV, resolve_gpu=load_gpu)
    runs = [r for r in runs if not r.model.is_moe and r.source_id == ns.source]
    pairs = fp8_twins(runs)
    mine = [r for pair in pairs for r in pair]
    predicted = {"committed": committed_predictions(mine)}
    if ns.held_out:
        all_runs, _ = load_table(PUBLISHED_RUNS_CSV, resolve_gpu=load_gpu)
        frame = leave_one_source_out([r for r in all_runs if not r.model.is_moe], Predictor(),
                                     only=[ns.source], log=lambda *a: None)
        predicted["held out"] = loso_predictions(frame, mine)
    if ns.loso_rows:
        predicted[f"LOSO rows {ns.loso_rows.name}"] = loso_predictions(
            pd.read_csv(ns.loso_rows), mine)
    print(f"{len(pairs)} BF16/FP8 twins in {ns.source}")
    print(speedup_table(pairs, predicted).to_string(index=False,
                                                    float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    run_script(main)

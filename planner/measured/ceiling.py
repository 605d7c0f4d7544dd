"""Derive planner/data/published_mfu.csv (the ceiling planner.published reads) from the published
runs: per GPU class, stack and precision kind, the best MFU measured, counted as the planner counts
a plan's MFU.

    python -m planner.measured.ceiling          # rewrite planner/data/published_mfu.csv
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from planner.published import ANY_STACK, CEILING_CSV, CEILING_FIELDS, gpu_class, precision_kind


def measured_mfu(run: Any) -> float | None:
    """MFU of a MeasuredRun as the planner counts a plan's (None for an untimed row)."""
    from planner.costmodel.compute import model_flops_per_step

    if run.oom or not run.measured_step_time_s:
        return None
    job = run.job
    flops = model_flops_per_step(run.model, job.seq_len, job.global_batch)
    peak = run.cluster.gpu.peak_flops(job.precision) * run.cluster.num_gpus
    return flops / (run.measured_step_time_s * peak)


def build_table(runs: list[Any]) -> list[dict[str, Any]]:
    """The ceiling rows of a list of MeasuredRuns: per (class, stack, precision kind) and per
    (class, 'any', precision kind), the best MFU and which run measured it."""
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in runs:
        mfu = measured_mfu(run)
        cls = gpu_class(run.cluster.gpu.name)
        if mfu is None or cls is None or run.model.is_moe:  # dense models: MoE MFU differs
            continue
        kind = precision_kind(run.job.precision)
        for stack in (run.stack, ANY_STACK):
            key = (cls, stack, kind)
            row = best.setdefault(key, {"gpu_class": cls, "stack": stack, "precision": kind,
                                        "mfu": 0.0, "runs": 0})
            row["runs"] += 1
            if mfu > row["mfu"]:
                row.update(mfu=round(mfu, 4), best_run=run.run_id, best_model=run.model.name,
                           best_gpus=run.cluster.num_gpus)
    return [best[k] for k in sorted(best)]


def write_table(path: Path = CEILING_CSV) -> list[dict[str, Any]]:
    """Derive planner/data/published_mfu.csv from planner/data/published_runs.csv."""
    import io

    from planner.io import write_text_atomic
    from planner.measured.runs import load_table

    runs, _ = load_table()
    rows = build_table(runs)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CEILING_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())
    return rows


if __name__ == "__main__":
    for row in write_table():
        print(row)

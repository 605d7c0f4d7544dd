"""The best MFU measured in the published runs, per GPU class, software stack and precision: the
ceiling a prediction is checked against ("faster than any published run of this class").

planner/data/published_mfu.csv holds one row per (class, stack, precision kind): the highest MFU
of the timed rows of planner/data/published_runs.csv, counted the way the planner counts a plan's
MFU (model FLOPs of planner.costmodel.compute.model_flops_per_step, no recomputation, over the
measured step time and the GPUs' dense peak of the run's precision). planner.measured.ceiling
derives it from the runs table (`python -m planner.measured.ceiling`; tests/unit/test_published.py
regenerates it and compares), so `solve` reads a 20-line CSV instead of parsing the 689 runs (2 s).

    from planner.published import ceiling, faster_than_published
    c = ceiling("A100-SXM4-80GB", "megatron-core", "bf16")   # Ceiling(mfu=0.64..., ...) or None
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CEILING_CSV = Path(__file__).resolve().parent / "data" / "published_mfu.csv"
CEILING_FIELDS = ("gpu_class", "stack", "precision", "mfu", "runs", "best_run", "best_model",
                  "best_gpus")

# GPU classes: profiles of one chip (same tensor cores, clocks within a few %), whose MFU (each
# divided by its own peak) is comparable. Memory size and packaging differ inside a class
# (A100 40/80 GB; H200's faster HBM: the same 989 TFLOP/s dense BF16, docs/hardware.md 1), so a
# class's best run bounds what the chip's tensor cores reached in any of its packagings (the
# pairs of benchmarks/accuracy.py's SIBLINGS, where a fit of one part serves the other, lie in
# one class each). A stack factor kept per GPU class (StackPreset.gpu_factors) uses these names.
GPU_CLASSES: dict[str, tuple[str, ...]] = {
    "A100-SXM": ("A100-SXM4-80GB", "A100-SXM4-40GB"),
    "H100/H200-SXM": ("H100-SXM", "H100-SXM-96GB", "H200-SXM", "H800-SXM"),
    "B200/GB200": ("GB200-NVL72", "B200-SXM"),
    "GB300": ("GB300-NVL72",),
    "V100-SXM2": ("V100-SXM2-16GB", "V100-SXM2-32GB"),
}
ANY_STACK = "any"


def gpu_class(gpu_name: str) -> str | None:
    """The class of a GPU profile name (GPU_CLASSES), None for a GPU outside them."""
    for cls, names in GPU_CLASSES.items():
        if gpu_name in names:
            return cls
    return None


def precision_kind(precision: str) -> str:
    """'fp8' or '16-bit': MFU is divided by the peak of the run's precision, so the two differ."""
    return "fp8" if str(precision).lower().startswith("fp8") else "16-bit"


@dataclass(frozen=True)
class Ceiling:
    """The best measured MFU (fraction) of a class; `stack` is the stack it was measured with,
    or 'any' when the class has no run of the asked stack (then the best of every stack)."""

    gpu_class: str
    stack: str
    precision: str
    mfu: float
    runs: int
    best_run: str
    best_model: str
    best_gpus: int

    def describe(self) -> str:
        """One line: the best run and what it was measured with."""
        who = "any stack" if self.stack == ANY_STACK else f"stack {self.stack}"
        return (f"best published {self.gpu_class} MFU ({who}, {self.precision}): {self.mfu:.1%} "
                f"({self.best_model} on {self.best_gpus} GPUs, {self.best_run}; {self.runs} runs)")


@cache
def _table() -> dict[tuple[str, str, str], Ceiling]:
    with CEILING_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {(r["gpu_class"], r["stack"], r["precision"]): Ceiling(
        gpu_class=r["gpu_class"], stack=r["stack"], precision=r["precision"],
        mfu=float(r["mfu"]), runs=int(r["runs"]), best_run=r["best_run"],
        best_model=r["best_model"], best_gpus=int(r["best_gpus"])) for r in rows}


def ceiling(gpu_name: str, stack: str, precision: str) -> Ceiling | None:
    """The best published MFU of the GPU's class with this stack, else with any stack (the
    class's best run of any software bounds what a stack without runs there has shown); None
    when no published run used the class at this precision."""
    cls = gpu_class(gpu_name)
    if cls is None:
        return None
    table = _table()
    kind = precision_kind(precision)
    return table.get((cls, stack, kind)) or table.get((cls, ANY_STACK, kind))


def faster_than_published(mfu: float, step_time_s: float, step_time_high_s: float,
                          limit: Ceiling | None) -> bool:
    """Whether a plan's MFU is above the published ceiling by more than its band: the MFU at the
    slow end of its 1-sigma step-time band (mfu * step / high) still exceeds the best measured."""
    if limit is None or not step_time_s or not step_time_high_s:
        return False
    return mfu * step_time_s / max(step_time_high_s, step_time_s) > limit.mfu


def mark_plans(plans: list[Any], gpu_name: str, stack: str, precision: str,
               ) -> tuple[list[Any], Ceiling | None]:
    """The plans with faster_than_published set (planner.plan.Plan), and the ceiling used."""
    from dataclasses import replace

    limit = ceiling(gpu_name, stack, precision)
    out = []
    for plan in plans:
        e = plan.estimate
        flag = faster_than_published(float(e.mfu), float(e.step_time_s),
                                     float(getattr(e, "step_time_high_s", e.step_time_s)), limit)
        out.append(replace(plan, faster_than_published=flag) if flag else plan)
    return out, limit


def mark_cluster_plans(plans: list[Any], cluster: Any, stack: str, precision: str,
                       ) -> tuple[list[Any], Ceiling | None]:
    """mark_plans on the cluster's GPU class; a cluster of pools of several GPU classes has no
    one class's ceiling: its plans are returned unmarked (ceiling None)."""
    names = {p.gpu.name for p in getattr(cluster, "pools", None) or (cluster,)}
    if len(names) != 1:
        return plans, None
    return mark_plans(plans, names.pop(), stack, precision)


def note(plans: list[Any], limit: Ceiling | None) -> str | None:
    """The line the table and explain print when plans are flagged, else None."""
    flagged = [str(p.rank or "-") for p in plans if p.faster_than_published]
    if not flagged or limit is None:
        return None
    return (f"plans {', '.join(flagged)}: faster than any published run of this class "
            f"(MFU at the slow end of the band above the {limit.describe()}); "
            "treat the prediction as optimistic (docs/accuracy.md)")


"""Memory as users read it (issue 19 section 4): the caching allocator's reserve fitted on one
source, device memory (what nvidia-smi shows) checked on others.

    python benchmarks/memory.py [--sweep PATH] [--rows]   # --rows: every checked run's terms

1. Fit: the nanotron sweep logs torch.cuda.max_memory_reserved() ("Mem Res (GB)" in `notes`).
   The reserve per GiB of predicted activations, (reserved - predicted peak) / predicted
   activations, median over the sweep and leaving each model out: memory.RESERVE_PER_ACTIVATION_GIB.
2. Check: the published runs whose `peak_mem_gb` is an nvidia-smi reading (bloom_prequel,
   dlperf_megatron_v100; none of them is used by the fit): device_mem_gb against it, and the
   runs that ran but would be refused (peak beyond the memory band of the capacity).
3. Runs that ran (issue 19 "no run that ran refused"): every dense published run that ran with
   its parallel degrees stated (tp, pp, dp, cp, vpp, mbs), at the recompute it states (none
   where unstated), flagged when the estimate calls it "may not fit" or "does not fit", or
   needs a heavier recompute than that to fit (fit_check; --fit-rows lists them).
Numbers are reported in docs/accuracy.md "Device memory" and "Runs that ran".
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from planner.costmodel import estimate_batch, layout_violations
from planner.costmodel.memory import (
    CUDA_CONTEXT_GIB,
    MEM_REL_ERROR,
    RESERVE_PER_ACTIVATION_GIB,
    nccl_communicator_gib,
    near_capacity,
)
from planner.errors import PlannerError
from planner.layout import Layout
from planner.measured.runs import PUBLISHED_RUNS_CSV, load_table
from planner.stacks import resolve_stack

SWEEPS = [PUBLISHED_RUNS_CSV.parent / "sweeps" / "nanotron_sweep_dev.csv"]  # the project's copy
DEVICE_SOURCES = ("bloom_prequel", "dlperf_megatron_v100")  # peak_mem_gb read by nvidia-smi
TERMS = ("mem_weights_gb", "mem_grads_gb", "mem_optimizer_gb", "mem_other_gb")  # breakdown
RESERVED = re.compile(r"'Mem Res \(GB\)'=(\d+(?:\.\d+)?)")


def _predicted(path: Path, keep: pd.DataFrame) -> pd.DataFrame:
    """Per run of the table at `path`: predicted peak, activations, device memory, capacity."""
    runs, _ = load_table(path)
    rows = []
    for run in runs:
        layout = run.layout
        if layout is None or layout_violations(run.model, run.cluster, run.job, layout):
            continue
        c = estimate_batch(run.model, run.cluster, run.job, [layout])
        rows.append({"run": run.run_id, "source": run.source_id, "oom": run.oom,
                     "gpu": run.cluster.gpu.name, "stack": run.stack, "layout": str(layout),
                     "context_nccl_gb": CUDA_CONTEXT_GIB + float(nccl_communicator_gib(
                         layout.tp, layout.pp, layout.dp, layout.cp, layout.ep)),
                     **{k: float(c[k][0]) for k in ("peak_mem_gb", "mem_activations_gb",
                                                     "device_mem_gb", "mem_capacity_gb",
                                                     *TERMS)}})
    frame = pd.DataFrame(rows)
    return frame.merge(keep, on="run")


def sweep_frame(path: Path) -> pd.DataFrame:
    """The sweep's runs with their logged reserved GiB (framework blanked when the stack is not
    a preset here: memory does not depend on it)."""
    table = pd.read_csv(path)
    try:
        resolve_stack(str(table["framework"].iloc[0]))
    except (PlannerError, KeyError, ValueError):
        table["framework"] = None
    table["reserved_gib"] = table["notes"].str.extract(RESERVED)[0].astype(float)
    tmp = Path(sys.argv[0]).resolve().parent / ".memory_sweep.csv"
    table.to_csv(tmp, index=False)
    try:
        keep = pd.DataFrame({"run": table["source_id"] + ":" + table["row_id"].astype(str),
                             "reserved_gib": table["reserved_gib"], "model": table["model"]})
        return _predicted(tmp, keep)
    finally:
        tmp.unlink()


def fit_reserve(frame: pd.DataFrame) -> dict[str, float]:
    """The reserve per GiB of activations: median over all runs, and leaving each model out."""
    k = (frame["reserved_gib"] - frame["peak_mem_gb"]) / frame["mem_activations_gb"]
    out = {"all": float(k.median())}
    for model in sorted(frame["model"].unique()):
        out[f"without {model}"] = float(k[frame["model"] != model].median())
    return out


def device_rows(path: Path = PUBLISHED_RUNS_CSV) -> pd.DataFrame:
    """Every checked run (nvidia-smi reading, ran): measured and predicted device GiB, its error,
    and the terms of the estimate (GiB): weights, grads, optimizer, activations, other (buffers
    and the old software's extra CUDA context), the allocator's reserve, the lazy CUDA context and
    NCCL communicators (device_mem_gb is their sum, capped at the HBM)."""
    frame = _checked(path)
    frame["reserve_gb"] = RESERVE_PER_ACTIVATION_GIB * frame["mem_activations_gb"]
    cols = ["source", "gpu", "stack", "run", "layout", "measured_gib", "device_mem_gb", "err",
            "peak_mem_gb", *TERMS[:3], "mem_activations_gb", TERMS[3], "reserve_gb",
            "context_nccl_gb"]
    return frame.sort_values(["source", "gpu", "stack", "run"])[cols]


def _checked(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    keep = pd.DataFrame({"run": table["source_id"] + ":" + table["row_id"].astype(str),
                         "measured_gib": table["peak_mem_gb"]})
    frame = _predicted(path, keep)
    frame = frame[frame["source"].isin(DEVICE_SOURCES) & ~frame["oom"]
                  & frame["measured_gib"].notna()]
    frame["err"] = frame["device_mem_gb"] / frame["measured_gib"] - 1
    frame["old_err"] = frame["peak_mem_gb"] / frame["measured_gib"] - 1
    frame["refused"] = frame["peak_mem_gb"] * (1 - MEM_REL_ERROR) > frame["mem_capacity_gb"]
    return frame


def device_check(path: Path = PUBLISHED_RUNS_CSV) -> pd.DataFrame:
    """device_mem_gb against the nvidia-smi readings, per source: median |error|, signed, p90;
    and runs that ran but are refused (beyond the memory band)."""
    frame = _checked(path)
    out = []
    for name, g in [*frame.groupby("source"), ("ALL", frame)]:
        out.append({"source": name, "runs": len(g),
                    "device_median": g["err"].abs().median(), "device_signed": g["err"].median(),
                    "device_p90": g["err"].abs().quantile(0.9),
                    "allocated_signed": g["old_err"].median(),
                    "ran_but_refused": int(g["refused"].sum())})
    return pd.DataFrame(out)


STATED = ("tp", "pp", "dp", "cp", "vpp", "mbs")  # the degrees a run must state to be checked
LEVELS = ("none", "selective", "full")  # recompute, lightest first


def _completions(pins: dict) -> list[dict]:
    """The knobs a run leaves open, completed: zero 0 or 1 (Megatron DDP or its distributed
    optimizer; ZeRO-2/3 and FSDP rows state their stage), sp off or on where tp > 1. The check
    keeps the completion with the smallest peak (the recipe gets the benefit of the doubt)."""
    zeros = [pins["zero"]] if "zero" in pins else ([0, 1] if pins["dp"] * pins["cp"] > 1
                                                    else [0])
    sps = [pins["sp"]] if "sp" in pins else ([False, True] if pins["tp"] > 1 else [False])
    return [{"zero": z, "sp": s} for z in zeros for s in sps]


def fit_check(path: Path = PUBLISHED_RUNS_CSV) -> tuple[pd.DataFrame, int]:
    """Every dense run that ran with its degrees stated (STATED): the smallest predicted peak
    (GiB) at the recompute it states (none where unstated) over the completions of its open
    knobs, its status against the usable capacity (fits; tight: "may not fit" below the line;
    over: "may not fit" above it, which the search leaves out; refused: "does not fit", beyond
    the memory band) and the lightest recompute that fits (peak <= capacity). flagged: status
    not "fits" or a heavier recompute needed; contradicted: what the row states cannot fit
    (over or refused at a stated recompute; no recompute fits where unstated). Returns the
    frame and the runs left unchecked (a degree unstated)."""
    runs, _ = load_table(path)
    rows, unchecked = [], 0
    for run in runs:
        if run.oom or run.model.is_moe:
            continue
        pins = dict(run.pins)
        if pins.get("pp", 1) == 1:
            pins.setdefault("vpp", 1)
        if any(k not in pins for k in STATED):
            unchecked += 1
            continue
        stated = pins.get("recompute")
        levels = list(LEVELS) + ([stated] if stated and stated not in LEVELS else [])
        layouts = [Layout(**{k: pins[k] for k in STATED}, ep=pins.get("ep", 1), recompute=r,
                          stage_layers=run.stage_layers, **c)
                   for r in levels for c in _completions(pins)]
        layouts = [lo for lo in layouts
                   if not layout_violations(run.model, run.cluster, run.job, lo)]
        if not layouts:
            unchecked += 1
            continue
        c = estimate_batch(run.model, run.cluster, run.job, layouts)
        peaks = pd.Series(c["peak_mem_gb"], index=[lo.recompute for lo in layouts])
        best = peaks.groupby(level=0).min()
        cap = float(c["mem_capacity_gb"][0])
        recipe = stated or "none"
        if recipe not in best.index:
            unchecked += 1
            continue
        peak = float(best[recipe])
        status = ("refused" if peak * (1 - MEM_REL_ERROR) > cap else "over" if peak > cap
                  else "tight" if near_capacity(peak, cap) else "fits")
        fitting = [r for r in levels if r in best.index and best[r] <= cap]
        needed = fitting[0] if fitting else "(none fits)"
        heavier = needed != recipe and (needed not in levels
                                        or levels.index(needed) > levels.index(recipe))
        i = layouts.index(min((lo for lo in layouts if lo.recompute == recipe),
                              key=lambda lo: peaks.iloc[layouts.index(lo)]))
        rows.append({"run": run.run_id, "source": run.source_id, "stack": run.stack,
                     "gpu": run.cluster.gpu.name, "layout": str(layouts[i]),
                     "recompute": stated or "(unstated)", "grads": run.job.grad_dtype,
                     "peak_gb": peak, "capacity_gb": cap, "status": status, "needs": needed,
                     "heavier": heavier, "flagged": status != "fits" or heavier,
                     # the search would not offer the run's layout at any recompute its row
                     # allows (the stated one; any where unstated): the run that ran, refused
                     "contradicted": bool(fitting == [] or (stated and status in
                                                             ("over", "refused"))),
                     **{k: float(c[k][i]) for k in TERMS[:3]},
                     "activations_gb": float(c["mem_activations_gb"][i]),
                     "in_flight": float(c["in_flight"][i])})
    return pd.DataFrame(rows), unchecked


def fit_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per source and overall: runs checked (and how many leave recompute unstated), and how
    many fit, are tight, over, refused, need a heavier recompute than stated (none where
    unstated), are flagged (any of these), and are contradicted (fit_check: the run that ran
    refused at what its row states). Where recompute is unstated, "needs" is what the
    estimate requires, not a contradiction unless the recipe is known to run without it."""
    out = []
    for name, g in [*frame.groupby("source"), ("ALL", frame)]:
        out.append({"source": name, "ran": len(g),
                    "recompute_unstated": int((g["recompute"] == "(unstated)").sum()),
                    **{s: int((g["status"] == s).sum()) for s in ("fits", "tight", "over",
                                                                   "refused")},
                    "heavier_recompute": int(g["heavier"].sum()),
                    "flagged": int(g["flagged"].sum()),
                    "contradicted": int(g["contradicted"].sum())})
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=next((p for p in SWEEPS if p.exists()),
                                                           None))
    parser.add_argument("--rows", action="store_true",
                        help="also print every checked run's terms, by source, GPU and stack")
    parser.add_argument("--fit-rows", action="store_true",
                        help="also print every flagged run of the runs-that-ran check")
    ns = parser.parse_args()
    if ns.sweep is not None:
        fit = fit_reserve(sweep_frame(ns.sweep))
        print(f"reserve per GiB of activations (nanotron sweep): {fit['all']:.3f} "
              f"(memory.RESERVE_PER_ACTIVATION_GIB = {RESERVE_PER_ACTIVATION_GIB})")
        for k, v in fit.items():
            if k != "all":
                print(f"  {k}: {v:.3f}")
    pd.set_option("display.width", 200)
    if ns.rows:
        print(device_rows().to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(device_check().to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    frame, unchecked = fit_check()
    print(f"\nruns that ran, degrees stated ({len(frame)} dense runs; {unchecked} unchecked: a "
          f"degree unstated): flagged {int(frame['flagged'].sum())}, refused at what the row "
          f"states {int(frame['contradicted'].sum())}")
    print(fit_summary(frame).to_string(index=False))
    flagged = frame[frame["flagged"]]
    if ns.fit_rows and len(flagged):
        cols = ["run", "stack", "gpu", "layout", "recompute", "grads", "peak_gb", "capacity_gb",
                "status", "needs", *TERMS[:3], "activations_gb", "in_flight"]
        print(flagged[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()

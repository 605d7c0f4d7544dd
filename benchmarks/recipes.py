"""The published recipes are the practitioners' answer: where does the planner rank them?

    python benchmarks/recipes.py                          # NVIDIA DGX Cloud + Megatron-Bridge
    python benchmarks/recipes.py --sources llmfoundry_mpt_bench --max-jobs 40
    python benchmarks/recipes.py --rows recipes.csv       # one row per recipe

For every tuned recipe of planner/data/published_runs.csv (NVIDIA's DGX Cloud benchmarks,
Megatron-Bridge's performance tables, llm-foundry's MPT table: each a layout its authors chose
for one job, and its measured step time), solve the same job (model, GPUs, sequence, global
batch, precision) with the recipe's software stack (its recipe and efficiency factors, its fixed
layout knobs) as `planner solve --stack` would, and report:

- rank: the recipe's layout among the layouts that fit (1 + those predicted strictly faster; the
  recipe's open knobs, e.g. micro-batch or recompute where the table does not say, completed by
  the search as benchmarks/accuracy.py does);
- tied: the recipe's 1-sigma ranking band (the error between layouts of one job,
  planner.data.bands) overlaps the first plan's, as `solve` ties plans;
- claimed: how much faster the planner says its first plan is (recipe / first - 1), and the same
  in bands (the gap over the first plan's ranking-band half-width): more than 3 half-widths =
  more than "one band behind" (a whole band between the two bands);
- d_<term>: where the claimed gain comes from, each time term of the recipe less the first
  plan's, as a share of the recipe's step; main_term the largest;
- coverage: whether the recipe's measured step time lies inside its predicted step-time band
  (the absolute band's honesty: a 1-sigma band should hold 60-80% of the truths).

Duplicates (the same job and stated knobs measured on several container versions) count once;
the measured time is their median. Targets (issue 19): tied in >= 90% of jobs, never more than one
band behind, coverage 60-80%.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from planner.errors import InfeasibleError, PlannerError, run_script
from planner.measured.runs import PUBLISHED_RUNS_CSV, MeasuredRun, load_table
from planner.plan import TIME_COLUMNS
from planner.search.bands import estimate_columns, overlaps_best, ranking_bounds

RECIPE_SOURCES = ("dgxc_benchmarking", "megatron_bridge_perf_archive", "llmfoundry_mpt_bench")


def recipe_groups(runs: list[MeasuredRun], sources: tuple[str, ...],
                  ) -> list[tuple[MeasuredRun, float, int]]:
    """One (run, median measured step time, how many rows) per distinct job and stated knobs."""
    groups: dict[tuple, list[MeasuredRun]] = {}
    for run in runs:
        if run.source_id not in sources or run.oom or not run.measured_step_time_s \
                or run.model.is_moe:  # dense recipes (the MoE rows: accuracy.py --moe)
            continue
        key = (run.source_id, run.model.model_dump_json(), run.cluster.num_gpus,
               run.cluster.gpus_per_node, run.cluster.gpu.name, run.job.model_dump_json(),
               run.stack, tuple(sorted(run.pins.items())))
        groups.setdefault(key, []).append(run)
    return [(g[0], float(np.median([r.measured_step_time_s for r in g])), len(g))
            for g in groups.values()]


def rank_recipe(run: MeasuredRun, measured_s: float) -> dict[str, Any]:
    """Solve the run's job with its stack and place the recipe among the plans."""
    from planner.search import search, solve
    from planner.stacks import resolve_stack

    preset = resolve_stack(run.stack)
    cluster = run.cluster.model_copy(update={"gpu": preset.profile_for(run.cluster.gpu,
                                                                       run.job.precision)})
    base = {"source": run.source_id, "run": run.run_id, "model": run.model.name,
            "gpu": run.cluster.gpu.name, "gpus": run.cluster.num_gpus, "stack": run.stack,
            "precision": run.job.precision, "measured_s": measured_s}
    try:
        result = search(run.model, cluster, run.job, dict(preset.layout_defaults), top_k=1)
        mine = solve(run.model, cluster, run.job, {**preset.layout_defaults, **run.pins},
                     top_k=1, even_stages=True)
    except (InfeasibleError, PlannerError) as exc:
        return {**base, "status": f"not solved: {str(exc).splitlines()[0][:80]}"}
    if not mine:
        return {**base, "status": "the recipe's layout does not fit"}
    first = result.plans()[0].estimate
    rec = mine[0].estimate
    cols = result.space.columns
    fits = np.asarray(cols["fits"], dtype=bool)
    times = np.asarray(cols["step_time_s"], dtype=float)
    # ties compare layouts of one job: the ranking band (planner.search.bands.ranking_bounds)
    low, high = ranking_bounds(estimate_columns([first, rec]))
    half = float(first.ranking_band)
    gap = rec.step_time_s / first.step_time_s - 1
    # where the claimed gain comes from: each time term, recipe less first plan, as a share of
    # the recipe's step (they add up to the claimed gain x first / recipe)
    terms = {f"d_{c[5:-2]}": (getattr(rec, c) - getattr(first, c)) / rec.step_time_s
             for c in TIME_COLUMNS}
    return {
        **base, "status": "ok", "recipe": str(mine[0].layout),
        "first": str(result.plans()[0].layout),
        "rank": int((fits & (times < rec.step_time_s)).sum()) + 1, "fitting": int(fits.sum()),
        "tied": bool(overlaps_best(low, high, 0)[1]),
        "claimed": gap, "bands_behind": gap / half if half > 0 else np.inf,
        "predicted_s": rec.step_time_s, "band": half,
        "step_band": (rec.step_time_high_s - rec.step_time_low_s) / 2 / rec.step_time_s,
        # the absolute band's honesty: the recipe's measured time inside its step-time band
        "covered": bool(rec.step_time_low_s <= measured_s <= rec.step_time_high_s),
        "error": rec.step_time_s / measured_s - 1, "recipe_mfu": rec.mfu, "first_mfu": first.mfu,
        **terms,
        "main_term": max(terms, key=lambda k: terms[k]) if gap > 0 else "",
    }


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per source and overall: jobs, tied share, worst and median claimed gain, beyond one band,
    band coverage, median rank."""
    ok = frame[frame["status"] == "ok"]
    rows = []
    for key, g in [*ok.groupby("source"), ("ALL", ok)]:
        rows.append({
            "source": key, "jobs": len(g), "tied": f"{g['tied'].mean():.1%}",
            "rank_median": float(g["rank"].median()), "rank_max": int(g["rank"].max()),
            "claimed_median": f"{g['claimed'].median():+.1%}",
            "claimed_max": f"{g['claimed'].max():+.1%}",
            "beyond_one_band": int((g["bands_behind"] > 3).sum()),
            "rank_band": f"{g['band'].median():.1%}",
            "step_band": f"{g['step_band'].median():.1%}",
            "coverage": f"{g['covered'].mean():.1%}",
            "error_median": f"{g['error'].abs().median():.1%}",
            "signed": f"{g['error'].median():+.1%}",
        })
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=PUBLISHED_RUNS_CSV)
    parser.add_argument("--sources", default="dgxc_benchmarking,megatron_bridge_perf_archive",
                        help="comma-separated source_ids (all three: "
                        + ",".join(RECIPE_SOURCES) + ")")
    parser.add_argument("--max-jobs", type=int, default=0,
                        help="at most this many jobs per source (every k-th; 0 = all)")
    parser.add_argument("--rows", type=Path, help="write one row per recipe as CSV")
    ns = parser.parse_args(argv)
    t0 = time.perf_counter()
    sources = tuple(s.strip() for s in ns.sources.split(",") if s.strip())
    runs, _ = load_table(ns.csv)
    groups = recipe_groups(runs, sources)
    if ns.max_jobs:
        picked = []
        for src in sources:
            mine = [g for g in groups if g[0].source_id == src]
            step = max(1, len(mine) // ns.max_jobs)
            picked += mine[::step][: ns.max_jobs]
        groups = picked
    print(f"{len(groups)} recipes from {', '.join(sources)}", flush=True)
    out = []
    for i, (run, measured, n) in enumerate(groups, 1):
        row = rank_recipe(run, measured)
        row["rows"] = n
        out.append(row)
        if row["status"] == "ok":
            print(f"[{i}/{len(groups)}] {run.run_id} {run.model.name} {run.cluster.num_gpus}x"
                  f"{run.cluster.gpu.name} {run.job.precision}: recipe {row['recipe']} rank "
                  f"{row['rank']}/{row['fitting']}, {'tied' if row['tied'] else 'NOT tied'}, "
                  f"first {row['first']} claimed {row['claimed']:+.1%} "
                  f"({row['bands_behind']:.1f} half-bands), error {row['error']:+.1%}",
                  flush=True)
        else:
            print(f"[{i}/{len(groups)}] {run.run_id}: {row['status']}", flush=True)
    frame = pd.DataFrame(out)
    print("\n== recipes (tied = band overlaps the first plan's; beyond_one_band = claimed gain "
          "more than 3 half-bands: a gap of one band beyond the tie) ==")
    print(summary(frame).to_string(index=False))
    ok = frame[(frame["status"] == "ok") & ~frame["tied"].astype(bool)]
    if len(ok):
        print("\n== the recipes not tied: the term that gives most of the claimed gain (count), "
              "and each term's mean share of the recipe's step (recipe - first) ==")
        print(ok["main_term"].value_counts().to_string())
        print(ok[[c for c in ok.columns if c.startswith("d_")]].mean().map(
            lambda x: f"{x:+.1%}").to_string())
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    if ns.rows:
        frame.to_csv(ns.rows, index=False)
    return 0


if __name__ == "__main__":
    run_script(main)

"""The step-time band widths, measured: writes planner/data/step_time_bands.yaml and the
residuals it was computed from (planner/data/step_time_band_residuals.csv).

    python benchmarks/bands.py                     # everything (re-run after any cost-model change)
    python benchmarks/bands.py --loso-rows R.csv   # reuse a leave-one-source-out table
                                                   # (accuracy.py --loso --rows X writes X.loso.csv)
    python benchmarks/bands.py --few-shot 0        # skip the calibrated-band check
    python benchmarks/bands.py --dry-run           # print, write nothing

Two bands, one home each (planner.data.bands, whose width / coverage definitions this uses):

- ranking band: every group of >= 3 measured layouts of one job (the published groups and the
  sweeps of planner/data/sweeps, as benchmarks/ranking.py builds them), each layout predicted on
  the stock profile; residual = measured / predicted with the group's median log ratio removed.
- absolute band: the leave-one-source-out residuals (benchmarks/accuracy.py
  leave_one_source_out: profiles and stack presets refitted without the source), per cell: stack
  named (the `named` column) or not (`stock`), GPU curve own or borrowed. Its honesty out of
  sample: each source's coverage by the widths computed without that source.
- calibrated band (--few-shot K, default 3): accuracy.py's few-shot protocol (each group's K
  smallest runs calibrate, the others are predicted); coverage of the band the plans carry after
  `solve --calibrate K` (the profile's step_time_rel_error) on the runs not used.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402
import ranking  # noqa: E402

from planner.data import bands  # noqa: E402
from planner.errors import PlannerError, run_script  # noqa: E402
from planner.measured.runs import PUBLISHED_RUNS_CSV, load_table  # noqa: E402
from planner.registry import load_gpu  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HEADER = "# written by benchmarks/bands.py: do not edit by hand\n"


def ranking_residuals(log: Any = print) -> pd.DataFrame:
    """One row per measured layout of every ranking group: source, group, ratio (measured /
    predicted on the stock profile) and within (the ratio with the group's median removed)."""
    from planner.costmodel import estimate_many

    tables = [PUBLISHED_RUNS_CSV, *ranking.sweep_tables()]
    runs, _ = ranking.load_all(tables)
    predictor = accuracy.Predictor()
    groups = ranking.build_groups(runs, ranking.frameworks_of(tables), predictor)
    rows = []
    for n, g in enumerate(groups, 1):
        run = g.runs[0]
        ests = estimate_many(run.model, run.cluster, run.job, g.layouts)
        pred = np.array([e.step_time_s for e in ests])
        ratio = g.measured / pred
        within = bands.within_group_ratios(ratio, np.zeros(len(ratio)))
        for i in range(len(ratio)):
            rows.append({"kind": "ranking", "cell": "ranking", "source": g.source,
                         "group": f"g{n}", "gpu": run.cluster.gpu.name, "run": g.runs[i].run_id,
                         "ratio": float(ratio[i]), "within": float(within[i]),
                         "predicted_s": float(pred[i]), "measured_s": float(g.measured[i])})
    log(f"ranking: {len(groups)} groups, {len(rows)} layouts")
    return pd.DataFrame(rows), groups


def closed_loop_coverage(groups: list[Any], k: int,
                         structural: dict[str, Any] | None = None) -> dict[str, Any]:
    """`solve --calibrate k` replayed on every ranking group of at least max(5, k + 2) layouts
    (benchmarks/ranking.py closed_loop_group: the k plans the loop chooses are 'run', the
    profile is refitted, the other layouts predicted): the share of those other layouts inside
    the stock step-time band before and inside the band the calibration measured after.
    `structural` (a dict) receives structural_fit's entry."""
    rows, entries = [], []
    for g in groups:
        if len(g.layouts) < ranking.loop_min_layouts(k):
            continue
        try:
            out = ranking.closed_loop_group(g, k, ranking.rank_plans(g, g.runs[0].cluster.gpu))
        except PlannerError:
            continue
        entries.append(out.pop(ranking.STRUCT))
        rows.append({"source": g.source, "n": len(g.layouts) - k, **out})
    frame = pd.DataFrame(rows)
    out = _loop_stats(frame)
    out["by_source"] = {src: _loop_stats(g) for src, g in frame.groupby("source")}
    if structural is not None:
        structural.update(structural_fit(entries))
    return out


def structural_fit(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The structural band's tau (planner.data.bands.fit_structural_tau) on every replayed
    group's layouts not run, with its held-out coverage: each group's layouts by the tau fitted
    on the other groups (ranking.structural_coverage), pooled and per source."""
    from planner.plan import TIME_COLUMNS

    kept = [e for e in entries if len(e["resid"])]
    tau = ranking.structural_tau_of(kept)
    cov = ranking.structural_coverage(kept).set_index("layouts")
    return {"tau": {c: round(float(t), 4) for c, t in zip(TIME_COLUMNS, tau, strict=True)},
            "n": int(sum(len(e["resid"]) for e in kept)), "groups": len(kept),
            "how": "maximum likelihood: log(measured / predicted) of the layouts a replayed "
                   "solve --calibrate did not run ~ Normal(0, band^2 + sum_t tau_t^2 d_t^2), "
                   "d the layout's time-term shares less its calibration runs' mean; terms no "
                   "layout moves get the largest tau",
            "coverage_leave_one_group_out": {
                src: {"flat": round(float(r["flat"]), 4),
                      "few_shot_posterior": round(float(r["per-layout"]), 4),
                      "structural": round(float(r["structural LOGO"]), 4), "n": int(r["n"])}
                for src, r in cov.iterrows()}}


def _loop_stats(frame: pd.DataFrame) -> dict[str, Any]:
    n = frame["n"].to_numpy()
    return {"groups": len(frame), "predicted_layouts": int(n.sum()),
            "band_before_median": round(float(frame["rest_band_before"].median()), 4),
            "band_after_median": round(float(frame["rest_band_after"].median()), 4),
            "coverage_before": round(float(np.average(frame["rest_covered_before"], weights=n)),
                                     4),
            "coverage_after": round(float(np.average(frame["rest_covered_after"], weights=n)), 4),
            "coverage_after_per_group_mean": round(float(frame["rest_covered_after"].mean()), 4),
            "median_error_after": round(float(frame["rest_error_after"].median()), 4)}


def absolute_residuals(loso: pd.DataFrame) -> pd.DataFrame:
    """The leave-one-source-out table (accuracy.leave_one_source_out: errors predicted /
    measured - 1 in columns stock and named) as residuals per cell."""
    borrowed = {g: load_gpu(g).curve_is_borrowed for g in loso["gpu"].unique()}
    rows = []
    for r in loso.to_dict("records"):
        for col, named in (("stock", False), ("named", True)):
            rows.append({"kind": "absolute", "cell": bands.cell(named, borrowed[r["gpu"]]),
                         "source": r["source"], "group": r["stack"], "gpu": r["gpu"],
                         "run": r["run"], "ratio": 1.0 / (1.0 + float(r[col])),
                         "within": np.nan})
    return pd.DataFrame(rows)


def stats(ratios: np.ndarray, w: float, weights: Any = None) -> dict[str, Any]:
    """n, width, in-sample coverage (weighted as the width), median and p90 of |ratio - 1|
    (fractions, rounded)."""
    dev = np.abs(ratios - 1)
    return {"width": round(w, 4), "n": int(len(ratios)),
            "coverage": round(bands.coverage(ratios, w, weights), 4),
            "median": round(float(np.median(dev)), 4), "p90": round(float(np.quantile(dev, .9)),
                                                                    4)}


def source_width(res: pd.DataFrame) -> float:
    """Width of absolute residuals with every source weighing alike (planner.data.bands)."""
    return bands.width(res["ratio"].to_numpy(), bands.group_weights(res["source"]))


def tie_rule_pairs(rank: pd.DataFrame, w: float, margin: float = 0.03) -> dict[str, Any]:
    """The tie rule checked on the measured pairs of each group (measured more than `margin`
    apart): how often the prediction orders them right when their ranking bands (predicted x
    (1 -+ w)) overlap (tied: should be near a coin flip) and when they do not (should be right)."""
    out = {"tied": [0, 0], "apart": [0, 0]}
    for _, g in rank.groupby("group"):
        p, m = g["predicted_s"].to_numpy(), g["measured_s"].to_numpy()
        for i in range(len(p)):
            for j in range(i + 1, len(p)):
                if max(m[i], m[j]) / min(m[i], m[j]) - 1 <= margin:
                    continue
                tied = p[i] * (1 - w) <= p[j] * (1 + w) and p[j] * (1 - w) <= p[i] * (1 + w)
                key = "tied" if tied else "apart"
                out[key][0] += int(np.sign(p[i] - p[j]) == np.sign(m[i] - m[j]))
                out[key][1] += 1
    return {f"{k}_pairs": int(v[1]) for k, v in out.items()} | {
        f"{k}_ordered_right": round(v[0] / v[1], 4) if v[1] else None for k, v in out.items()}


def held_out_coverage(res: pd.DataFrame) -> pd.DataFrame:
    """Per source and cell: coverage of the source's residuals by the cell's width computed on
    the other sources' residuals (source_width: the band's honesty on a source it never saw);
    then per cell, source ALL (each run counts once) and SOURCES (each source counts once, what
    a user with unseen software meets)."""
    out = []
    for (cell, source), g in res.groupby(["cell", "source"]):
        rest = res[(res["cell"] == cell) & (res["source"] != source)]
        w = source_width(rest) if len(rest) else float("nan")
        out.append({"cell": cell, "source": source, "n": len(g), "width_without": w,
                    "coverage": bands.coverage(g["ratio"].to_numpy(), w) if w == w else np.nan})
    frame = pd.DataFrame(out)
    for cell, g in frame.groupby("cell"):
        ok = g[g["coverage"].notna()]
        if len(ok):
            for name, weights in (("ALL", ok["n"]), ("SOURCES", None)):
                frame.loc[len(frame)] = {
                    "cell": cell, "source": name, "n": int(ok["n"].sum()),
                    "width_without": np.nan,
                    "coverage": float(np.average(ok["coverage"], weights=weights))}
    return frame


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, check=True, capture_output=True, text=True).stdout
        return out + ("+uncommitted" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _structural_only(groups: list[Any], ns: argparse.Namespace) -> int:
    """--structural-only: the closed loop replayed, the band file's calibrated entries for it
    rewritten, the rest of the file kept as it is."""
    import yaml

    structural: dict[str, Any] = {}
    loop = closed_loop_coverage(groups, ns.few_shot or 3, structural)
    data = yaml.safe_load(ns.out.read_text())
    calibrated = data.get("calibrated") or {"k": ns.few_shot or 3}
    calibrated["closed_loop_on_sweeps"] = loop
    calibrated["structural"] = {
        **structural, "made_by": "python benchmarks/bands.py --structural-only",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit()}
    data["calibrated"] = calibrated
    text = yaml.safe_dump(data, sort_keys=False, width=100)
    print(yaml.safe_dump({"calibrated": calibrated}, sort_keys=False, width=100))
    if not ns.dry_run:
        from planner.io import write_text_atomic

        write_text_atomic(ns.out, HEADER + text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loso-rows", type=Path,
                        help="a leave-one-source-out table (accuracy.py --tune none --loso "
                        "--rows X writes X.loso.csv) instead of computing it")
    parser.add_argument("--few-shot", type=int, default=3, metavar="K",
                        help="check the calibrated band with K calibration runs (0: skip)")
    parser.add_argument("--structural-only", action="store_true",
                        help="replay solve --calibrate K on the sweeps and rewrite only the "
                        "band file's calibrated.closed_loop_on_sweeps and calibrated.structural "
                        "(the per-plan band after a calibration; no leave-one-source-out run)")
    parser.add_argument("--stack-fits", type=Path, metavar="FILE",
                        help="the stack presets accuracy.py --stacks --save-stack-fits wrote "
                        "on this checkout (else they are refitted: most of the run's time)")
    parser.add_argument("--dry-run", action="store_true", help="print only, write nothing")
    parser.add_argument("--out", type=Path, default=bands.BANDS_YAML)
    ns = parser.parse_args(argv)
    # checked first: a file fitted on other code fails before the long work
    stack_fits = accuracy.load_stack_fits(ns.stack_fits) if ns.stack_fits else None
    t0 = time.perf_counter()
    rank, groups = ranking_residuals()
    if ns.structural_only:
        return _structural_only(groups, ns)
    if ns.loso_rows:
        loso = pd.read_csv(ns.loso_rows)
        how_loso = f"read from {ns.loso_rows.name}"
    else:
        runs, _ = load_table(PUBLISHED_RUNS_CSV, resolve_gpu=load_gpu)
        runs = [r for r in runs if not r.model.is_moe]
        loso = accuracy.leave_one_source_out(runs, accuracy.Predictor())
        how_loso = "computed"
    absolute = absolute_residuals(loso)
    print(f"absolute: {len(loso)} runs left out by source ({how_loso}) "
          f"({time.perf_counter() - t0:.0f}s)", flush=True)

    within = rank["within"].to_numpy()
    weights = bands.group_weights(rank["group"])  # every job counts once
    w_rank = bands.width(within, weights)
    ranking_out: dict[str, Any] = {
        "width": round(w_rank, 4), "n": int(len(within)), "groups": int(rank["group"].nunique()),
        "weights": "each group (job) counts once",
        "coverage": round(bands.coverage(within, w_rank, weights), 4),
        "coverage_of_layouts": round(bands.coverage(within, w_rank), 4),
        "tie_rule_pairs": tie_rule_pairs(rank, w_rank), "by_source": {}}
    for source, g in rank.groupby("source"):
        r = g["within"].to_numpy()
        ranking_out["by_source"][source] = {**stats(r, bands.width(r)),
                                            "coverage_of_pooled": round(bands.coverage(r, w_rank),
                                                                        4),
                                            "groups": int(g["group"].nunique())}
    absolute_out: dict[str, Any] = {}
    held = held_out_coverage(absolute)
    for name in bands.CELLS.values():
        r = absolute[absolute["cell"] == name]["ratio"].to_numpy()
        if not len(r):  # no run of this kind: the widest measured cell (said so)
            continue
        mine = absolute[absolute["cell"] == name]

        def held_at(which: str, name: str = name) -> float | None:
            h = held[(held["cell"] == name) & (held["source"] == which)]["coverage"]
            return round(float(h.iloc[0]), 4) if len(h) else None

        absolute_out[name] = {**stats(r, source_width(mine),
                                      bands.group_weights(mine["source"])),
                              "weights": "each source counts once",
                              "sources": sorted(mine["source"].unique().tolist()),
                              "coverage_held_out": held_at("ALL"),
                              "coverage_held_out_by_source": held_at("SOURCES")}
    for (named, borrowed), name in bands.CELLS.items():
        own = absolute_out.get(bands.cell(named, False))
        mine = absolute_out.get(name)
        if borrowed and mine and own and mine["width"] < own["width"]:
            # a curve borrowed from another chip knows no more than a measured one
            absolute_out[name] = {**mine, "measured_width": mine["width"],
                                  "width": own["width"], "floor_from": bands.cell(named, False)}
    widest = max(absolute_out.values(), key=lambda c: c["width"])
    for name in bands.CELLS.values():
        if name not in absolute_out:
            absolute_out[name] = {**widest, "note": "no held-out run of this kind: the widest "
                                  "measured cell"}
    calibrated = None
    if ns.few_shot:
        structural: dict[str, Any] = {}
        loop = closed_loop_coverage(groups, ns.few_shot, structural)
        print(f"closed loop K={ns.few_shot}: {loop} ({time.perf_counter() - t0:.0f}s)",
              flush=True)
        runs, _ = load_table(PUBLISHED_RUNS_CSV, resolve_gpu=load_gpu)
        runs = [r for r in runs if not r.model.is_moe]
        predictor = accuracy.Predictor()
        if stack_fits:
            fitted, without = stack_fits
        else:
            _, fitted, without = accuracy.fit_stacks(runs, predictor, log=lambda *a: None)
        per_run, _ = accuracy.few_shot(runs, predictor, ns.few_shot, without, fitted,
                                       log=lambda *a: None)
        ratio = 1.0 / (1.0 + per_run["after"].to_numpy())
        calibrated = {
            "k": ns.few_shot,
            "closed_loop_on_sweeps": loop,
            "how": "published groups: each (source, stack, GPU) group's K runs with the fewest "
                   "GPUs calibrate (accuracy.py few_shot), the others are predicted; "
                   "closed_loop_on_sweeps: solve --calibrate K replayed (ranking.py)",
            "predicted_runs": len(per_run),
            "groups": int(per_run.groupby(["source", "stack", "gpu"]).ngroups),
            "band_median": round(float(per_run["profile_band"].median()), 4),
            "coverage": round(float(per_run["inside_profile"].mean()), 4),
            "median_error": round(float(np.median(np.abs(ratio - 1))), 4),
            "uncalibrated_coverage": round(bands.coverage(
                1.0 / (1.0 + per_run["before"].to_numpy()), absolute_out["stack"]["width"]), 4),
            "structural": structural,  # the per-plan band's tau (structural_fit)
        }
    data = {
        "provenance": {
            "made_by": "python benchmarks/bands.py" + (" --loso-rows ..." if ns.loso_rows
                                                       else ""),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(),
            "definition": "residual = measured / predicted step time; width = the 1-sigma "
                          "quantile (68.27%) of |residual - 1| at its upper 84% confidence "
                          "bound (planner.data.bands.width); a plan's band is predicted x "
                          "(1 -+ width)",
            "ranking_from": "every group of >= 3 measured layouts of one job (benchmarks/"
                            "ranking.py build_groups) in planner/data/published_runs.csv and "
                            + ", ".join(f"planner/data/sweeps/{p.name}"
                                        for p in ranking.sweep_tables())
                            + ", stock profiles; each group's median log residual removed",
            "absolute_from": "benchmarks/accuracy.py leave_one_source_out on planner/data/"
                             "published_runs.csv (dense rows): stock = stock factors, stack = "
                             "the stack's preset fitted without the source",
            "residuals": bands.RESIDUALS_CSV.name,
        },
        "ranking": ranking_out,
        "absolute": absolute_out,
        "calibrated": calibrated,
    }
    import yaml

    text = yaml.safe_dump(data, sort_keys=False, width=100)
    print(text)
    print("held-out coverage (each source by the widths of the others):")
    print(held.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if not ns.dry_run:
        from planner.io import write_text_atomic

        out = pd.concat([rank, absolute], ignore_index=True)
        out["ratio"] = out["ratio"].round(6)
        out["within"] = out["within"].round(6)
        write_text_atomic(ns.out, HEADER + text)
        write_text_atomic(ns.out.with_name(bands.RESIDUALS_CSV.name),
                          out.to_csv(index=False))
        print(f"wrote {ns.out} and {bands.RESIDUALS_CSV.name}")
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    run_script(main)

"""Ranking quality of the cost model on measured layout sweeps (issue 16).

    python benchmarks/ranking.py                       # published runs + planner/data/sweeps
    python benchmarks/ranking.py --closed-loop 3       # also replay `solve --calibrate 3`
    python benchmarks/ranking.py --groups              # also print every group's row
    python benchmarks/ranking.py --stack-fit           # also with the stack's efficiency fitted
                                                       # on the same source's other runs
    python benchmarks/ranking.py --stack-knobs gemm_scale,layer_overhead_us,intra_bw_scale
    python benchmarks/ranking.py --closed-loop 3 --loop-knobs intra_bw_scale  # refit these only
    python benchmarks/ranking.py --markdown out.md     # also write the tables as markdown
    python benchmarks/ranking.py --healthy 0.333       # without runs logged on a degraded network
    python benchmarks/ranking.py --healthy-intra 0.95  # without allocations whose logged
                                                       # intra-node busbw is in the low mode

What a user takes from `planner solve` is its first plan, so beyond step-time error
(benchmarks/accuracy.py) this asks: among layouts that were all measured on the same job, does
the model order them right, and is its first pick the fastest? A group is every set of at least
3 distinct layouts of the same model, GPU, GPU count, global batch, sequence length, precision
and software stack (source and framework column) with a measured step time. Each layout is
predicted as accuracy.py predicts it (its stated knobs pinned, the search completing the others,
with the stock profiles: Predictor and the same table loader); layouts the cost model refuses
(e.g. tp across NVLink domains) are left out of their group and counted.

Per group and pooled over groups, split into the sources the stock profiles were fitted on
(accuracy.TUNE_SOURCES) and the held-out ones:
- pairwise: the share of pairs measured more than PAIR_MARGIN apart that the prediction orders
  the same way (a predicted tie, |dt| < TIE_REL, counts one half);
- Spearman rho between predicted and measured step times (groups averaged);
- top-1 regret: measured time of the predicted-first layout over the best measured, minus 1
  (the first pick is the fastest predicted among those predicted to fit, as `solve` ranks; ties
  by lower memory); median and mean over groups;
- within 3%: share of groups whose first pick's regret is at most PAIR_MARGIN.

--closed-loop K replays `planner solve --calibrate K` on every group of at least
max(LOOP_MIN_LAYOUTS, K + 2) layouts, the measurement injected: the K plans the loop's choice
picks among the group's first loop_candidates(K) plans (the candidates solve --calibrate
chooses among) are "run" (their recorded step times are what the refit sees, as MeasuredRuns
with the group's own job; the real loop reads them back from validate records), the profile is
refitted to them, the group is ranked again, and the user ends with the fastest of what ran and
the new first pick. choose() and refit() are the seam to planner.calibrate (one call each).
unrun_error: median |predicted / measured - 1| over the layouts not run (median over groups);
unrun_candidates_error: the same over the candidates not run (the plans solve shows).

--stack-fit ranks each group again after fitting its software stack's efficiency knobs
(STACK_KNOBS, or --stack-knobs) on the same source's other timed runs on that GPU, never the
group's own: how well the structure ranks once the stack's efficiency is known.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import (
    TUNE_SOURCES,
    Predictor,
    _searched_layouts,
    _timed_by_gpu,
)

from planner.errors import PlannerError, SpecError, run_script
from planner.layout import Layout
from planner.measured.runs import PUBLISHED_RUNS_CSV, MeasuredRun, load_table
from planner.plan import Plan
from planner.registry import load_gpu
from planner.search.bands import adverse_cluster, order_ties, tp_term_weight
from planner.specs import GpuProfile

SWEEPS_DIR = PUBLISHED_RUNS_CSV.parent / "sweeps"
MIN_LAYOUTS = 3  # a group ranks at least this many distinct measured layouts
PAIR_MARGIN = 0.03  # pairs measured closer than 3% are noise; a first pick within 3% is a hit
TIE_REL = 1e-6  # predicted step times this close (relative) are a predicted tie
# rank_plans orders the tie with the fastest by robustness, as solve does (--order-by-time: off)
ORDER_TIES = True
# The loop replays on groups that keep at least 2 layouts it did not run (issue 16 replayed it on
# the groups of at least 5): with fewer, running K of them is itself the search.
LOOP_MIN_LAYOUTS = 5


@dataclass
class Group:
    """Measured layouts of one job: the runs (one per distinct layout) and their layouts as the
    stock profile completes them."""

    key: str
    source: str
    runs: list[MeasuredRun]
    layouts: list[Layout]
    measured: np.ndarray  # seconds per step, one per layout
    refused: int = 0  # runs the cost model cannot express (left out)
    merged: int = 0  # repeated measurements of one layout folded into their median
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tuned(self) -> bool:
        return self.source in TUNE_SOURCES


def _group_key(run: MeasuredRun, framework: str) -> tuple:
    c = run.cluster
    return (run.source_id, framework, run.model.model_dump_json(), c.gpu.name, c.num_nodes,
            c.gpus_per_node, run.job.model_dump_json())


def frameworks_of(paths: Sequence[Path]) -> dict[str, str]:
    """run_id -> the row's framework column (the software stack), over the given tables."""
    out: dict[str, str] = {}
    for path in paths:
        frame = pd.read_csv(path, usecols=lambda c: c in ("row_id", "source_id", "framework"))
        for i, row in enumerate(frame.to_dict("records")):
            rid = row.get("row_id")
            rid = i + 1 if rid is None or (isinstance(rid, float) and np.isnan(rid)) else rid
            out[f"{row.get('source_id', 'csv')}:{rid}"] = str(row.get("framework", ""))
    return out


def build_groups(runs: Sequence[MeasuredRun], frameworks: dict[str, str],
                 predictor: Predictor, min_layouts: int = MIN_LAYOUTS) -> list[Group]:
    """The ranking groups of `runs` (timed runs only), each layout completed on its stock
    profile by `predictor`. Repeats of one layout in a group are folded into their median."""
    by_key: dict[tuple, list[MeasuredRun]] = {}
    for run in runs:
        if run.oom or not run.measured_step_time_s:
            continue
        by_key.setdefault(_group_key(run, frameworks.get(run.run_id, "")), []).append(run)
    groups = []
    for key, members in by_key.items():
        if len(members) < min_layouts:
            continue
        gpu = members[0].cluster.gpu
        kept: dict[Layout, list[MeasuredRun]] = {}
        refused = 0
        for run in members:
            try:
                pred = predictor.row(run, gpu)
            except PlannerError:
                pred = None
            if pred is None:
                refused += 1
                continue
            kept.setdefault(pred["layout"], []).append(run)
        if len(kept) < min_layouts:
            continue
        layouts = list(kept)
        measured = np.array([np.median([r.measured_step_time_s for r in kept[lay]])
                             for lay in layouts])
        first = members[0]
        name = (f"{first.source_id} | {key[1] or '-'} | {first.model.name} | "
                f"{first.cluster.num_gpus}x{gpu.name} | gbs {first.job.global_batch} "
                f"seq {first.job.seq_len} {first.job.precision}")
        groups.append(Group(name, first.source_id, [kept[lay][0] for lay in layouts], layouts,
                            measured, refused, sum(len(v) - 1 for v in kept.values()),
                            {"run_ids": {r.run_id for r in members}}))
    return groups


def rank_plans(group: Group, gpu: GpuProfile) -> list[Plan]:
    """The group's layouts as `solve` would rank them on `gpu`: fitting ones first, by predicted
    step time, then lower peak memory (docs/ranking.md); every layout gets a Plan."""
    from planner.costmodel import estimate_many

    run = group.runs[0]
    cluster = run.cluster.model_copy(update={"gpu": gpu})
    ests = estimate_many(run.model, cluster, run.job, group.layouts)
    order = sorted(range(len(ests)), key=lambda i: (not ests[i].fits, ests[i].step_time_s,
                                                    ests[i].peak_mem_gb, i))
    plans = [Plan(group.layouts[i], ests[i], rank) for rank, i in enumerate(order, 1)]
    if not ORDER_TIES:
        return plans
    # the tie with the fastest first, most robust first (planner.search.ties, as solve does:
    # the robustness score reads each layout costed on the adverse fabric, bands.adverse_cluster)
    worse = adverse_cluster(cluster)
    adverse = None if worse is cluster else estimate_many(run.model, worse, run.job,
                                                           [p.layout for p in plans])
    weight = tp_term_weight([p.layout.tp for p in plans], cluster.domain_gpus,
                            run.job.tp_comm_overlap)
    return order_ties(plans, adverse, weight)


def pair_counts(predicted: np.ndarray, measured: np.ndarray,
                margin: float = PAIR_MARGIN) -> tuple[float, int]:
    """(pairs ordered right, pairs counted): pairs measured more than `margin` apart (relative
    to the faster); a predicted tie counts one half."""
    right, total = 0.0, 0
    n = len(measured)
    for i in range(n):
        for j in range(i + 1, n):
            lo, hi = sorted((measured[i], measured[j]))
            if hi / lo - 1 <= margin:
                continue
            total += 1
            dp = predicted[i] - predicted[j]
            if abs(dp) <= TIE_REL * max(abs(predicted[i]), abs(predicted[j])):
                right += 0.5
            elif np.sign(dp) == np.sign(measured[i] - measured[j]):
                right += 1.0
    return right, total


def spearman(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); nan when either side is constant."""
    p, m = pd.Series(predicted).rank(), pd.Series(measured).rank()
    if p.nunique() < 2 or m.nunique() < 2:
        return float("nan")
    return float(np.corrcoef(p, m)[0, 1])


def regret_of(first: int, measured: np.ndarray) -> float:
    """Measured time of layout `first` over the best measured, minus 1."""
    return float(measured[first] / measured.min() - 1.0)


def score_group(group: Group, plans: Sequence[Plan]) -> dict[str, Any]:
    """The group's metrics for one ranking (plans as rank_plans returns them)."""
    index = {lay: i for i, lay in enumerate(group.layouts)}
    predicted = np.empty(len(plans))
    for p in plans:
        predicted[index[p.layout]] = p.estimate.step_time_s
    right, total = pair_counts(predicted, group.measured)
    first = index[plans[0].layout]
    regret = regret_of(first, group.measured)
    return {"group": group.key, "source": group.source, "tuned": group.tuned,
            "layouts": len(group.layouts), "refused": group.refused,
            "predicted_oom": sum(not p.estimate.fits for p in plans),
            "pairs": total, "pairs_right": right,
            "pairwise": right / total if total else np.nan,
            "spearman": spearman(predicted, group.measured), "regret": regret,
            "within_3pct": regret <= PAIR_MARGIN, "first": str(plans[0].layout),
            "best": str(group.layouts[int(np.argmin(group.measured))])}


def summarize(rows: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """Pooled metrics per split (held out, tuned, all): pairs pooled, the rest over groups."""
    out = []
    splits = [("held out", rows[~rows["tuned"]]), ("tuned on", rows[rows["tuned"]]),
              ("all", rows)]
    for name, g in splits:
        if not len(g):
            continue
        pairs = g[prefix + "pairs"].sum()
        reg = g[prefix + "regret"]
        out.append({"sources": name, "groups": len(g), "layouts": int(g["layouts"].sum()),
                    "pairs": int(pairs),
                    "pairwise": g[prefix + "pairs_right"].sum() / pairs if pairs else np.nan,
                    "spearman": g[prefix + "spearman"].mean(),
                    "regret_median": reg.median(), "regret_mean": reg.mean(),
                    "within_3pct": g[prefix + "within_3pct"].mean()})
    return pd.DataFrame(out)


# ---- the stack's efficiency from its other runs ------------------------------------------

STACK_KNOBS = ("gemm_scale", "layer_overhead_us")  # accuracy.py --software-factors' two numbers


def stack_profile(group: Group, runs: Sequence[MeasuredRun], predictor: Predictor,
                  knobs: Sequence[str] = STACK_KNOBS) -> GpuProfile | None:
    """The group's stock profile with the software stack's GEMM scale and per-layer-pass time
    fitted on the same source's other timed runs on that GPU (never the group's own): how the
    cost model ranks once the stack's efficiency is known from elsewhere. None when fewer than
    len(knobs) + 1 such runs exist."""
    from planner.calibrate import calibrate

    gpu = group.runs[0].cluster.gpu
    others = [r for r in runs if r.source_id == group.source
              and r.run_id not in group.extra["run_ids"]]
    timed = _timed_by_gpu(others).get(gpu.name, [])
    layouts = _searched_layouts(timed, gpu, predictor)
    pairs = [(r, lay) for r, lay in zip(timed, layouts, strict=True) if lay is not None]
    if len(pairs) <= len(knobs):
        return None
    fit = calibrate(gpu, [r for r, _ in pairs], layouts=[lay for _, lay in pairs],
                    names=list(knobs), cross_validate=False)
    values = getattr(fit, "values", None) or {}
    group.extra["stack_values"] = {k: values[k] for k in knobs if k in values}
    return fit.profile


# ---- the closed loop, measurement injected -----------------------------------------------

def choose(plans: Sequence[Plan], k: int) -> list[Plan]:
    """The plans `solve --calibrate k` runs: planner.validate.loop.closed_loop validates
    choose_calibration_plans' choice (the first plan, then the tied plans that differ most in
    their time-term shares)."""
    from planner.calibrate.choose import choose_calibration_plans

    return choose_calibration_plans(plans, k)


def refit(gpu: GpuProfile, runs: Sequence[MeasuredRun], layouts: Sequence[Layout],
          knobs: Sequence[str] | None = None) -> Any:
    """The fit whose .profile `solve --calibrate` re-ranks with: closed_loop's few-shot fit
    (planner.calibrate.fewshot: only the knobs the runs identify, at most runs - 1, pulled toward
    the stack preset) from the default stack, the preset a user who names no stack gets (the
    group's own stack preset was fitted on these published runs, so starting from it would be
    in sample). `knobs` instead fits exactly those parameters with calibrate (a diagnostic)."""
    if knobs is not None:
        from planner.calibrate import calibrate

        return calibrate(gpu, runs, layouts=list(layouts), names=list(knobs),
                         cross_validate=len(runs) >= 3)
    from planner.calibrate.fewshot import few_shot_fit
    from planner.stacks import resolve_stack

    return few_shot_fit(gpu, runs, stack=resolve_stack(None), layouts=list(layouts),
                        cross_validate=False)


def closed_loop_group(group: Group, k: int, before: Sequence[Plan],
                      knobs: Sequence[str] | None = None) -> dict[str, Any]:
    """Replay the loop on one group: choose k plans, 'run' them (their measured times), refit,
    re-rank; the user ends with the fastest of what ran and the new first pick."""
    gpu = group.runs[0].cluster.gpu
    index = {lay: i for i, lay in enumerate(group.layouts)}
    candidates = [index[p.layout] for p in before[:loop_candidates(k)]]
    chosen = [index[p.layout] for p in choose(before[:loop_candidates(k)], k)]
    ran = [group.runs[i] for i in chosen]
    fit = refit(gpu, ran, [group.layouts[i] for i in chosen], knobs)
    fitted = fit.profile
    after = rank_plans(group, fitted)
    new_first = index[after[0].layout]
    ends = min(chosen + [new_first], key=lambda i: group.measured[i])
    no_refit = min(chosen, key=lambda i: group.measured[i])
    scored = score_group(group, after)
    rest = [i for i in range(len(group.layouts)) if i not in chosen]
    pred_after = {index[p.layout]: p.estimate.step_time_s for p in after}
    pred_before = {index[p.layout]: p.estimate.step_time_s for p in before}

    def rest_error(pred: dict[int, float]) -> float:
        return float(np.median([abs(pred[i] / group.measured[i] - 1) for i in rest])) \
            if rest else np.nan

    def candidates_error(pred: dict[int, float]) -> float:
        shown = [i for i in candidates if i not in chosen]
        return float(np.median([abs(pred[i] / group.measured[i] - 1) for i in shown])) \
            if shown else np.nan

    def rest_covered(pred: dict[int, float], rel: float) -> float:
        """Share of the layouts not run inside the step-time band pred x (1 -+ rel)."""
        return float(np.mean([abs(group.measured[i] / pred[i] - 1) <= rel for i in rest])) \
            if rest else np.nan

    return {"loop_pairs": scored["pairs"], "loop_pairs_right": scored["pairs_right"],
            "loop_pairwise": scored["pairwise"], "loop_spearman": scored["spearman"],
            "loop_regret": regret_of(new_first, group.measured),
            "loop_within_3pct": regret_of(new_first, group.measured) <= PAIR_MARGIN,
            "end_pairs": scored["pairs"], "end_pairs_right": scored["pairs_right"],
            "end_spearman": scored["spearman"],
            "end_regret": regret_of(ends, group.measured),
            "end_within_3pct": regret_of(ends, group.measured) <= PAIR_MARGIN,
            "norefit_regret": regret_of(no_refit, group.measured),
            "rest_error_before": rest_error(pred_before),
            "rest_error_after": rest_error(pred_after),
            # the step-time band's honesty on the layouts not run: the stock band before, the
            # band the calibration measured after (planner.data.bands.coverage)
            "rest_band_before": gpu.step_time_band, "rest_band_after": fitted.step_time_band,
            "rest_covered_before": rest_covered(pred_before, gpu.step_time_band),
            "rest_covered_after": rest_covered(pred_after, fitted.step_time_band),
            "loop_first": str(after[0].layout),
            # the candidates solve --calibrate chose among (what solve shows), less those run
            "cand_error_before": candidates_error(pred_before),
            "cand_error_after": candidates_error(pred_after),
            STRUCT: _structural_inputs(group, fit, after, chosen, rest)}


STRUCT = "_structural"  # closed_loop_group's private entry: what the structural band is fitted on


def _structural_inputs(group: Group, fit: Any, after: Sequence[Plan], chosen: Sequence[int],
                       rest: Sequence[int]) -> dict[str, Any]:
    """Per layout not run: log(measured / predicted after the refit), its time-term shares less
    the calibration runs' mean (planner.specs.hardware.structural_band's d), the flat calibrated
    band and the few-shot posterior's own band (FewShotFit.band; nan for a --loop-knobs fit)."""
    from planner.plan import TIME_COLUMNS

    index = {lay: i for i, lay in enumerate(group.layouts)}
    est = {index[p.layout]: p.estimate for p in after}
    shares = {i: np.array([float(getattr(e, c)) / float(e.step_time_s) for c in TIME_COLUMNS])
              for i, e in est.items()}
    ref = np.mean([shares[i] for i in chosen], axis=0)
    resid = np.array([np.log(group.measured[i] / est[i].step_time_s) for i in rest])
    own = np.full(len(rest), np.nan)
    if hasattr(fit, "band") and rest:
        own = fit.band([group.runs[i] for i in rest], [group.layouts[i] for i in rest])[1]
    # the band solve shows after the calibration (Estimate.step_time_high_s: structural_band
    # with the band file's tau, fitted on all these groups, when the profile carries it)
    plan = np.array([est[i].step_time_high_s / est[i].step_time_s - 1 for i in rest])
    return {"group": group.key, "source": group.source, "resid": resid,
            "delta": np.array([shares[i] - ref for i in rest]).reshape(len(rest), -1),
            "floor": fit.profile.step_time_band, "own": own, "plan": plan}


def loop_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Closed-loop metrics per split: the re-ranked order (pairs, first pick) and the plan the
    user ends with; before = the same groups without the loop."""
    out = []
    splits = [("held out", rows[~rows["tuned"]]), ("tuned on", rows[rows["tuned"]]),
              ("all", rows)]
    for name, g in splits:
        if not len(g):
            continue
        pairs, lpairs = g["pairs"].sum(), g["loop_pairs"].sum()
        out.append({
            "sources": name, "groups": len(g),
            "pairwise_before": g["pairs_right"].sum() / pairs if pairs else np.nan,
            "pairwise_after": g["loop_pairs_right"].sum() / lpairs if lpairs else np.nan,
            "first_within_3pct_before": g["within_3pct"].mean(),
            "first_within_3pct_after": g["loop_within_3pct"].mean(),
            "ends_regret_median": g["end_regret"].median(),
            "ends_regret_mean": g["end_regret"].mean(),
            "ends_within_3pct": g["end_within_3pct"].mean(),
            "no_refit_regret_mean": g["norefit_regret"].mean(),
            "no_refit_within_3pct": (g["norefit_regret"] <= PAIR_MARGIN).mean(),
            "unrun_error_before": g["rest_error_before"].median(),
            "unrun_error_after": g["rest_error_after"].median(),
            "unrun_candidates_error_before": g["cand_error_before"].median(),
            "unrun_candidates_error_after": g["cand_error_after"].median()})
    return pd.DataFrame(out)


def structural_tau_of(entries: Sequence[dict[str, Any]]) -> np.ndarray:
    """tau of the structural band (planner.data.bands.fit_structural_tau) fitted on the layouts
    not run of these replayed groups (closed_loop_group's STRUCT entries)."""
    from planner.data.bands import fit_structural_tau

    kept = [e for e in entries if len(e["resid"])]
    return fit_structural_tau(np.concatenate([e["resid"] for e in kept]),
                              np.vstack([e["delta"] for e in kept]),
                              np.concatenate([np.full(len(e["resid"]), e["floor"])
                                              for e in kept]))


def structural_coverage(entries: Sequence[dict[str, Any]],
                        splits: dict[str, Any] | None = None) -> pd.DataFrame:
    """Coverage of the layouts not run (|measured / predicted - 1| <= band) by three bands after
    the refit: the flat calibrated band (the profile's step_time_rel_error), the few-shot
    posterior's per-layout band (FewShotFit.band), the band solve shows (the plan's
    step_time_high_s: the structural band with the band file's tau, fitted on these very groups:
    in sample) and the structural band
    (planner.specs.hardware.structural_band) with tau fitted held out: on every other group (leave
    one group out) and, per named split, on the other part only. Pooled and per source."""
    from planner.specs.hardware import structural_band

    def tau_without(keep: Any) -> np.ndarray:
        return structural_tau_of([e for e in entries if keep(e)])

    split_tau = {name: tau_without(lambda o, t=test: not t(o))
                 for name, test in (splits or {}).items()}
    cols: dict[str, list] = {"source": [], "flat": [], "per-layout": [], "solve's band": [],
                             "structural LOGO": []}
    for name in splits or {}:
        cols[f"structural {name}"] = []
    for e in entries:
        if not len(e["resid"]):
            continue
        dev = np.abs(np.exp(e["resid"]) - 1)
        cols["source"] += [e["source"]] * len(dev)
        cols["flat"] += list(dev <= e["floor"])
        cols["per-layout"] += list(dev <= e["own"])
        cols["solve's band"] += list(dev <= e["plan"] + 1e-12)
        tau = tau_without(lambda o, e=e: o["group"] != e["group"])
        cols["structural LOGO"] += list(dev <= structural_band(e["delta"], 0.0, tau, e["floor"]))
        for name, test in (splits or {}).items():
            inside = (list(dev <= structural_band(e["delta"], 0.0, split_tau[name], e["floor"]))
                      if test(e) else [np.nan] * len(dev))
            cols[f"structural {name}"] += inside
    frame = pd.DataFrame(cols)
    out = [{"layouts": "all", "n": len(frame), **frame.drop(columns="source").mean()}]
    for src, g in frame.groupby("source"):
        out.append({"layouts": src, "n": len(g), **g.drop(columns="source").mean()})
    return pd.DataFrame(out)


# ---- driver ------------------------------------------------------------------------------

def sweep_tables(directory: Path = SWEEPS_DIR) -> list[Path]:
    """The sweep tables shipped next to published_runs.csv (same columns)."""
    return sorted(directory.glob("*.csv")) if directory.is_dir() else []


def load_all(tables: Sequence[Path]) -> tuple[list[MeasuredRun], int]:
    """Runs of every table (rows that cannot be predicted are skipped and counted)."""
    runs: list[MeasuredRun] = []
    skipped = 0
    for path in tables:
        got, skip = load_table(path, resolve_gpu=load_gpu)
        runs += got
        skipped += len(skip)
    return runs, skipped


_ALLREDUCE_LOGGED = re.compile(r"AllReduce=([0-9.]+)")


def logged_allreduce_busbw(run: MeasuredRun) -> float | None:
    """The all-reduce bus bandwidth (GB/s) the run logged in its notes (the nanotron sweep's
    'Logged bus bandwidths GB/s: AllReduce=...'), None when it logged none."""
    found = _ALLREDUCE_LOGGED.search(run.notes or "")
    return float(found.group(1)) if found else None


_INTRA_LOGGED = re.compile(r"intra-node AR=([0-9.]+)")
# the sweep's logged intra-node all-reduce busbw is bimodal: hi 439-462 GB/s, lo 400-432 (and 11
# runs below 400); runs at or above this are in the high mode (benchmarks/nanotron_floor.py)
LO_INTRA_GBS = 435.0


def logged_intra_busbw(run: MeasuredRun) -> float | None:
    """The intra-node all-reduce bus bandwidth (GB/s, the node's 8 GPUs) the run logged in its
    notes (the nanotron sweep's '(intra-node AR=...)'), None when it logged none."""
    found = _INTRA_LOGGED.search(run.notes or "")
    return float(found.group(1)) if found else None


def healthy_runs(runs: Sequence[MeasuredRun], frameworks: dict[str, str],
                 frac: float, intra_frac: float = 0.0) -> tuple[list[MeasuredRun], int]:
    """(the runs, how many were dropped) without those whose logged all-reduce busbw is below
    `frac` x the highest any run of the same job logged: the same job on the same GPU count
    measured on a network that ran several times slower (docs/ranking.md, "Degraded
    networks"); with intra_frac > 0, also without those whose logged intra-node all-reduce is
    below intra_frac x the highest of their source on their GPU (the same 8-GPU measurement
    in every job: the allocations that add a fixed latency to every collective, docs/ranking.md
    "A latency per collective"). Runs that logged nothing are kept."""
    best: dict[tuple, float] = {}
    best_intra: dict[tuple, float] = {}
    for run in runs:
        bw = logged_allreduce_busbw(run)
        if bw is not None:
            key = _group_key(run, frameworks.get(run.run_id, ""))
            best[key] = max(best.get(key, 0.0), bw)
        intra = logged_intra_busbw(run)
        if intra is not None:
            node = (run.source_id, run.cluster.gpu.name)
            best_intra[node] = max(best_intra.get(node, 0.0), intra)

    def keep(r: MeasuredRun) -> bool:
        bw, intra = logged_allreduce_busbw(r), logged_intra_busbw(r)
        if bw is not None and bw < frac * best[_group_key(r, frameworks.get(r.run_id, ""))]:
            return False
        return intra is None or intra >= intra_frac * best_intra[(r.source_id,
                                                                  r.cluster.gpu.name)]

    kept = [r for r in runs if keep(r)]
    return kept, len(runs) - len(kept)


def evaluate(tables: Sequence[Path], closed_loop: int | None = None, stack_fit: bool = False,
             loop_knobs: Sequence[str] | None = None, stack_knobs: Sequence[str] = STACK_KNOBS,
             log: Any = print, healthy: float = 0.0,
             healthy_intra: float = 0.0) -> tuple[pd.DataFrame, list[Group]]:
    """One row per group: the stock ranking's metrics (and the loop's with closed_loop=K; with
    stack_fit, prefixed "stack_", the ranking on stack_profile). healthy or healthy_intra > 0:
    without the runs healthy_runs drops."""
    runs, skipped = load_all(tables)
    if healthy > 0 or healthy_intra > 0:
        runs, dropped = healthy_runs(runs, frameworks_of(tables), healthy, healthy_intra)
        log(f"{dropped} runs dropped: logged all-reduce busbw below {healthy:g} x their job's "
            f"best, or intra-node below {healthy_intra:g} x their source's best")
    predictor = Predictor()
    groups = build_groups(runs, frameworks_of(tables), predictor)
    log(f"{len(runs)} usable rows ({skipped} skipped), {len(groups)} groups of >= {MIN_LAYOUTS} "
        f"layouts, {sum(len(g.layouts) for g in groups)} layouts")
    rows = []
    for g in groups:
        plans = rank_plans(g, g.runs[0].cluster.gpu)
        row = score_group(g, plans)
        if stack_fit:
            prof = stack_profile(g, runs, predictor, stack_knobs)
            if prof is not None:
                log(f"  {g.key}: stack fit " + ", ".join(
                    f"{k}={v:.4g}" for k, v in g.extra.get("stack_values", {}).items()))
                row.update({f"stack_{k}": v for k, v in
                            score_group(g, rank_plans(g, prof)).items()
                            if k in ("pairs", "pairs_right", "pairwise", "spearman", "regret",
                                     "within_3pct", "first")})
        if closed_loop is not None and len(g.layouts) >= loop_min_layouts(closed_loop):
            t0 = time.perf_counter()
            try:
                out = closed_loop_group(g, closed_loop, plans, loop_knobs)
                g.extra[STRUCT] = out.pop(STRUCT)
                row.update(out)
            except PlannerError as exc:  # the refit found nothing to fit: say so, go on
                log(f"  loop on {g.key}: no refit ({exc})")
            log(f"  loop on {g.key}: {time.perf_counter() - t0:.1f}s")
        rows.append(row)
    return pd.DataFrame(rows), groups


def loop_candidates(k: int) -> int:
    """How many ranked plans `solve --calibrate k` chooses its k runs among: the first
    max(top_k, CANDIDATES_PER_RUN k) (planner.validate.loop.candidate_count, top_k at
    closed_loop's default, solve --top's)."""
    from planner.validate.loop import candidate_count

    return candidate_count(k)


def loop_min_layouts(k: int) -> int:
    """Smallest group the closed loop is replayed on: K runs and at least two it did not run."""
    return max(LOOP_MIN_LAYOUTS, k + 2)


def _pct(x: float) -> str:
    return "-" if pd.isna(x) else f"{100 * x:.1f}%"


def _fmt(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    for col in t.columns:
        if col in ("spearman", "loop_spearman"):
            t[col] = t[col].map(lambda x: "-" if pd.isna(x) else f"{x:.2f}")
        elif t[col].dtype.kind == "f" and col not in ("pairs", "pairs_right"):
            t[col] = t[col].map(_pct)
    return t


def _markdown(table: pd.DataFrame) -> str:
    try:
        return table.to_markdown(index=False)
    except ImportError:
        return "```\n" + table.to_string(index=False) + "\n```"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, action="append",
                        help="runs table(s) (default: published_runs.csv and data/sweeps/*.csv)")
    parser.add_argument("--closed-loop", type=int, metavar="K",
                        help="replay `solve --calibrate K` on every group of at least "
                        "max(5, K + 2) layouts")
    parser.add_argument("--loop-knobs", metavar="K1,K2",
                        help="with --closed-loop: fit only these profile knobs (planner.calibrate "
                        "names; default: solve --calibrate's few-shot fit)")
    parser.add_argument("--groups", action="store_true", help="print every group's row")
    parser.add_argument("--stack-fit", action="store_true",
                        help="also rank each group after fitting its software stack's GEMM scale "
                        "and per-layer-pass time on the same source's other runs")
    parser.add_argument("--stack-knobs", default=",".join(STACK_KNOBS), metavar="K1,K2",
                        help="the knobs --stack-fit fits (planner.calibrate names)")
    parser.add_argument("--markdown", type=Path, help="also write the tables as markdown")
    parser.add_argument("--rows", type=Path, help="write the per-group rows as CSV")
    parser.add_argument("--healthy", type=float, default=0.0, metavar="F",
                        help="leave out runs whose logged all-reduce busbw is below F x the best "
                        "of their job (degraded networks; docs/ranking.md)")
    parser.add_argument("--healthy-intra", type=float, default=0.0, metavar="G",
                        help="leave out runs whose logged intra-node all-reduce busbw is below G x "
                        "the best of their source (allocations with a latency per collective; "
                        "docs/ranking.md)")
    parser.add_argument("--order-by-time", action="store_true",
                        help="rank by predicted step time only (no robustness order inside the "
                        "tie with the fastest, as solve had before ties)")
    ns = parser.parse_args(argv)
    global ORDER_TIES
    ORDER_TIES = not ns.order_by_time
    if ns.closed_loop is not None and ns.closed_loop < 1:
        raise SpecError("--closed-loop K needs K >= 1")
    t0 = time.perf_counter()
    tables = ns.csv or [PUBLISHED_RUNS_CSV, *sweep_tables()]
    loop_knobs = ([k.strip() for k in ns.loop_knobs.split(",") if k.strip()]
                  if ns.loop_knobs else None)
    stack_knobs = [k.strip() for k in ns.stack_knobs.split(",") if k.strip()]
    from planner.calibrate import knobs_for

    known = {k.name for k in knobs_for(load_gpu("H100"))}  # the H100 has every knob (fp8 too)
    unknown = sorted(set(stack_knobs + (loop_knobs or [])) - known)
    if unknown:
        raise SpecError(f"unknown profile knob(s) {', '.join(unknown)}; known: "
                        + ", ".join(sorted(known)))
    ns.stack_fit = ns.stack_fit or stack_knobs != list(STACK_KNOBS)
    rows, groups = evaluate(tables, ns.closed_loop, ns.stack_fit, loop_knobs, stack_knobs,
                            healthy=ns.healthy, healthy_intra=ns.healthy_intra)
    summary = summarize(rows)
    md = ["### ranking (stock profiles)", "", _markdown(_fmt(summary)), ""]
    print("\n== ranking quality, stock profiles ==")
    print(_fmt(summary).to_string(index=False))
    if ns.stack_fit and "stack_regret" in rows:
        fitted = rows[rows["stack_regret"].notna()]
        sf = summarize(fitted, "stack_")
        base = summarize(fitted)
        print(f"\n== the same {len(fitted)} groups: stock, then the stack's GEMM scale and layer "
              "overhead fitted on its other runs ==")
        print(_fmt(base).to_string(index=False))
        print(_fmt(sf).to_string(index=False))
        md += ["### stock vs the stack's efficiency from its other runs", "",
               _markdown(_fmt(base)), "", _markdown(_fmt(sf)), ""]
    per_group = rows[["group", "layouts", "refused", "predicted_oom", "pairs", "pairwise",
                      "spearman", "regret", "first", "best"]]
    if ns.groups:
        print("\n== per group ==")
        print(_fmt(per_group).to_string(index=False))
    md += ["### per group", "", _markdown(_fmt(per_group)), ""]
    if ns.closed_loop is not None and "loop_regret" in rows:
        looped = rows[rows["loop_regret"].notna()]
        ls = loop_summary(looped)
        print(f"\n== closed loop, K = {ns.closed_loop} ({len(looped)} groups of >= "
              f"{loop_min_layouts(ns.closed_loop)} layouts) ==")
        print(_fmt(ls).to_string(index=False))
        md += [f"### closed loop, K = {ns.closed_loop}", "", _markdown(_fmt(ls)), ""]
        loop_groups = looped[["group", "layouts", "pairwise", "loop_pairwise", "regret",
                              "loop_regret", "end_regret", "rest_error_before",
                              "rest_error_after", "cand_error_before", "cand_error_after"]]
        if ns.groups:
            print("\n== closed loop per group ==")
            print(_fmt(loop_groups).to_string(index=False))
        md += ["### closed loop per group", "", _markdown(_fmt(loop_groups)), ""]
        entries = [g.extra[STRUCT] for g in groups if STRUCT in g.extra]
        # held-out splits by model size: tau fitted on the other part only
        def small(e: dict[str, Any]) -> bool:  # nanotron 1.34B and BLOOM
            return "8.86B" not in e["group"]

        cov = structural_coverage(entries, {"on 8.86B from the rest": lambda e: not small(e),
                                            "on 1.34B+BLOOM from 8.86B": small})
        print("\n== the band after the refit on the layouts not run: share inside (target "
              "60-80%) ==")
        print(_fmt(cov).to_string(index=False))
        md += ["### band after the refit, layouts not run", "", _markdown(_fmt(cov)), ""]
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    if ns.markdown:
        from planner.io import write_text_atomic

        write_text_atomic(ns.markdown, "\n".join(md))
    if ns.rows:
        rows.to_csv(ns.rows, index=False)
    return 0


if __name__ == "__main__":
    run_script(main)

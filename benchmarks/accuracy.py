"""Accuracy of the cost model against the published measured runs (planner/data/published_runs.csv).

    python benchmarks/accuracy.py                      # tune on dgxc + bloom, report every source
    python benchmarks/accuracy.py --tune none          # the stock profiles as they are
    python benchmarks/accuracy.py --markdown out.md    # also write the tables as markdown
    python benchmarks/accuracy.py --stacks             # fit the software-stack presets, per stack
    python benchmarks/accuracy.py --stacks --write-stacks   # ... and write software_stacks/*.yaml
    python benchmarks/accuracy.py --few-shot 3         # calibrate on 3 small runs, predict the rest
    python benchmarks/accuracy.py --tune none --moe    # the MoE rows, reported apart

Every usable row of published_runs.csv is predicted: the knobs the row states are pinned, the
search chooses the ones it leaves empty (the fastest consistent layout; the published runs were
tuned). Rows are split by source_id, never one table across both sides: the profiles are fitted
(planner.calibrate) on the --tune sources and the error is reported on the others. A fit on one
GPU also serves its siblings with the same chip (A100 40GB from A100 80GB, B200 from GB200).

Printed per source: rows, median and p90 absolute step-time error, the signed median (bias),
out-of-memory agreement (OOM rows predicted not to fit; measured rows predicted to fit), and a
term diagnosis: log(measured / predicted) regressed on each time term's share of the step, so a
term off by a factor shows as exp(coefficient).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from planner.calibrate.fit import RUNS_PER_KNOB, calibrate
from planner.costmodel.memory import MEM_REL_ERROR
from planner.errors import InfeasibleError, PlannerError, run_script
from planner.layout import Layout
from planner.measured.runs import PUBLISHED_RUNS_CSV, MeasuredRun, load_table
from planner.plan import TIME_COLUMNS
from planner.progress import track
from planner.registry import builtin_gpus, load_gpu
from planner.specs import GpuProfile
from planner.specs.adjust import apply_values, knobs_for

# The stock profiles are set from the recent, flash-attention-era sources (NVIDIA's DGX Cloud
# benchmarks, llm-foundry's MPT table); BLOOM (2022 Megatron-DeepSpeed, no flash attention),
# Megatron-Bridge and DLPerf (V100) are the held-out check. docs/accuracy.md has both splits.
TUNE_SOURCES = ("dgxc_benchmarking", "llmfoundry_mpt_bench")
# Chip properties that should carry across sources: GEMM efficiency and fused attention
# efficiency. The GEMM size dependence, DP overlap, link latencies, HBM efficiency and per-step
# overhead stay at their sources' values: fitted on published tables they absorb each source's
# quirks (the size shift ran to its bound) and made the held-out error worse.
TUNE_KNOBS = ("gemm_scale", "attention_efficiency", "fused_attention_efficiency",
              "layer_overhead_us")
# Same chip, other memory or packaging: a fit of the first serves the second.
SIBLINGS = (("A100-SXM4-80GB", "A100-SXM4-40GB"), ("GB200", "B200"), ("H100-SXM", "H200"),
            ("V100-SXM2-16GB", "V100-SXM2-32GB"))


def _key(run: MeasuredRun, gpu: GpuProfile) -> tuple:
    return (run.model.model_dump_json(exclude={"name"}), run.cluster.num_nodes,
            run.cluster.gpus_per_node, run.job, tuple(sorted(run.pins.items())), gpu.name,
            id(gpu))


class Predictor:
    """Predicts runs on given profiles, caching the search per (model, cluster, job, pins)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, dict[str, Any] | None] = {}
        self.solves = 0

    def row(self, run: MeasuredRun, gpu: GpuProfile) -> dict[str, Any] | None:
        """The plan columns of the run's layout (pinned, else the search's best); None when no
        layout consistent with the pins fits."""
        key = _key(run, gpu)
        if key not in self._cache:
            self._cache[key] = self._predict(run, gpu)
        return self._cache[key]

    def _predict(self, run: MeasuredRun, gpu: GpuProfile) -> dict[str, Any] | None:
        from planner.costmodel import estimate_batch, layout_violations

        cluster = run.cluster.model_copy(update={"gpu": gpu})
        layout = run.layout
        if layout is not None:
            if layout_violations(run.model, cluster, run.job, layout):
                return None  # what estimate refuses is not predicted (tp across NVLink domains)
            cols = estimate_batch(run.model, cluster, run.job, [layout])
            out = {k: (v[0] if hasattr(v, "__len__") else v) for k, v in cols.items()}
            out["layout"] = layout
            return out
        from planner.search import search

        self.solves += 1
        try:
            # published runs used their framework's even split (the even rule encodes it)
            result = search(run.model, cluster, run.job, dict(run.pins), top_k=1,
                            even_stages=True)
        except InfeasibleError:
            return None
        if not result.indices and not result.ranked:
            return None
        # the knobs a row leaves open are those its team tuned for speed: the layout predicted
        # fastest stands in for them, not solve's first plan (the most robust of the tie)
        plan = result.fastest_plan()
        return {**plan.row(), "layout": plan.layout}


def attention_kernels(profile: GpuProfile) -> dict[str, tuple[str, ...]]:
    """The JobSpec.attention kernels whose time each attention rate of `profile` sets
    (costmodel.compute.layer_forward_times): attention_efficiency flash and triton (and cudnn
    where the profile has no fused rate), fused_attention_efficiency cudnn."""
    if profile.fused_attention_efficiency is None:
        return {"attention_efficiency": ("flash", "triton", "cudnn")}
    return {"attention_efficiency": ("flash", "triton"), "fused_attention_efficiency": ("cudnn",)}


def tuning_knobs(profile: GpuProfile, knobs: Sequence[str], n_runs: int,
                 kernels: dict[str, int] | None = None) -> list[str]:
    """The knobs a GPU with n_runs tuning runs fits: the first n_runs // RUNS_PER_KNOB (at least
    one) of `knobs` that the profile has (fp8_gemm_scale only where an fp8 curve is). The fused
    attention rate takes its slot even where the profile has none (there attention=cudnn runs at
    attention_efficiency, already in the list), as it did when every profile offered it: the
    fits stay those the committed profiles were made with. `kernels` (runs per JobSpec.attention,
    None: not checked): an attention rate keeps its slot but is fitted only where RUNS_PER_KNOB of
    the runs use a kernel it times; fewer (13 PaxML rows at seq 2048, attention 5-12% of their
    step) cannot tell it from the GEMM and layer terms, and it stays at its measured value."""
    own = {k.name for k in knobs_for(profile)}
    slots = [k for k in knobs if k in own or k == "fused_attention_efficiency"]
    out = [k for k in slots[: max(1, n_runs // RUNS_PER_KNOB)] if k in own]
    if kernels is not None:
        timed = attention_kernels(profile)
        out = [k for k in out if k not in timed
               or sum(kernels.get(a, 0) for a in timed[k]) >= RUNS_PER_KNOB]
    return out


def _kernel_counts(runs: Sequence[MeasuredRun]) -> dict[str, int]:
    """Runs per attention kernel (JobSpec.attention)."""
    return dict(Counter(run.job.attention for run in runs))


def _timed_by_gpu(runs: Sequence[MeasuredRun]) -> dict[str, list[MeasuredRun]]:
    """The runs with a measured step time, grouped by GPU profile name."""
    by_gpu: dict[str, list[MeasuredRun]] = {}
    for run in runs:
        if not run.oom and run.measured_step_time_s:
            by_gpu.setdefault(run.cluster.gpu.name, []).append(run)
    return by_gpu


def _searched_layouts(group: Sequence[MeasuredRun], stock: GpuProfile,
                      predictor: Predictor) -> list[Layout | None]:
    """Each run's layout as the search completes it on `stock` (None where it cannot)."""
    layouts: list[Layout | None] = []
    for run in group:
        try:
            pred = predictor.row(run, stock)
        except PlannerError:  # the search cannot express the row's layout (see docs)
            pred = None
        layouts.append(None if pred is None else pred["layout"])
    return layouts


def fitted_profiles(runs: Sequence[MeasuredRun], predictor: Predictor,
                    knobs: Sequence[str] = TUNE_KNOBS, log: Any = print,
                    ) -> tuple[dict[str, GpuProfile], dict[str, dict[str, float]]]:
    """Profiles fitted per GPU on the given (tuning) runs, and their siblings; and the fitted
    knob values per GPU. A fit starts from the measured values (unfitted_profiles), as the
    leave-one-source-out refit does, so its values are factors on the measured curves: a GEMM
    scale refitted on a committed fit would leave the FP8 curve, which follows it
    (specs.adjust.fp8_tied_values), where an earlier fit left it."""
    out: dict[str, GpuProfile] = {}
    values_of: dict[str, dict[str, float]] = {}
    base = unfitted_profiles()
    for name, group in track(list(_timed_by_gpu(runs).items()), "fitting a profile per GPU"):
        committed = group[0].cluster.gpu
        stock = base.get(name, committed)
        layouts = _searched_layouts(group, committed, predictor)
        t0 = time.perf_counter()
        names = tuning_knobs(stock, knobs, len(group), _kernel_counts(group))
        fit = calibrate(stock, [r.with_gpu(stock) for r in group], layouts=layouts, names=names,
                        cross_validate=False)
        log(f"fitted {name} on {len(fit.runs)} runs in {time.perf_counter() - t0:.1f}s: "
            + ", ".join(f"{k}={fit.values[k]:.4g}" for k in fit.fitted)
            + f"; in-sample median error {np.median(np.abs(fit.err_before)):.1%} -> "
            f"{np.median(np.abs(fit.err_after)):.1%}")
        out[name] = fit.profile
        values_of[name] = {k: fit.values[k] for k in fit.fitted}
    gpus = builtin_gpus()
    for big, small in SIBLINGS:
        fitted_name = next((n for n in values_of if n.startswith(big)), None)
        sibling = next((g for n, g in gpus.items() if n.startswith(small)), None)
        if fitted_name and sibling is not None and sibling.name not in out:
            # the chip's efficiencies carry over; latencies and HBM belong to the part/node
            out[sibling.name] = apply_values(base.get(sibling.name, sibling),
                                             values_of[fitted_name])
            log(f"{sibling.name}: efficiencies of the {fitted_name} fit")
    return out, values_of


PROFILE_DIR = Path(__file__).resolve().parent.parent / "hardware_profiles"
# The fields this benchmark may set in the stock YAMLs (the hardware engineer owns the rest).
WRITABLE = ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency",
            "fused_attention_efficiency", "dp_overlap", "step_overhead_s", "layer_overhead_us",
            "hbm_efficiency")
ORIGINAL = "; shape and original value: "


def _points_text(curve: Any) -> str:
    return "[" + ", ".join(f"[{x:.4g}, {y:.4g}]" for x, y in curve.points) + "]"


def write_stock_profile(path: Path, fitted: GpuProfile, values: dict[str, float],
                        note: str) -> None:
    """Set the fitted efficiency fields of one stock YAML in place (line edits: the file keeps
    its layout and comments), and prefix their `sources` entries with how they were fitted."""
    from planner.io import write_text_atomic

    lines = path.read_text().splitlines()
    touched = {"gemm_efficiency"} if any(k.startswith("gemm_") for k in values) else set()
    if fitted.fp8_gemm_efficiency and any(k in values for k in ("fp8_gemm_scale", "gemm_scale",
                                                                 "gemm_size_log2")):
        touched.add("fp8_gemm_efficiency")
    touched |= {k for k in values if k in WRITABLE}
    out: list[str] = []
    in_sources = False
    for i, line in enumerate(lines):
        key = line.split(":", 1)[0]
        if line.startswith("sources:"):
            in_sources = True
        elif not line.startswith(" "):
            in_sources = False
        if in_sources and line.startswith("  ") and key.strip() in touched:
            field, cite = line.split(":", 1)
            cite = cite.strip().strip('"').replace('"', "'")
            if cite.startswith("fitted by") and ORIGINAL in cite:  # an earlier fit: keep the origin
                cite = cite.split(ORIGINAL, 1)[1]
            out.append(f'{field}: "{note}{ORIGINAL}{cite}"')
            continue
        if not line.startswith(" ") and key in touched and key.endswith("_efficiency") and \
                line.rstrip().endswith(":") and i + 1 < len(lines):
            out.append(line)  # a curve: its points are on the next line
            continue
        if line.startswith("  points:") and out and out[-1].split(":", 1)[0] in touched:
            out.append(f"  points: {_points_text(getattr(fitted, out[-1].split(':', 1)[0]))}")
            continue
        if not line.startswith(" ") and key in touched and not line.rstrip().endswith(":"):
            out.append(f"{key}: {float(getattr(fitted, key)):.4g}")
            continue
        out.append(line)
    write_text_atomic(path, "\n".join(out) + "\n")


def software_factors(runs: Sequence[MeasuredRun], predictor: Predictor) -> pd.DataFrame:
    """Per source and GPU: the one GEMM scale that source's own runs imply (fitted in sample)
    and the error left after it, then with a host overhead per layer pass fitted as well: how
    much of a source's error is its software's efficiency, and how much is structure the cost
    model misses."""
    out = []
    for source in sorted({r.source_id for r in runs}):
        for gpu, timed in _timed_by_gpu([r for r in runs if r.source_id == source]).items():
            stock = timed[0].cluster.gpu
            layouts = _searched_layouts(timed, stock, predictor)
            fit = calibrate(stock, timed, layouts=layouts, names=["gemm_scale"],
                            cross_validate=False)
            two = calibrate(stock, timed, layouts=layouts,
                            names=["gemm_scale", "layer_overhead_us"], cross_validate=False)
            after, after2 = np.abs(fit.err_after), np.abs(two.err_after)
            out.append({"source": source, "gpu": gpu, "runs": len(fit.runs),
                        "gemm_scale": fit.values["gemm_scale"],
                        "median_before": float(np.median(np.abs(fit.err_before))),
                        "median_after": float(np.median(after)),
                        "p90_after": float(np.quantile(after, 0.9)),
                        "+overhead_us": two.values["layer_overhead_us"],
                        "median_after2": float(np.median(after2)),
                        "p90_after2": float(np.quantile(after2, 0.9))})
    return pd.DataFrame(out)


def predict_all(runs: Sequence[MeasuredRun], profiles: dict[str, GpuProfile],
                predictor: Predictor) -> pd.DataFrame:
    """One row per run: measured, predicted, fits, the time terms."""
    rows = []
    for run in track(runs, "predicting the published runs"):
        gpu = profiles.get(run.cluster.gpu.name, run.cluster.gpu)
        try:
            pred = predictor.row(run, gpu)
        except PlannerError as exc:
            rows.append({"run": run.run_id, "source": run.source_id, "gpu": run.cluster.gpu.name,
                         "oom": run.oom, "measured_s": run.measured_step_time_s, "fits": False,
                         "refused": True, "predicted_s": np.nan, "error": str(exc)})
            continue
        row: dict[str, Any] = {"run": run.run_id, "source": run.source_id,
                               "gpu": run.cluster.gpu.name, "oom": run.oom,
                               "measured_s": run.measured_step_time_s, "error": None}
        if pred is None:
            row.update(fits=False, refused=True, predicted_s=np.nan, layout="(nothing fits)")
        else:
            # refused: "does not fit" (beyond the memory band); "may not fit" is not a refusal
            peak, cap = float(pred["peak_mem_gb"]), float(pred["mem_capacity_gb"])
            row.update(fits=bool(pred["fits"]), predicted_s=float(pred["step_time_s"]),
                       layout=str(pred["layout"]), peak_mem_gb=peak,
                       refused=bool(peak * (1 - MEM_REL_ERROR) > cap))
            for col in TIME_COLUMNS:
                row[col] = float(pred.get(col, 0.0))
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["oom"] = frame["oom"].astype(bool)
    frame["fits"] = frame["fits"].astype(bool)
    frame["refused"] = frame["refused"].astype(bool)
    frame["measured_s"] = frame["measured_s"].astype(float)
    frame["rel_error"] = frame["predicted_s"] / frame["measured_s"] - 1
    return frame


def source_table(frame: pd.DataFrame, tuned: Sequence[str]) -> pd.DataFrame:
    """Per source and overall (untuned sources): errors and OOM agreement."""
    out = []
    groups = [(s, g) for s, g in frame.groupby("source", sort=True)]
    untuned = frame[~frame["source"].isin(tuned)]
    groups.append(("ALL untuned" if tuned else "ALL", untuned))
    if tuned:
        groups.append(("ALL tuned", frame[frame["source"].isin(tuned)]))
    for name, g in groups:
        timed = g[(~g["oom"]) & g["rel_error"].notna()]
        err = timed["rel_error"].abs()
        oom = g[g["oom"]]
        measured = g[~g["oom"]]
        out.append({
            "source": name + (" (tuned)" if name in tuned else ""),
            "rows": len(g),
            "timed": len(timed),
            "median_err": err.median() if len(err) else np.nan,
            "p90_err": err.quantile(0.9) if len(err) else np.nan,
            "bias": timed["rel_error"].median() if len(timed) else np.nan,
            "oom_predicted_oom": f"{int((~oom['fits']).sum())}/{len(oom)}",
            "measured_predicted_fit": f"{int(measured['fits'].sum())}/{len(measured)}",
            # rows that ran but are called out of memory beyond the band (target 0)
            "measured_refused": f"{int(measured['refused'].sum())}/{len(measured)}",
        })
    return pd.DataFrame(out)


def term_diagnosis(frame: pd.DataFrame) -> pd.DataFrame:
    """log(measured/predicted) ~ sum_k c_k * share_k over the timed rows: exp(c_k) is the factor
    by which term k would have to grow to explain the residuals (1 = unbiased)."""
    timed = frame[(~frame["oom"]) & frame["rel_error"].notna()].copy()
    if len(timed) < 3:
        return pd.DataFrame()
    cols = [c for c in TIME_COLUMNS if c in timed and timed[c].abs().sum() > 0]
    shares = timed[cols].div(timed["predicted_s"], axis=0).to_numpy()
    y = np.log(timed["measured_s"] / timed["predicted_s"]).to_numpy()
    coef, *_ = np.linalg.lstsq(shares, y, rcond=None)
    return pd.DataFrame({"term": cols, "mean_share": shares.mean(axis=0),
                         "factor_needed": np.exp(coef)})


def term_diagnosis_within(frame: pd.DataFrame, by: str = "source") -> pd.DataFrame:
    """term_diagnosis with one intercept per `by` group: log(measured/predicted) ~ a_g +
    sum_k c_k * share_k over the terms other than compute (the shares sum to 1, so compute is the
    reference). exp(a_g) is group g's own level (its software's efficiency: the compute term's
    factor there, `term` = g); 1 + c_k the factor term k needs relative to compute (a term off
    by f_k against a level F adds log(1 + (f_k / F - 1) share_k) ~ (f_k / F - 1) share_k, as
    term_split.py reads TP), read only from rows of one group that differ in share. A term
    concentrated in one source (the pipeline bubble: 85% of its share is BLOOM's) otherwise
    takes that source's bias as its own."""
    timed = frame[(~frame["oom"]) & frame["rel_error"].notna()].copy()
    cols = [c for c in TIME_COLUMNS if c in timed and c != "time_compute_s"
            and timed[c].abs().sum() > 0]
    groups = pd.get_dummies(timed[by]).astype(float)
    if len(timed) < len(cols) + groups.shape[1] + 1:
        return pd.DataFrame()
    shares = timed[cols].div(timed["predicted_s"], axis=0)
    x = pd.concat([groups, shares], axis=1).to_numpy()
    y = np.log(timed["measured_s"] / timed["predicted_s"]).to_numpy()
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    names = [f"{by} {g}" for g in groups.columns] + cols
    means = [float(groups[g].mean()) for g in groups.columns] + list(shares.mean(axis=0))
    n_groups = groups.shape[1]
    factors = np.concatenate([np.exp(coef[:n_groups]), 1.0 + coef[n_groups:]])
    return pd.DataFrame({"term": names, "mean_share": means, "factor_needed": factors})


def _fmt(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    for col in ("median_err", "p90_err"):
        t[col] = t[col].map(lambda x: "-" if pd.isna(x) else f"{100 * x:.1f}%")
    t["bias"] = t["bias"].map(lambda x: "-" if pd.isna(x) else f"{100 * x:+.1f}%")
    return t


# ---- software stacks: presets fitted per stack, split by source -------------------------------

STACK_DIR = Path(__file__).resolve().parent.parent / "software_stacks"


def _stack_pairs(runs: Sequence[MeasuredRun], predictor: Predictor,
                 ) -> dict[str, list[tuple[MeasuredRun, Layout]]]:
    """Timed runs with a layout (the row's own, else the search's on the stock profile), per
    stack preset name."""
    out: dict[str, list[tuple[MeasuredRun, Layout]]] = {}
    for group in _timed_by_gpu(runs).values():
        layouts = _searched_layouts(group, group[0].cluster.gpu, predictor)
        for run, layout in zip(group, layouts, strict=True):
            if layout is not None:
                out.setdefault(run.stack, []).append((run, layout))
    return dict(sorted(out.items()))


def _stats(err: np.ndarray) -> dict[str, float]:
    a = np.abs(err)
    return {"median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)), "n": int(len(a))}


def fit_stacks(runs: Sequence[MeasuredRun], predictor: Predictor, log: Any = print,
               ) -> tuple[pd.DataFrame, dict[str, Any], dict[tuple[str, str], Any]]:
    """Fit every stack's factors on all its runs; error out of the box (stock factors), in
    sample, and out of sample: on each source from a fit on the stack's other sources, or, for
    a stack with one source, on each model from a fit on the source's other models. Returns the
    per-(stack, source) table, the fitted presets by name, and the preset fitted without each
    (stack, source) (what the few-shot protocol starts from)."""
    from datetime import UTC, datetime

    from planner.calibrate.stackfit import fit_stack_by_class, predict_with
    from planner.stacks import ErrorStats, StackFactors, resolve_stack

    rows, fitted, without = [], {}, {}
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    for name, pairs in _stack_pairs(runs, predictor).items():
        t0 = time.perf_counter()
        preset = resolve_stack(name)
        stock = preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
        srs = [r for r, _ in pairs]
        lays = [lay for _, lay in pairs]
        meas = np.array([r.measured_step_time_s for r in srs])
        box = predict_with(stock, srs, lays) / meas - 1
        full = fit_stack_by_class(stock, srs, lays)
        ins = predict_with(full, srs, lays) / meas - 1
        sources = sorted({r.source_id for r in srs})
        oos = np.full(len(srs), np.nan)
        if len(sources) > 1:
            how = "each source predicted by a fit on the stack's other sources"
            folds = [(s, np.array([r.source_id == s for r in srs])) for s in sources]
        else:
            how = f"within {sources[0]}: each model predicted by a fit on the others"
            models = sorted({r.model.name for r in srs})
            folds = [(m, np.array([r.model.name == m for r in srs])) for m in models]
        for label, held in folds:
            train = ~held
            if train.sum() < 2:
                continue
            part = fit_stack_by_class(stock, [r for r, t in zip(srs, train, strict=True) if t],
                                      [x for x, t in zip(lays, train, strict=True) if t])
            idx = np.flatnonzero(held)
            oos[idx] = predict_with(part, [srs[i] for i in idx], [lays[i] for i in idx]) \
                / meas[idx] - 1
            if len(sources) > 1:
                without[(name, label)] = part
        has_oos = ~np.isnan(oos)
        prov = full.provenance.model_copy(update={
            "fitted_on": sources, "runs": len(srs),
            "gpus": sorted({r.cluster.gpu.name for r in srs}),
            "method": "benchmarks/accuracy.py --stacks: planner.calibrate.stackfit."
                      "fit_stack_by_class (soft-L1 least squares of log step time; GEMM scale "
                      "and layer-pass overhead per GPU class, stock on a class without runs; "
                      "one of the two where the runs cannot separate them, none where no fit "
                      "predicts held-out runs better than stock, stackfit.choose_knobs) on "
                      "planner/data/published_runs.csv",
            "in_sample": ErrorStats(**{k: round(v, 4) if isinstance(v, float) else v
                                       for k, v in _stats(ins).items()}),
            "out_of_sample": ErrorStats(**{k: round(v, 4) if isinstance(v, float) else v
                                           for k, v in _stats(oos[has_oos]).items()})
            if has_oos.any() else None,
            "out_of_sample_how": how if has_oos.any() else "",
            "date": date,
            "note": f"{full.provenance.note}; out of the box (stock factors) median "
                    f"{np.median(np.abs(box)):.1%}, p90 {np.quantile(np.abs(box), 0.9):.1%}",
        })
        fitted[name] = full.model_copy(update={"provenance": prov})
        log(f"{name}: {len(srs)} runs, " + "; ".join(
            f"{cls} gemm x{f.gemm_scale:.3f}, layer pass "
            + ("the profile's" if f.layer_overhead_us is None else f"{f.layer_overhead_us:.0f} us")
            for cls, f in (("transferable", full.factors), *full.gpu_factors.items()))
            + f" ({time.perf_counter() - t0:.0f}s)\n  {full.provenance.note}")
        for source in sources:
            m = np.array([r.source_id == source for r in srs])
            o = oos[m & has_oos]
            rows.append({
                "stack": name, "source": source, "timed": int(m.sum()),
                "box_median": np.median(np.abs(box[m])), "box_p90": np.quantile(np.abs(box[m]), .9),
                "named_in_median": np.median(np.abs(ins[m])),
                "named_in_p90": np.quantile(np.abs(ins[m]), 0.9),
                "named_oos_median": np.median(np.abs(o)) if len(o) else np.nan,
                "named_oos_p90": np.quantile(np.abs(o), 0.9) if len(o) else np.nan,
                "oos": "other sources" if len(sources) > 1 else "leave one model out",
                "gemm_scale": full.factors_for(srs[int(np.argmax(m))].cluster.gpu.name).gemm_scale,
                "layer_us": full.factors_for(srs[int(np.argmax(m))].cluster.gpu.name
                                             ).layer_overhead_us,
            })
    for name, preset in fitted.items():
        for source in preset.provenance.fitted_on:
            if (name, source) not in without:  # the stack's only source: no runs left, and
                # the product gives a preset without runs stock factors (planner.stacks)
                without[(name, source)] = preset.model_copy(
                    update={"factors": StackFactors(), "gpu_factors": {}})
    return pd.DataFrame(rows), fitted, without


def population_preset(preset: Any, fitted: Any, source: str) -> Any:
    """`preset` with the factors of the typical stack: the geometric-mean GEMM scale and the mean
    layer-pass overhead of the presets not fitted on `source` (empirical Bayes: what is known of
    a stack before any of its runs). Not what the product uses for a preset without runs (stock
    factors): kept to compare the two (unfitted_prior_table, sweep_prior_check)."""
    from planner.stacks import StackFactors

    # the fitted factors on own-curve GPUs (a preset keeps them per GPU class: stackfit)
    sets = [f for p in fitted if source not in p.provenance.fitted_on
            for f in p.fitted_factor_sets()]
    if not sets:
        return preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
    gemm = float(np.exp(np.mean([np.log(f.gemm_scale) for f in sets])))
    over = [f.layer_overhead_us for f in sets if f.layer_overhead_us is not None]
    return preset.model_copy(update={"gpu_factors": {}, "factors": StackFactors(
        gemm_scale=gemm, layer_overhead_us=float(np.mean(over)) if over else None)})


TRANSFER_MIN_RUNS = 8  # a GPU class needs this many timed runs of a stack to fit or be judged


def transfer_table(runs: Sequence[MeasuredRun], predictor: Predictor) -> pd.DataFrame:
    """Do a stack's factors travel across GPUs? For every stack with runs on two GPU classes
    (each with at least TRANSFER_MIN_RUNS), fit the factors on one class's runs
    (planner.calibrate.stackfit, relative to that GPU's own profile) and predict the other's:
    its error with the stock factors, with the factors carried from the other class, and with
    its own class's fit (in sample, the floor). Classes whose GEMM curve is borrowed from
    another chip are marked: a factor fitted there is kept on that class (gpu_factors)."""
    from planner.calibrate.stackfit import fit_stack_factors, predict_with
    from planner.published import gpu_class
    from planner.stacks import StackFactors, resolve_stack

    out = []
    for name, pairs in _stack_pairs(runs, predictor).items():
        by_class: dict[str, list[tuple[MeasuredRun, Layout]]] = {}
        for run, lay in pairs:
            by_class.setdefault(gpu_class(run.cluster.gpu.name) or run.cluster.gpu.name,
                                []).append((run, lay))
        by_class = {c: v for c, v in by_class.items() if len(v) >= TRANSFER_MIN_RUNS}
        if len(by_class) < 2:
            continue
        stock = resolve_stack(name).model_copy(update={"factors": StackFactors(),
                                                       "gpu_factors": {}})
        fits = {c: fit_stack_factors(stock, [r for r, _ in v], [x for _, x in v])
                for c, v in by_class.items()}
        for src, fit in fits.items():
            for dst, v in by_class.items():
                if dst == src:
                    continue
                rs, ls = [r for r, _ in v], [x for _, x in v]
                meas = np.array([r.measured_step_time_s for r in rs])
                box = predict_with(stock, rs, ls) / meas - 1
                moved = predict_with(fit, rs, ls) / meas - 1
                own = predict_with(fits[dst], rs, ls) / meas - 1
                borrowed = any(r.cluster.gpu.curve_is_borrowed for r, _ in by_class[src])
                out.append({
                    "stack": name, "fitted_on": src + (" (borrowed curve)" if borrowed else ""),
                    "runs_fit": len(by_class[src]), "predicted": dst, "runs": len(rs),
                    "gemm_x": fit.factors.gemm_scale, "layer_us": fit.factors.layer_overhead_us,
                    "stock_median": np.median(np.abs(box)), "stock_signed": np.median(box),
                    "moved_median": np.median(np.abs(moved)),
                    "moved_p90": np.quantile(np.abs(moved), 0.9),
                    "moved_signed": np.median(moved),
                    "own_median": np.median(np.abs(own)),
                    "own_gemm_x": fits[dst].factors.gemm_scale,
                })
    return pd.DataFrame(out)


def write_stack_presets(fitted: dict[str, Any]) -> None:
    """Write the fitted factors and provenance into software_stacks/NAME.yaml (the whole file is
    regenerated from the validated preset; its text lives in fields, not comments)."""
    import yaml

    from planner.io import write_text_atomic

    for name, preset in fitted.items():
        data = preset.model_dump(mode="json", exclude_none=True)
        data = {k: v for k, v in data.items() if v not in ({}, [], "")}
        data["match"] = {k: v for k, v in data["match"].items()
                         if not (k == "without_year" and v is True)}
        path = STACK_DIR / f"{name}.yaml"
        write_text_atomic(path, yaml.safe_dump(data, sort_keys=False, width=100,
                                               allow_unicode=True))
        print(f"wrote {path.name}")


# ---- the stack fits, saved for bands.py -----------------------------------------------------

def stack_fit_key() -> str:
    """sha256 of what fit_stacks' result depends on: the planner's code, the hardware profiles,
    model specs and data tables, and each stack preset without its fitted factors and provenance
    (fit_stacks starts every preset from stock factors, so writing the fitted ones, as
    --write-stacks does, leaves the key unchanged)."""
    import hashlib

    import yaml

    repo = STACK_DIR.parent
    h = hashlib.sha256()
    files = sorted([*repo.glob("planner/**/*.py"), *repo.glob("planner/data/**/*.csv"),
                    *repo.glob("planner/data/**/*.yaml"), *PROFILE_DIR.glob("*.yaml"),
                    *repo.glob("model_specs/*.yaml")])
    for path in files:
        h.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    for path in sorted(STACK_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        data = {k: v for k, v in data.items() if k not in ("factors", "gpu_factors", "provenance")}
        h.update(path.name.encode() + b"\0" + yaml.safe_dump(data, sort_keys=True).encode())
    return h.hexdigest()


def save_stack_fits(path: Path, fitted: dict[str, Any],
                    without: dict[tuple[str, str], Any]) -> None:
    """Write fit_stacks' presets (fitted on all runs, and without each (stack, source)) as JSON
    with stack_fit_key, so that bands.py --stack-fits reuses them instead of refitting (the
    fit is most of a 30-minute run)."""
    import json

    from planner.io import write_text_atomic

    data = {"key": stack_fit_key(),
            "fitted": {n: p.model_dump(mode="json") for n, p in fitted.items()},
            "without": [{"stack": n, "source": s, "preset": p.model_dump(mode="json")}
                        for (n, s), p in without.items()]}
    write_text_atomic(path, json.dumps(data))
    print(f"wrote {path} ({len(fitted)} presets, {len(without)} fitted without a source)")


def load_stack_fits(path: Path) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """The presets save_stack_fits wrote; a PlannerError (one line) when the file was written
    for other code or data (its key is not stack_fit_key())."""
    import json

    from planner.stacks import StackPreset

    try:
        data = json.loads(Path(path).read_text())
        key = data["key"]
        fitted = {n: StackPreset.model_validate(p) for n, p in data["fitted"].items()}
        without = {(w["stack"], w["source"]): StackPreset.model_validate(w["preset"])
                   for w in data["without"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlannerError(f"{path}: not a stack-fits file ({exc})") from None
    if key != stack_fit_key():
        raise PlannerError(f"{path}: fitted on other code or data than this checkout's "
                           "(refit: accuracy.py --stacks --save-stack-fits FILE)")
    return fitted, without


def few_shot(runs: Sequence[MeasuredRun], predictor: Predictor, k: int,
             without: dict[tuple[str, str], Any], fitted: dict[str, Any],
             log: Any = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The few-shot protocol: every (source, stack, GPU) group with at least k + 2 timed runs is
    calibrated (planner.calibrate.fewshot) on its k runs with the fewest GPUs, starting from the
    stack's preset fitted without that source (for a stack with one source: stock factors, as
    the product gives a preset without runs), with prior widths from the presets fitted
    without it; the other runs are predicted. Returns one row per predicted run and a summary
    per group."""
    from planner.calibrate.fewshot import FewShotPrior, few_shot_fit
    from planner.calibrate.stackfit import predict_with

    groups: dict[tuple[str, str, str], list[tuple[MeasuredRun, Layout]]] = {}
    for name, pairs in _stack_pairs(runs, predictor).items():
        for run, layout in pairs:
            groups.setdefault((run.source_id, name, run.cluster.gpu.name), []).append(
                (run, layout))
    per_run, summary = [], []
    for (source, name, gpu), pairs in sorted(groups.items()):
        if len(pairs) < k + 2:
            continue
        pairs = sorted(pairs, key=lambda p: (p[0].cluster.num_gpus, p[0].measured_step_time_s,
                                             p[0].run_id))
        cal, tgt = pairs[:k], pairs[k:]
        start = without[(name, source)]
        prior = FewShotPrior.from_presets(list(fitted.values()), exclude_sources=[source])
        fit = few_shot_fit(cal[0][0].cluster.gpu, [r for r, _ in cal],
                           layouts=[lay for _, lay in cal], stack=start, prior=prior,
                           cross_validate=False)
        truns, tlays = [r for r, _ in tgt], [lay for _, lay in tgt]
        meas = np.array([r.measured_step_time_s for r in truns])
        before = predict_with(start, truns, tlays) / meas - 1
        pred, sigma = fit.band(truns, tlays)
        after = pred / meas - 1
        inside = np.abs(np.log(meas / pred)) <= sigma
        # the band the plans carry after `solve --calibrate`: predicted x (1 -+ the profile's
        # step_time_rel_error), planner.data.bands.coverage's definition
        rel = float(fit.profile.step_time_rel_error)
        for i, run in enumerate(truns):
            per_run.append({"source": source, "stack": name, "gpu": gpu, "run": run.run_id,
                            "before": before[i], "after": after[i], "sigma": sigma[i],
                            "inside": bool(inside[i]), "profile_band": rel,
                            "inside_profile": bool(abs(meas[i] / pred[i] - 1) <= rel)})
        summary.append({
            "source": source, "stack": name, "gpu": gpu, "calibrated_gpus":
            "/".join(str(r.cluster.num_gpus) for r, _ in cal), "predicted": len(tgt),
            "before_median": np.median(np.abs(before)), "before_p90":
            np.quantile(np.abs(before), 0.9), "after_median": np.median(np.abs(after)),
            "after_p90": np.quantile(np.abs(after), 0.9), "band_median": np.median(sigma),
            "coverage": inside.mean(), "fitted": ",".join(fit.fitted) or "-",
        })
        log(f"{source}/{name}/{gpu}: fitted {', '.join(fit.fitted) or 'nothing'}; kept "
            + "; ".join(f"{kn}: {why}" for kn, why in list(fit.kept.items())[:2]))
    return pd.DataFrame(per_run), pd.DataFrame(summary)


def moe_report(runs: Sequence[MeasuredRun], predictor: Predictor) -> pd.DataFrame:
    """Step-time error of the MoE runs (model.is_moe), per source and model, five ways:
    out of the box (stock profiles, the stack's recipe, no factors); the stack named as fitted
    by --stacks on the dense runs (software_stacks/*.yaml: no MoE run in its fit, so every MoE
    row is out of sample); and refitted on MoE runs, each model predicted from a fit on the
    other MoE models; and each source predicted from a fit on the other sources' MoE rows
    (moe_src: fitted on some sources, checked on another); and the other sources from a fit on
    the largest MoE source alone (moe_big)."""
    from planner.calibrate.stackfit import fit_stack_factors, predict_with
    from planner.stacks import StackFactors, resolve_stack

    rows = []
    for name, pairs in _stack_pairs([r for r in runs if r.model.is_moe], predictor).items():
        srs = [r for r, _ in pairs]
        lays = [lay for _, lay in pairs]
        meas = np.array([r.measured_step_time_s for r in srs])
        preset = resolve_stack(name)
        stock = preset.model_copy(update={"factors": StackFactors(), "gpu_factors": {}})
        box = predict_with(stock, srs, lays) / meas - 1
        named = predict_with(preset, srs, lays) / meas - 1
        oos = {}
        for key, labels in (("moe_oos", np.array([r.model.name for r in srs])),
                            ("moe_src", np.array([r.source_id for r in srs]))):
            oos[key] = np.full(len(srs), np.nan)
            for label in sorted(set(labels)):
                held = labels == label
                if (~held).sum() < 2:
                    continue
                part = fit_stack_factors(
                    stock, [r for r, t in zip(srs, ~held, strict=True) if t],
                    [x for x, t in zip(lays, ~held, strict=True) if t])
                idx = np.flatnonzero(held)
                oos[key][idx] = predict_with(part, [srs[i] for i in idx],
                                             [lays[i] for i in idx]) / meas[idx] - 1
        # the largest MoE source alone fitted, the others checked (fit on one, report on others)
        sources = np.array([r.source_id for r in srs])
        big = max(sorted(set(sources)), key=lambda src: int((sources == src).sum()))
        oos["moe_big"] = np.full(len(srs), np.nan)
        if (sources == big).sum() >= 2 and (sources != big).any():
            part = fit_stack_factors(stock, [r for r, t in zip(srs, sources == big, strict=True)
                                             if t],
                                     [x for x, t in zip(lays, sources == big, strict=True) if t])
            idx = np.flatnonzero(sources != big)
            oos["moe_big"][idx] = predict_with(part, [srs[i] for i in idx],
                                               [lays[i] for i in idx]) / meas[idx] - 1
        for i, r in enumerate(srs):
            rows.append({"stack": name, "source": r.source_id, "model": r.model.name,
                         "gpu": r.cluster.gpu.name, "box": box[i], "named": named[i],
                         "moe_oos": oos["moe_oos"][i], "moe_src": oos["moe_src"][i],
                         "moe_big": oos["moe_big"][i]})
    return pd.DataFrame(rows)


def _moe_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Median / p90 |error| and signed median of each column of moe_report, per source and
    model and overall."""
    def stats(g: pd.DataFrame) -> dict[str, Any]:
        out: dict[str, Any] = {"timed": len(g)}
        for col, label in (("box", "out of the box"), ("named", "stack (dense fit)"),
                           ("moe_oos", "MoE fit, model out"),
                           ("moe_src", "MoE fit, source out"),
                           ("moe_big", "MoE fit on largest source")):
            a = g[col].dropna()
            out[label] = (f"{np.median(np.abs(a)):.1%} / {np.quantile(np.abs(a), 0.9):.1%} "
                          f"({np.median(a):+.0%})") if len(a) else "-"
        return out
    rows = [{"source": s, "model": m, **stats(g)}
            for (s, m), g in frame.groupby(["source", "model"], sort=True)]
    rows += [{"source": s, "model": "all", **stats(g)} for s, g in frame.groupby("source")]
    rows.append({"source": "all", "model": "all", **stats(frame)})
    return pd.DataFrame(rows)


# ---- leave one source out: the headline accuracy -----------------------------------------------

# The measured values the stock profiles' fitted fields started from (their `sources` entries,
# "shape and original value", docs/hardware.md 2.1): the top of the GEMM curve before the fit,
# the top of the FP8 curve (None: no FP8 curve) and the attention efficiencies. A
# leave-one-source-out refit starts from these, so that the left-out source's share of the
# committed fit is gone; siblings take their big part's revert.
ORIGINAL_VALUES: dict[str, tuple[float, float | None, dict[str, float]]] = {
    # Azure ND A100 v4 FP16 sweep 256.5 TFLOP/s at N=16384 / 312; FA2 179.5 / 312
    "A100-SXM4-80GB": (256.5 / 312, None,
                       {"attention_efficiency": 0.575, "layer_overhead_us": 0.0}),
    # FP8 sweep 1382.2 / FP8 MAMF 1402.6 x BF16 MAMF fraction 0.803; FP8 sweep 1382.2 / 1979;
    # FA2 327.9 / 989; FA3 0.75
    "H100-SXM": (1382.2 / 1402.6 * 0.803, 1382.2 / 1979,
                 {"attention_efficiency": 0.332, "fused_attention_efficiency": 0.75,
                  "layer_overhead_us": 0.0}),
    # FP8 sweep 2906.9 / FP8 MAMF 3615.6 x BF16 MAMF fraction 0.729; FP8 sweep 2906.9 / 5000
    # (one knob was fitted)
    "GB200-NVL72": (2906.9 / 3615.6 * 0.729, 2906.9 / 5000, {"layer_overhead_us": 0.0}),
}


def unfitted_profiles() -> dict[str, GpuProfile]:
    """The stock profiles with their fitted fields back at the measured values they started
    from (ORIGINAL_VALUES; siblings as their big part): what a fit without any source has."""
    gpus = {g.name: g for g in builtin_gpus().values()}
    out: dict[str, GpuProfile] = {}
    for big, (top, top8, values) in ORIGINAL_VALUES.items():
        ref = gpus.get(big)
        scale = top / ref.gemm_efficiency.points[-1][1] if ref else 1.0
        # the FP8 curve back at its own measured top (a fit moves it with gemm_scale)
        scale8 = top8 / ref.fp8_gemm_efficiency.points[-1][1] \
            if ref and top8 and ref.fp8_gemm_efficiency else 1.0
        parts = [ref] + [next((g for n, g in gpus.items() if n.startswith(small)), None)
                         for b, small in SIBLINGS if big.startswith(b)]
        for gpu in parts:
            if gpu is not None:
                vals = {"gemm_scale": scale, "fp8_gemm_scale": scale8,
                        **{k: v for k, v in values.items() if getattr(gpu, k, None) is not None}}
                out[gpu.name] = apply_values(gpu, vals)
    return out


def flat_baseline(run: MeasuredRun, share: float = 0.5) -> float:
    """Step time (s) of the flat model: the model FLOPs at `share` of the dense peak."""
    from planner.costmodel.compute import model_flops_per_step

    job = run.job
    flops = model_flops_per_step(run.model, job.seq_len, job.global_batch)
    return flops / (share * run.cluster.gpu.peak_flops(job.precision) * run.cluster.num_gpus)


def loso_profiles(pairs: Sequence[tuple[MeasuredRun, Layout]], tune: Sequence[str],
                  predictor: Predictor, knobs: Sequence[str] = TUNE_KNOBS,
                  stock_from: str = "tuned") -> dict[str, GpuProfile]:
    """The stock profiles refitted (from their measured values, unfitted_profiles) on the runs
    of the `tune` sources, siblings taking their chip's fit (leave_one_source_out's fold)."""
    base = unfitted_profiles()
    profiles = dict(base)
    tuning = _timed_by_gpu([r for r, _ in pairs if r.source_id in tune])
    for name, group in tuning.items():
        start = base.get(name, group[0].cluster.gpu)
        lays = _searched_layouts(group, group[0].cluster.gpu, predictor)
        names = tuning_knobs(start, knobs, len(group), _kernel_counts(group))
        fit = calibrate(start, [r.with_gpu(start) for r in group], layouts=lays,
                        names=names, cross_validate=False, per_source=stock_from == "all")
        profiles[name] = fit.profile
        for big, small in SIBLINGS:  # the chip's efficiencies serve a sibling without runs
            sib = next((n for n in base if n.startswith(small)), None)
            if name.startswith(big) and sib and not any(n.startswith(small) for n in tuning):
                profiles[sib] = apply_values(base[sib], fit.values)
    return profiles


def leave_one_source_out(runs: Sequence[MeasuredRun], predictor: Predictor,
                         knobs: Sequence[str] = TUNE_KNOBS, log: Any = print,
                         stock_from: str = "tuned",
                         only: Sequence[str] | None = None) -> pd.DataFrame:
    """The headline accuracy: each source predicted by a model that never saw it. For every
    source S: the stock profiles refitted (from their measured values, unfitted_profiles) on the
    tuning sources other than S, the stack presets refitted (fit_stack_by_class) on the other
    sources' runs of each stack on those profiles; then S's timed runs are predicted three
    ways: stock (the stack's recipe, stock factors), stack named (its preset without S: for a
    stack whose runs are all S's, a preset without runs, which the product gives stock factors,
    so named = stock; the typical stack's factors, population_preset, are kept in the
    `population` column of those rows), and the flat 50%-of-peak model. Layouts of rows that
    leave knobs open are the search's on the committed profiles (one search per row; the open
    knobs barely move with the fit).
    `stock_from`: "tuned" fits the stock on TUNE_SOURCES (less S); "all" on every other source,
    each source weighing alike (calibrate(per_source=True)): the middle of the software seen.
    `only`: leave out these sources only (default every one)."""
    from planner.calibrate.fit import predict_step_times
    from planner.calibrate.stackfit import fit_stack_by_class, predict_with
    from planner.stacks import StackFactors, resolve_stack

    pairs = [(r, lay) for v in _stack_pairs(runs, predictor).values() for r, lay in v]
    sources = sorted({r.source_id for r, _ in pairs})
    out = []
    for held in [s for s in sources if only is None or s in only]:
        t0 = time.perf_counter()
        pool = TUNE_SOURCES if stock_from == "tuned" else sources
        tune = [s for s in pool if s != held]
        profiles = loso_profiles(pairs, tune, predictor, knobs, stock_from)

        def on(run: MeasuredRun, profiles: dict[str, GpuProfile] = profiles) -> MeasuredRun:
            return run.with_gpu(profiles.get(run.cluster.gpu.name, run.cluster.gpu))

        presets = {}
        for stack in sorted({r.stack for r, _ in pairs}):
            mine = [(on(r), lay) for r, lay in pairs if r.stack == stack and r.source_id != held]
            stock = resolve_stack(stack).model_copy(update={"factors": StackFactors(),
                                                            "gpu_factors": {}})
            if len(mine) >= 2:
                presets[stack] = fit_stack_by_class(stock, [r for r, _ in mine],
                                                    [x for _, x in mine])
        target = [(on(r), lay) for r, lay in pairs if r.source_id == held]
        for stack in sorted({r.stack for r, _ in target}):
            rows = [(r, lay) for r, lay in target if r.stack == stack]
            rs, ls = [r for r, _ in rows], [x for _, x in rows]
            meas = np.array([r.measured_step_time_s for r in rs])
            preset = presets.get(stack)
            stock_pred = np.empty(len(rs))
            for i, (r, lay) in enumerate(rows):
                stock_pred[i] = predict_step_times(r.cluster.gpu, [r], [lay])[0]
            # no other source of this stack: its preset has no runs, and the product gives such a
            # preset stock factors (planner.stacks), so named = stock; the typical stack's factors
            # (population_preset, the prior centre) are kept beside it for comparison
            population = np.full(len(rs), np.nan)
            if preset is None:
                named = stock_pred
                population = predict_with(population_preset(
                    resolve_stack(stack), presets.values(), ""), rs, ls)
            else:
                named = predict_with(preset, rs, ls)
            flat = np.array([flat_baseline(r) for r in rs])
            for i, r in enumerate(rs):
                out.append({"source": held, "stack": stack, "gpu": r.cluster.gpu.name,
                            "run": r.run_id, "stock": stock_pred[i] / meas[i] - 1,
                            "named": named[i] / meas[i] - 1, "flat50": flat[i] / meas[i] - 1,
                            "population": population[i] / meas[i] - 1})
        log(f"left out {held}: profiles fitted on {', '.join(tune) or 'nothing'}; "
            f"{len(target)} runs predicted ({time.perf_counter() - t0:.0f}s)")
    return pd.DataFrame(out)


def unfitted_prior_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """The rows of stacks with a single source (left out, their preset has no runs): per source,
    median / p90 absolute and signed median error with stock factors (what the product gives a
    preset without runs, the `named` column there) and with the typical stack's factors
    (population_preset)."""
    one = per_run[per_run["population"].notna()] if "population" in per_run else per_run[:0]
    rows = []
    for key, g in [*one.groupby("source"), ("ALL", one)] if len(one) else []:
        row: dict[str, Any] = {"source": key, "runs": len(g)}
        for col in ("stock", "population"):
            row[f"{col}_median"] = g[col].abs().median()
            row[f"{col}_p90"] = g[col].abs().quantile(0.9)
            row[f"{col}_signed"] = g[col].median()
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_prior_check(healthy_intra_gbs: float | None = None) -> pd.DataFrame:
    """The same question on data no preset was fitted on: the nanotron sweep
    (planner/data/sweeps, the nanotron preset has no runs) predicted with stock factors and with
    the typical stack's (population_preset of the fitted presets), all runs and the runs whose
    logged intra-node all-reduce is in the high mode (ranking.LO_INTRA_GBS unless given).
    One row per (factors, runs): median / p90 absolute and signed median error."""
    from ranking import LO_INTRA_GBS, SWEEPS_DIR, load_all, logged_intra_busbw

    from planner.costmodel import estimate_many
    from planner.stacks import builtin_stacks, resolve_stack

    runs, _ = load_all([SWEEPS_DIR / "nanotron_sweep_dev.csv"])
    runs = [r for r in runs if r.measured_step_time_s and r.layout is not None]
    fitted = [p for p in builtin_stacks().values() if p.fitted]
    nano = resolve_stack("nanotron")
    meas = np.array([r.measured_step_time_s for r in runs])
    floor = LO_INTRA_GBS if healthy_intra_gbs is None else healthy_intra_gbs
    high = np.array([(logged_intra_busbw(r) or 0.0) >= floor for r in runs])
    rows = []
    for label, preset in (("stock", nano), ("population", population_preset(nano, fitted, ""))):
        pred = np.array([estimate_many(r.model, preset.cluster_for(r.cluster, r.job.precision),
                                       r.job, [r.layout])[0].step_time_s for r in runs])
        err = pred / meas - 1
        for which, m in (("all", np.ones(len(runs), bool)), ("high intra mode", high)):
            rows.append({"factors": label, "runs": which, "n": int(m.sum()),
                         "median": np.median(np.abs(err[m])),
                         "p90": np.quantile(np.abs(err[m]), 0.9), "signed": np.median(err[m])})
    return pd.DataFrame(rows)


def loso_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per source and overall: median / p90 absolute and signed median error of the stock
    prediction, the stack named, and the flat 50% model, on the same rows."""
    rows = []
    groups = [*per_run.groupby("source"), ("ALL", per_run)]
    for key, g in groups:
        row: dict[str, Any] = {"source": key, "runs": len(g)}
        for col in ("stock", "named", "flat50"):
            a = g[col].abs()
            row[f"{col}_median"] = a.median()
            row[f"{col}_p90"] = a.quantile(0.9)
            row[f"{col}_signed"] = g[col].median()
        rows.append(row)
    return pd.DataFrame(rows)


def _pct_table(frame: pd.DataFrame) -> pd.DataFrame:
    t = frame.copy()
    for col in t.columns:
        if any(w in col for w in ("median", "p90", "coverage", "signed")) \
                and t[col].dtype != object:
            t[col] = t[col].map(lambda x: "-" if pd.isna(x) else f"{100 * x:.1f}%")
    return t


def _overall(per_run: pd.DataFrame, by: str | None) -> pd.DataFrame:
    out = []
    groups = per_run.groupby(by) if by else [("all", per_run)]
    for key, g in groups:
        out.append({by or "group": key, "predicted": len(g),
                    "before_median": g["before"].abs().median(),
                    "before_p90": g["before"].abs().quantile(0.9),
                    "after_median": g["after"].abs().median(),
                    "after_p90": g["after"].abs().quantile(0.9),
                    "coverage": g["inside"].mean()})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=PUBLISHED_RUNS_CSV)
    parser.add_argument("--tune", default=",".join(TUNE_SOURCES),
                        help="comma-separated source_ids to fit on, or 'none'")
    parser.add_argument("--knobs", default=",".join(TUNE_KNOBS),
                        help="comma-separated profile parameters to fit (planner.calibrate names)")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument("--rows", type=Path, help="write every row's prediction as CSV")
    parser.add_argument("--software-factors", action="store_true",
                        help="also fit one GEMM scale per source and GPU (in sample) and print "
                        "the error left after it")
    parser.add_argument("--stacks", action="store_true",
                        help="fit the software-stack presets (GEMM scale, layer-pass overhead) "
                        "and print, per stack and source, the error out of the box, with the "
                        "stack named in and out of sample")
    parser.add_argument("--write-stacks", action="store_true",
                        help="with --stacks: write the fitted presets to software_stacks/")
    parser.add_argument("--save-stack-fits", type=Path, metavar="FILE",
                        help="with --stacks: also save the fitted presets (and those fitted "
                        "without each source) for bands.py --stack-fits")
    parser.add_argument("--few-shot", type=int, metavar="K",
                        help="calibrate each (source, stack, GPU) group on its K runs with the "
                        "fewest GPUs and predict the others (implies --stacks)")
    parser.add_argument("--moe", action="store_true",
                        help="report the MoE runs apart: out of the box, with the stack preset "
                        "fitted on dense runs, and refitted on MoE runs (one model held out)")
    parser.add_argument("--transfer", action="store_true",
                        help="fit each stack on one GPU class's runs and predict another's")
    parser.add_argument("--loso", action="store_true",
                        help="the headline: every source predicted by stock profiles and stack "
                        "presets refitted without it, beside a flat 50%%-of-peak model")
    parser.add_argument("--stock-from", choices=("tuned", "all"), default="tuned",
                        help="with --loso: fit the stock profiles on the tuning sources, or on "
                        "every other source with each source weighing alike")
    parser.add_argument("--write-profiles", action="store_true",
                        help="set the fitted efficiency fields in hardware_profiles/*.yaml")
    ns = parser.parse_args(argv)
    t0 = time.perf_counter()

    def resolve(name: str) -> GpuProfile:
        return load_gpu(name)

    runs, skipped = load_table(ns.csv, resolve_gpu=resolve)
    print(f"{len(runs)} usable rows, {len(skipped)} skipped", flush=True)
    # MoE rows are reported apart (--moe), never in the dense tables or fits
    moe_runs = [r for r in runs if r.model.is_moe]
    runs = [r for r in runs if not r.model.is_moe]
    if moe_runs:
        print(f"  {len(moe_runs)} MoE rows reported apart ({'below' if ns.moe else 'with --moe'})")
    reasons = pd.Series([s.reason for s in skipped]).value_counts()
    for reason, n in reasons.items():
        print(f"  skipped {n}: {reason}")
    tuned = [] if ns.tune == "none" else [s.strip() for s in ns.tune.split(",") if s.strip()]
    predictor = Predictor()
    stock = {g.name: g for g in builtin_gpus().values()}
    before = predict_all(runs, stock, predictor)
    print(f"stock predictions done ({time.perf_counter() - t0:.0f}s, {predictor.solves} searches)",
          flush=True)
    profiles = dict(stock)
    md: list[str] = []
    if tuned:
        knobs = [k.strip() for k in ns.knobs.split(",") if k.strip()]
        fitted, values = fitted_profiles([r for r in runs if r.source_id in tuned], predictor,
                                         knobs)
        profiles.update(fitted)
        if ns.write_profiles:
            note = (f"fitted by benchmarks/accuracy.py (planner calibrate) on "
                    f"{' + '.join(tuned)} of planner/data/published_runs.csv")
            for name, prof in fitted.items():
                path = PROFILE_DIR / f"{name}.yaml"
                vals = values.get(name) or next(
                    (v for big, small in SIBLINGS for n, v in values.items()
                     if n.startswith(big) and name.startswith(small)), {})
                if path.is_file() and vals:
                    write_stock_profile(path, prof, vals, note)
                    print(f"wrote {path.name}: " + ", ".join(sorted(vals)))
        md += ["### fitted values", ""] + [
            f"- {gpu}: " + ", ".join(f"{k} = {v:.4g}" for k, v in vals.items())
            for gpu, vals in values.items()] + [""]
    after = predict_all(runs, profiles, predictor) if tuned else before
    tables = {"stock profiles": source_table(before, tuned),
              f"fitted on {', '.join(tuned)}": source_table(after, tuned)} if tuned else \
        {"stock profiles": source_table(before, tuned)}
    for title, table in tables.items():
        print(f"\n== {title} ==")
        print(_fmt(table).to_string(index=False))
        md += [f"### {title}", "", _fmt(table).to_markdown(index=False) if _has_tabulate()
               else "```\n" + _fmt(table).to_string(index=False) + "\n```", ""]
    if ns.software_factors:
        factors = software_factors(runs, predictor)
        print("\n== one GEMM scale per source and GPU (in sample): the error it leaves ==")
        print(factors.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        md += ["### one GEMM scale per source and GPU (in sample)", "", "```",
               factors.to_string(index=False, float_format=lambda x: f"{x:.3f}"), "```", ""]
    if ns.moe:
        frame = moe_report(moe_runs, predictor)
        if len(frame):
            summary = _moe_summary(frame)
            title = ("MoE runs: median / p90 |step-time error| (signed median), each column "
                     "out of sample (moe_report)")
            print(f"\n== {title} ==")
            print(summary.to_string(index=False))
            md += [f"### {title}", "", "```", summary.to_string(index=False), "```", ""]
    if ns.stacks or ns.few_shot:
        # the presets are fitted on dense runs only: MoE runs stay out of sample (--moe)
        table, fitted, without = fit_stacks(runs, predictor)
        title = ("software stacks: out of the box (stock factors), stack named in sample, "
                 "stack named out of sample")
        print(f"\n== {title} ==")
        print(_pct_table(table).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        md += [f"### {title}", "", "```", _pct_table(table).to_string(
            index=False, float_format=lambda x: f"{x:.3g}"), "```", ""]
        if ns.write_stacks:
            write_stack_presets(fitted)
        if ns.save_stack_fits:
            save_stack_fits(ns.save_stack_fits, fitted, without)
        if ns.few_shot:
            per_run, summary = few_shot(runs, predictor, ns.few_shot, without, fitted)
            title = (f"few-shot K={ns.few_shot}: per group (before = the stack's preset fitted "
                     "without the source)")
            for t, frame in ((title, summary), ("few-shot per stack", _overall(per_run, "stack")),
                             ("few-shot per source", _overall(per_run, "source")),
                             ("few-shot, all groups", _overall(per_run, None))):
                print(f"\n== {t} ==")
                text = _pct_table(frame).to_string(index=False)
                print(text)
                md += [f"### {t}", "", "```", text, "```", ""]
    if ns.transfer:
        moved = transfer_table(runs, predictor)
        title = ("stack factors carried across GPU classes (fitted on one class's runs, "
                 "predicting another's)")
        text = _pct_table(moved).to_string(index=False, float_format=lambda x: f"{x:.3g}")
        print(f"\n== {title} ==\n{text}")
        md += [f"### {title}", "", "```", text, "```", ""]
    if ns.loso:
        per_run = leave_one_source_out(runs, predictor, stock_from=ns.stock_from)
        table = loso_table(per_run)
        title = ("leave one source out (headline): stock profiles and stack presets refitted "
                 "without the source; stock / stack named / flat 50% of peak, same rows")
        text = _pct_table(table).to_string(index=False)
        print(f"\n== {title} ==\n{text}")
        md += [f"### {title}", "", "```", text, "```", ""]
        one = unfitted_prior_table(per_run)
        sweep = sweep_prior_check()
        title = ("stacks with one source, left out: stock factors (the product's preset "
                 "without runs) / the typical stack's (population_preset)")
        text = (_pct_table(one).to_string(index=False) + "\nthe nanotron sweep (no preset "
                "fitted on it):\n" + _pct_table(sweep).to_string(index=False))
        print(f"\n== {title} ==\n{text}")
        md += [f"### {title}", "", "```", text, "```", ""]
        if ns.rows:
            per_run.to_csv(ns.rows.with_suffix(".loso.csv"), index=False)
    diag = term_diagnosis(after[~after["source"].isin(tuned)])
    if len(diag):
        print("\n== term diagnosis on untuned rows (factor each term needs) ==")
        print(diag.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        md += ["### term diagnosis (untuned rows)", "", "```",
               diag.to_string(index=False, float_format=lambda x: f"{x:.3f}"), "```", ""]
        within = term_diagnosis_within(after[~after["source"].isin(tuned)])
        title = ("term diagnosis within sources (one level per source; the terms' factors "
                 "relative to compute)")
        text = within.to_string(index=False, float_format=lambda x: f"{x:.3f}")
        print(f"\n== {title} ==\n{text}")
        md += [f"### {title}", "", "```", text, "```", ""]
    errors = after[after["error"].notna()]
    if len(errors):
        print(f"\n{len(errors)} rows could not be predicted, e.g. {errors.iloc[0]['error']}")
    print(f"\ntotal {time.perf_counter() - t0:.0f}s, {predictor.solves} searches")
    if ns.markdown:
        from planner.io import write_text_atomic

        write_text_atomic(ns.markdown, "\n".join(md))
    if ns.rows:
        after.to_csv(ns.rows, index=False)
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    run_script(main)

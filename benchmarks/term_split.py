"""The term diagnosis of benchmarks/accuracy.py split by source, GPU, stack, TP degree and
sequence parallelism: is a term's factor one thing everywhere, or one source?

    python benchmarks/accuracy.py --tune none --rows rows.csv
    python benchmarks/term_split.py rows.csv

Two views of each group of timed rows:
- pooled: accuracy.term_diagnosis (log(measured / predicted) regressed on every term's share);
  inside one group the shares are nearly collinear, so read it on large groups only;
- TP within: log(measured / predicted) = a_g + b x TP share, one intercept a_g per (source, GPU,
  model) group, so the TP factor 1 + b is read only from rows of one job that differ in TP
  share (a source's own compute bias, or a model's GEMM shapes, cannot pose as TP).

Then the robustness score's term weights (planner.search.bands.UNCERTAIN_TERM_WEIGHTS and the TP
weights by kind): each source read alone, log(measured / predicted) = a + sum_k b_k share_k over
the uncertain terms, TP split by kind (inside the scale-up domain without overlap, overlapped,
across domains); per term, the root mean square over the sources that identify it (OLS standard
error of 1 + b_k below 0.6) of b_k, also with each source left out, and the median |b_k|; the
weight is the RMS where all of these fall on one side of 1, else 1; Korthikanti 2022 Table 5
(tests/unit/test_costmodel_published.py) counts as one more source for TP inside the domain.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import term_diagnosis  # noqa: E402

from planner.measured.runs import PUBLISHED_RUNS_CSV, load_table  # noqa: E402
from planner.search.bands import TP_KIND_WEIGHTS, tp_kind  # noqa: E402


def annotate(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of accuracy.py --rows with stack, model, scale-up domain, TP overlap, TP degree,
    SP and TP share."""
    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    meta = pd.DataFrame([{"run": r.run_id, "stack": r.stack, "model": r.model.name or
                          f"h{r.model.hidden_size}", "domain_gpus": r.cluster.domain_gpus,
                          "tp_comm_overlap": bool(r.job.tp_comm_overlap)} for r in runs])
    out = rows.merge(meta, on="run", how="left")
    out = out[(~out["oom"].astype(bool)) & out["rel_error"].notna()].copy()
    out["tp"] = out["layout"].str.extract(r"tp(\d+)")[0].astype(int)
    out["sp"] = out["layout"].str.endswith("-sp")
    out["tp_share"] = out["time_tp_comm_s"] / out["predicted_s"]
    out["log_ratio"] = np.log(out["measured_s"] / out["predicted_s"])
    return out


def tp_within(frame: pd.DataFrame) -> float | None:
    """TP factor read within (source, GPU, model) groups (module docstring); None when no group
    has two TP shares."""
    keys = frame["source"] + "|" + frame["gpu"] + "|" + frame["model"].astype(str)
    varied = keys.map(frame.groupby(keys)["tp_share"].agg(lambda s: s.round(3).nunique() > 1))
    sub, keys = frame[varied], keys[varied]
    if sub.empty:
        return None
    x = pd.get_dummies(keys).astype(float)
    x["tp_share"] = sub["tp_share"]
    coef, *_ = np.linalg.lstsq(x.to_numpy(), sub["log_ratio"].to_numpy(), rcond=None)
    return float(1.0 + coef[-1])


def split(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One line per group: rows, median measured/predicted, mean TP share, pooled TP factor,
    TP factor within jobs."""
    out = []
    for key, g in frame.groupby(by, sort=True):
        diag = term_diagnosis(g) if len(g) >= 8 else pd.DataFrame()
        pooled = diag.set_index("term")["factor_needed"].get("time_tp_comm_s") if len(diag) \
            else None
        within = tp_within(g)
        names = key if isinstance(key, tuple) else (key,)
        out.append({**dict(zip(by, names, strict=True)), "rows": len(g),
                    "ratio_median": float(np.exp(g["log_ratio"].median())),
                    "tp_share": g["tp_share"].mean(),
                    "tp_factor_pooled": pooled, "tp_factor_within": within})
    return pd.DataFrame(out)


TERM_KINDS = ("tp_in_domain", "tp_overlapped", "tp_across_domains", "time_cp_comm_s",
              "time_ep_comm_s", "time_pp_comm_s", "time_pp_bubble_s", "time_dp_comm_exposed_s")
IDENTIFIED_SE = 0.6  # a source identifies a term when its factor is known to +-0.6 (1 sigma)


def with_tp_kinds(frame: pd.DataFrame) -> pd.DataFrame:
    """annotate()'s rows with the TP term split into its kinds (planner.search.bands.tp_kind):
    across scale-up domains, overlapped (the job's tp_comm_overlap, the table loader sets it
    from the row's recipe), else inside the domain."""
    out = frame.copy()
    kind = tp_kind(out["tp"], out["domain_gpus"], out["tp_comm_overlap"])
    tp = out["time_tp_comm_s"].fillna(0.0)
    for name in TP_KIND_WEIGHTS:
        out[name] = np.where(kind == name, tp, 0.0)
    return out


def source_factors(g: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """One source's rows: {term: (factor 1 + b, its OLS standard error)} of log(measured /
    predicted) = a + sum_k b_k share_k over the TERM_KINDS it has."""
    terms = [t for t in TERM_KINDS if t in g and g[t].abs().sum() > 0]
    x = np.column_stack([np.ones(len(g))] + [g[t] / g["predicted_s"] for t in terms])
    y = g["log_ratio"].to_numpy()
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    var = resid @ resid / max(1, len(y) - x.shape[1]) * np.linalg.pinv(x.T @ x)
    return {t: (1.0 + coef[i + 1], float(np.sqrt(var[i + 1, i + 1])))
            for i, t in enumerate(terms)}


def korthikanti_tp_factor() -> tuple[float, float]:
    """(TP factor, its standard error) of Korthikanti 2022 Table 5 (Megatron-LM on Selene, TP 8
    inside the node, no overlap): log(measured / predicted) = a + b x TP share over its 8 points,
    the predictions of tests/unit/test_costmodel_published.py."""
    root = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(root), str(root / "unit")]
    from test_costmodel_published import table5_estimates

    rows = pd.DataFrame([{"predicted_s": est.step_time_s, "tp_in_domain": est.time_tp_comm_s,
                          "log_ratio": np.log(measured / est.step_time_s)}
                         for measured, est in table5_estimates()])
    return source_factors(rows)["tp_in_domain"]


def error_weights(per_source: dict[str, dict[str, tuple[float, float]]]) -> pd.DataFrame:
    """Per term of TERM_KINDS, from each source's {term: (factor, standard error)}: the sources'
    factors, how many identify the term (standard error below IDENTIFIED_SE), the root mean
    square of factor - 1 over those (the term's 1-sigma error on a source not seen, bias
    included, the scale of the 1-sigma band the score starts from; 1 where fewer than two
    identify it), its range with one of them left out, the median |factor - 1| (0.67 sigma for a
    normal error), and the weight: the RMS where the data pin its side of 1 (the RMS, every
    one-left-out value and the median all below 1, or all above), else 1."""
    def weight(errs: dict[str, float]) -> float:
        return float(np.sqrt(np.mean(np.square(list(errs.values()))))) if len(errs) >= 2 else 1.0

    def pinned(w: float, left: list[float], median: float) -> bool:
        """The data pin the weight's side of 1: the RMS, every one-left-out RMS and the median
        |f - 1| all below 1, or all above."""
        values = [w, *left, median]
        return all(v < 1 for v in values) or all(v > 1 for v in values)

    out = []
    for term in TERM_KINDS:
        errors = {s: abs(fs[term][0] - 1.0) for s, fs in per_source.items()
                  if term in fs and fs[term][1] < IDENTIFIED_SE}
        left = [weight({k: v for k, v in errors.items() if k != s}) for s in errors]
        rms = weight(errors)
        median = float(np.median(list(errors.values()))) if errors else np.nan
        out.append({"term": term, "sources": "; ".join(
            f"{s.split('_')[0]} {fs[term][0]:.2f}+-{fs[term][1]:.2f}"
            for s, fs in per_source.items() if term in fs) or "-",
            "identified": len(errors), "rms": rms,
            "one_left_out": f"{min(left):.2f}-{max(left):.2f}" if left else "-",
            "median_error": median,
            "weight": rms if len(errors) >= 2 and pinned(rms, left, median) else 1.0})
    return pd.DataFrame(out)


def term_weights(frame: pd.DataFrame) -> pd.DataFrame:
    """error_weights of annotate()'s rows, each source read alone (source_factors), with
    Korthikanti 2022 Table 5 as one more source for TP inside the domain."""
    frame = with_tp_kinds(frame)
    per_source = {s: source_factors(g) for s, g in frame.groupby("source", sort=True)}
    per_source["korthikanti2022_table5"] = {"tp_in_domain": korthikanti_tp_factor()}
    return error_weights(per_source)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path, help="the CSV of benchmarks/accuracy.py --rows")
    ns = ap.parse_args(argv)
    frame = annotate(pd.read_csv(ns.rows))
    fmt = {"ratio_median": "{:.3f}".format, "tp_share": "{:.3f}".format,
           "tp_factor_pooled": lambda v: "-" if pd.isna(v) else f"{v:.2f}",
           "tp_factor_within": lambda v: "-" if pd.isna(v) else f"{v:.2f}"}
    pooled = term_diagnosis(frame).set_index("term")["factor_needed"]["time_tp_comm_s"]
    print(f"all {len(frame)} timed rows: TP factor within jobs {tp_within(frame):.2f}, "
          f"pooled {pooled:.2f}")
    for by in (["source"], ["source", "gpu"], ["stack"], ["gpu", "stack", "tp", "sp"]):
        print(f"\n== by {', '.join(by)} ==")
        print(split(frame, by).to_string(index=False, formatters=fmt))
    print("\n== term weights (planner.search.bands.UNCERTAIN_TERM_WEIGHTS, tp_term_weight) ==")
    print(term_weights(frame).to_string(index=False, float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()

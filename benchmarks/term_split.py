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


def annotate(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of accuracy.py --rows with stack, model, TP degree, SP and TP share."""
    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    meta = pd.DataFrame([{"run": r.run_id, "stack": r.stack, "model": r.model.name or
                          f"h{r.model.hidden_size}"} for r in runs])
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


if __name__ == "__main__":
    main()

"""Where the nanotron sweep's largest misses come from: a latency per TP collective that only
some allocations have (issue 19 section 1; docs/ranking.md "A latency per collective").

    python benchmarks/nanotron_floor.py            # the tables and the cross-model check
    python benchmarks/nanotron_floor.py --rows out.csv

Every run of planner/data/sweeps/nanotron_sweep_dev.csv logged, before training, the bus
bandwidth of ten 1 GiB all-reduces on its node's 8 GPUs (the notes' "intra-node AR"; nanotron
trainer.measure_bandwidth on the benchmark branch, huggingface/nanotron e3b886c: 256M fp32
elements, 10 calls, then synchronize and a barrier inside the timed window). That number is
bimodal: 439-462 GB/s ("hi") or 400-432 ("lo", and 11 runs below 400), nothing in between.
The lo runs' windows are longer by a fixed 3.0-3.5 ms whatever the collective (all-reduce,
all-gather and reduce-scatter alike, whose windows last 41 and 36 ms): a latency, not a
bandwidth loss.

The step times show the same split. On lo allocations a layer pass (forward and backward of one
micro-batch) takes at least about 12 / 17 / 27-31 / 55-62 ms at tp 2 / 4 / 8 / 16 whatever the width
(h 2048 and 4096 alike) and the micro-batch (1 to 8), with or without a pipeline; on hi
allocations the same layouts run at the model's prediction. nanotron issues 8 TP collectives
per layer pass in REDUCE_SCATTER mode (qkv_proj and gate_up_proj column-parallel: all-gather
forward, reduce-scatter backward; o_proj and down_proj row-parallel: the reverse;
models/llama.py, parallel/tensor_parallel/functional.py @ 0e0a27e), the embedding 2 and the LM
head with its sharded cross-entropy 5. A floor of COLLECTIVES x (c0 + s (tp - 1)) per micro-batch
on the slowest stage, taken as max(prediction, (m + pp - 1) x floor), is fitted on one model's lo
runs and checked on the other's (and on the hi runs, where it must not hold). Nothing here
enters the cost model: the floor belongs to the allocation, not to the layout or to nanotron.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import Predictor
from ranking import (
    LO_INTRA_GBS,
    SWEEPS_DIR,
    build_groups,
    frameworks_of,
    load_all,
    logged_intra_busbw,
)

from planner.costmodel import estimate_many
from planner.errors import run_script

SWEEP = SWEEPS_DIR / "nanotron_sweep_dev.csv"
WINDOW_BYTES = 256 * 2**20 * 4  # measure_bandwidth: 256M fp32 elements per call
WINDOW_CALLS = 10
NODE_GPUS = 8
# TP collectives per micro-batch in nanotron's REDUCE_SCATTER mode (module docstring)
PER_LAYER = 8
EMBEDDING = 2
HEAD = 5  # lm_head all-gather + reduce-scatter, sharded cross-entropy's 3 all-reduces
MAX_TP = 8  # the fit stays inside one node (tp 16+ adds the network)


def window_excess_ms(intra_gbs, best_gbs: float) -> np.ndarray:
    """Milliseconds the logged intra-node all-reduce window (WINDOW_CALLS calls of WINDOW_BYTES
    on NODE_GPUS ranks) lasted beyond the same window at `best_gbs`."""
    moved = WINDOW_CALLS * 2 * (NODE_GPUS - 1) / NODE_GPUS * WINDOW_BYTES / 1e9
    return 1e3 * (moved / np.asarray(intra_gbs, dtype=float) - moved / best_gbs)


def collectives_on_slowest_stage(stage_layers: tuple[int, ...], layers: int) -> int:
    """TP collectives per micro-batch on the stage issuing the most (the first holds the
    embedding, the last the head; pp 1 is one stage with both)."""
    stages = stage_layers or (layers,)
    last = len(stages) - 1
    return max(PER_LAYER * n + EMBEDDING * (i == 0) + HEAD * (i == last)
               for i, n in enumerate(stages))


def runs_table(path: Path = SWEEP) -> pd.DataFrame:
    """One row per measured layout: measured and predicted step, the allocation's mode."""
    runs, _ = load_all([path])
    rows = []
    for g in build_groups(runs, frameworks_of([path]), Predictor()):
        run0 = g.runs[0]
        for lay, est, meas, run in zip(g.layouts, estimate_many(run0.model, run0.cluster,
                                                                run0.job, g.layouts),
                                       g.measured, g.runs, strict=True):
            intra = logged_intra_busbw(run)
            rows.append(dict(
                run=run.run_id, model=f"h{run0.model.hidden_size}",
                gpus=run0.cluster.num_gpus, nodes=run0.cluster.num_nodes, tp=lay.tp, pp=lay.pp,
                dp=lay.dp, mbs=lay.mbs, slots=est.grad_accum + lay.pp - 1,
                collectives=collectives_on_slowest_stage(lay.stage_layers,
                                                         run0.model.num_hidden_layers),
                intra=intra, env="lo" if intra is not None and intra < LO_INTRA_GBS else "hi",
                measured=meas, predicted=est.step_time_s))
    return pd.DataFrame(rows)


def with_floor(t: pd.DataFrame, c0: float, s: float) -> pd.Series:
    """Predicted step (s) with the floor of c0 + s (tp - 1) seconds per TP collective."""
    floor = t["slots"] * t["collectives"] * (c0 + s * (t["tp"] - 1))
    return np.maximum(t["predicted"], floor)


def fit_floor(t: pd.DataFrame) -> tuple[float, float]:
    """(c0, s) in seconds minimizing the mean |log(measured / with_floor)| on `t` (a grid:
    c0 0-3 ms by 0.05, s 0-1 ms by 0.01)."""
    best = None
    for c0 in np.arange(0.0, 3.0001, 0.05) * 1e-3:
        for s in np.arange(0.0, 1.0001, 0.01) * 1e-3:
            err = float(np.mean(np.abs(np.log(t["measured"] / with_floor(t, c0, s)))))
            if best is None or err < best[0]:
                best = (err, c0, s)
    assert best is not None
    return best[1], best[2]


def errors(t: pd.DataFrame, predicted) -> str:
    r = np.log(t["measured"] / predicted)
    return (f"median |log| {np.median(np.abs(r)):.3f}, signed {np.median(r):+.3f}, "
            f"n = {len(t)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, help="write the per-run table here")
    ns = ap.parse_args(argv)
    t = runs_table()
    best = t["intra"].max()
    t["window_excess_ms"] = window_excess_ms(t["intra"], best)
    print(f"logged intra-node all-reduce: hi {int((t.env == 'hi').sum())} runs, lo "
          f"{int((t.env == 'lo').sum())}; window excess over the best ({best:.1f} GB/s), median "
          f"hi {t[t.env == 'hi'].window_excess_ms.median():.2f} ms, lo "
          f"{t[(t.env == 'lo') & (t.intra > 400)].window_excess_ms.median():.2f} ms")
    small = t[(t["nodes"] > 1) & (t["tp"] >= 2) & (t["mbs"] <= 2) & (t["intra"] > 400)].copy()
    small["pipe"] = np.where(small["pp"] > 1, "pp>1", "pp=1")
    small["ms_per_collective"] = 1e3 * small["measured"] / small["slots"] / small["collectives"]
    small["ratio"] = small["measured"] / small["predicted"]
    print("\nmicro-batch 1-2 on more than one node: measured ms per TP collective on the slowest "
          "stage, measured / predicted (medians)")
    print(small.groupby(["tp", "pipe", "env"]).agg(
        runs=("ratio", "size"), ms_per_collective=("ms_per_collective", "median"),
        measured_over_predicted=("ratio", "median")).round(2).to_string())
    lo = t[(t["nodes"] > 1) & (t["env"] == "lo") & t["tp"].between(2, MAX_TP)]
    hi = t[(t["nodes"] > 1) & (t["env"] == "hi") & t["tp"].between(2, MAX_TP)]
    models = sorted(lo["model"].unique())
    print(f"\nfloor c0 + s (tp - 1) per collective, fitted on one model's lo runs (tp 2-{MAX_TP}, "
          "more than one node), checked on the other's:")
    for fit_on in models:
        c0, s = fit_floor(lo[lo["model"] == fit_on])
        print(f"  fit on {fit_on}: c0 {c0 * 1e3:.2f} ms, s {s * 1e3:.2f} ms per ring step "
              f"(tp 8: {(c0 + 7 * s) * 1e3:.2f} ms per collective)")
        for name, part in [(m, lo[lo["model"] == m]) for m in models] + [("hi runs", hi)]:
            print(f"    {name:8s} model {errors(part, part['predicted'])}  ->  with the floor "
                  f"{errors(part, with_floor(part, c0, s))}")
    if ns.rows:
        t.to_csv(ns.rows, index=False)
    return 0


if __name__ == "__main__":
    run_script(main)

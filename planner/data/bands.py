"""Step-time band widths measured on held-out runs: two bands, one home each.

- the **absolute band** (`step_time_low_s/high_s`, GpuProfile.step_time_band): how far a stock
  prediction's step time may be from what the job measures, 1 sigma. Its width is the error on
  sources left out of every fit (benchmarks/accuracy.py leave_one_source_out), per cell of what
  the data supports: the software stack named (`--stack`, a preset fitted on other sources) or
  not, and the GPU's GEMM curve measured on that chip or borrowed from another
  (GpuProfile.gemm_curve_from, GpuProfile.curve_is_borrowed). Every source weighs alike
  (group_weights over sources): a user with software the fits never saw is one more source,
  and a pooled width would be set by the largest sources (dgxc, llm-foundry: 463 of 665 runs),
  whose errors are the smallest.
- the **ranking band** (`ranking_band`, GpuProfile.ranking_band): the error between layouts of
  one job, after the job's common offset (its software's efficiency, the same for every layout)
  is removed: each layout's log(measured / predicted) less its group's median, on the measured
  sweeps (planner/data/sweeps and the published groups of >= 3 layouts of one job), every group
  (job) weighing alike (group_weights). Two plans whose ranking bands overlap cannot be told
  apart (planner.search.ties).

Both widths are data: planner/data/step_time_bands.yaml, written with its provenance by
`python benchmarks/bands.py` (re-run it after any change of the cost model), beside the residuals
it was computed from (step_time_band_residuals.csv). The definitions below are the benchmark's
and the tests'.

A residual is the ratio measured / predicted step time. A plan's band is predicted x (1 -+ w), so
it holds a run when |ratio - 1| <= w. The width of a set of residuals is the 1-sigma quantile of
|ratio - 1| (68.27%), taken at its upper one-sided 84% (1-sigma) confidence bound (order
statistic k = ceil(n q + sqrt(n q (1 - q))), normal approximation to the binomial): as wide as what
was measured where the data is plentiful, wider where it is thin (18 runs: the 15th of 18).
numpy and yaml only (`solve` reads it).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

BANDS_YAML = Path(__file__).resolve().parent / "step_time_bands.yaml"
RESIDUALS_CSV = BANDS_YAML.with_name("step_time_band_residuals.csv")
ONE_SIGMA = 0.6827  # share of a normal distribution within 1 sigma of its centre
COVERAGE_TARGET = (0.60, 0.80)  # issue 19: what a 1-sigma band must hold of held-out truths

# cells of the absolute band: (stack named?, GEMM curve borrowed?)
CELLS = {(False, False): "stock", (False, True): "stock_borrowed_curve",
         (True, False): "stack", (True, True): "stack_borrowed_curve"}


def width(ratios: Any, weights: Any = None, q: float = ONE_SIGMA) -> float:
    """1-sigma band width (fraction) of residuals `ratios` (measured / predicted): the smallest
    |ratio - 1| whose cumulative share reaches q + sqrt(q (1 - q) / n), n the number of residuals
    (with `weights`, each residual's share is its weight and n = (sum w)^2 / sum w^2, Kish's
    effective size). Unweighted, that is the k-th smallest with k = ceil(n q + sqrt(n q (1 - q)))
    (module doc). nan for an empty set."""
    dev = np.abs(np.asarray(ratios, dtype=float) - 1.0)
    w = np.ones_like(dev) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(dev) & (w > 0)
    dev, w = dev[keep], w[keep]
    if len(dev) == 0:
        return float("nan")
    order = np.argsort(dev, kind="stable")
    dev, w = dev[order], w[order]
    n_eff = w.sum() ** 2 / (w ** 2).sum()
    share = min(1.0, q + math.sqrt(q * (1 - q) / n_eff))
    cum = np.cumsum(w) / w.sum()
    k = int(np.searchsorted(cum, share - 1e-12))  # first index whose cumulative share >= share
    return float(dev[min(k, len(dev) - 1)])


def group_weights(groups: Any) -> np.ndarray:
    """Weight 1 / (size of its group) for each member: every group (one job) counts once."""
    g = np.asarray(groups)
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    return 1.0 / counts[inv]


def coverage(ratios: Any, w: float | Any, weights: Any = None) -> float:
    """Share of residuals (measured / predicted) inside the band predicted x (1 -+ w); `w` one
    width or one per residual; `weights` as width's."""
    r = np.asarray(ratios, dtype=float)
    inside = np.abs(r - 1.0) <= np.asarray(w, dtype=float) + 1e-12
    return float(np.average(inside, weights=weights))


def within_group_ratios(ratios: Any, groups: Any) -> np.ndarray:
    """Residuals with each group's common offset removed: exp(log ratio - the group's median
    log ratio), one per input, in input order."""
    r = np.log(np.asarray(ratios, dtype=float))
    g = np.asarray(groups)
    out = np.empty_like(r)
    for key in dict.fromkeys(g.tolist()):
        m = g == key
        out[m] = r[m] - np.median(r[m])
    return np.exp(out)


@lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The band file (planner/data/step_time_bands.yaml) as a dict."""
    import yaml

    return yaml.safe_load(BANDS_YAML.read_text())


def cell(stack_named: bool, borrowed_curve: bool) -> str:
    """Name of the absolute band's cell."""
    return CELLS[(bool(stack_named), bool(borrowed_curve))]


def profile_cell(profile: Any) -> str:
    """The cell of a GPU profile: a stack named when the profile carries a stack's factors
    (StackPreset.apply records them in sources['software_stack']), a borrowed curve when its GEMM
    curve was measured on another chip (GpuProfile.curve_is_borrowed)."""
    named = "software_stack" in (profile.sources or {})
    return cell(named, profile.curve_is_borrowed)


def absolute_band(profile: Any) -> float:
    """Stock 1-sigma relative step-time band of an uncalibrated profile (fraction)."""
    return float(load()["absolute"][profile_cell(profile)]["width"])


def ranking_band() -> float:
    """Stock 1-sigma relative error between layouts of one job (fraction)."""
    return float(load()["ranking"]["width"])


# ---- the calibrated band of a layout unlike the calibration runs ---------------------------
# (the band itself, planner.specs.hardware.structural_band, is the cost model's; its tau is here)


def fit_structural_tau(log_residuals: Any, share_deltas: Any, floors: Any) -> np.ndarray:
    """Maximum-likelihood tau of structural_band: log(measured / predicted) of layouts not run
    ~ Normal(0, floor^2 + sum_t tau_t^2 d_t^2), d the layout's shares less its calibration
    runs' mean. Terms no layout moves (all d 0) get the largest tau fitted (no data: the widest
    the others support). Returns tau (terms), log units per unit of share."""
    from scipy.optimize import minimize

    r = np.asarray(log_residuals, dtype=float)
    d2 = np.asarray(share_deltas, dtype=float) ** 2
    f2 = np.asarray(floors, dtype=float) ** 2 * np.ones(len(r))
    seen = d2.max(axis=0) > 1e-8
    if not seen.any():
        return np.zeros(d2.shape[1])

    def nll(x: np.ndarray) -> float:
        var = f2 + d2[:, seen] @ np.exp(2 * x)
        return float(0.5 * np.sum(np.log(var) + r ** 2 / var))

    res = minimize(nll, np.zeros(int(seen.sum())), method="L-BFGS-B",
                   bounds=[(-10.0, 5.0)] * int(seen.sum()))
    tau = np.full(d2.shape[1], float(np.exp(res.x).max()))
    tau[seen] = np.exp(res.x)
    return tau


def structural_tau() -> dict[str, float] | None:
    """Time term -> tau of structural_band, as fitted on the replayed calibrations (the band
    file's calibrated.structural, benchmarks/bands.py --structural-only); None when absent."""
    entry = ((load().get("calibrated") or {}).get("structural") or {}).get("tau")
    return {k: float(v) for k, v in entry.items()} if entry else None

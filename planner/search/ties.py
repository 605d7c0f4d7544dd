"""Ties in the ranking: the layouts the model cannot tell from the fastest, and their order.

The fastest eligible layout (by the objective of planner.search.problem: step time, memory,
crossing groups) defines the tie: every eligible layout whose ranking band (the error between
layouts of one job, planner.search.bands.ranking_bounds) overlaps its band is tied with it. Tied
layouts are ranked first, by the robustness score (bands.robust_step_time: the ranking band's high
end plus the terms the model is least sure of, each times its error on published sources,
the tied rows costed again on the adverse fabric, bands.adverse_cluster; a plan within the
memory band of the capacity after those with headroom), then lower memory, then fewer groups
crossing nodes (robust_keys); the others follow in the objective's order. The CP-SAT search
(planner.search.search) and the exhaustive oracle (planner.search.exhaustive.exhaustive_ranking)
both rank through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.costmodel.memory import near_capacity
from planner.search.bands import (
    BAND_COLUMNS,
    UNCERTAIN_TERMS,
    adverse_cluster,
    overlaps_best,
    ranking_bounds,
    robust_step_time,
    tp_term_weight,
)
from planner.search.problem import OBJECTIVE_SUM_LIMIT, Space, evaluate, scale_time


def _band_columns(space: Space) -> dict[str, np.ndarray]:
    """The space's cost columns, with the profile's ranking band where the cost function has no
    band columns at all (bands.ranking_bounds reads them)."""
    cols = dict(space.columns)
    if "ranking_band" not in cols and "step_time_low_s" not in cols:
        cols["ranking_band"] = np.full(len(cols["step_time_s"]), space.cluster.gpu.ranking_band)
    return cols


def bands(space: Space) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) ranking band of every row, seconds (bands.ranking_bounds): step_time_s x
    (1 -+ ranking_band) from the cost columns, else the profile's ranking band (a cost function
    without band columns)."""
    return ranking_bounds(_band_columns(space))


def tie_group(space: Space, eligible: np.ndarray, best: int) -> np.ndarray:
    """Boolean mask: eligible rows whose band overlaps row `best`'s (best included)."""
    low, high = bands(space)
    return np.asarray(eligible, dtype=bool) & overlaps_best(low, high, best)


def join_cap(space: Space, eligible: np.ndarray, best: int | None = None) -> np.ndarray:
    """Per row, the largest step time (seconds) at which its band's low end still reaches the
    high end of row `best`'s band (default: the fastest eligible row's; inf when none is
    eligible), i.e. at which it would be tied with it. The band scales with the step time
    (step_time_s x (1 - ranking_band)), so the row's relative low end is applied."""
    low, high = bands(space)
    step = np.asarray(space.columns["step_time_s"], dtype=float)
    eligible = np.asarray(eligible, dtype=bool)
    if best is None:
        if not eligible.any():
            return np.full(len(step), np.inf)
        best = int(np.flatnonzero(eligible)[np.argmin(step[eligible])])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_low = np.where(step > 0, low / step, 1.0)
        return np.where(rel_low > 0, high[best] / rel_low, np.inf)


def may_join(space: Space, floor: np.ndarray, best: int, group: np.ndarray) -> np.ndarray:
    """Boolean mask: rows outside the tie `group` whose lower bound on the step time (`floor`,
    seconds: improve_splits' bound on a split it did not search; inf where the row's time is
    its best) is within join_cap of the fastest row `best`."""
    # inf (a row whose time is its best) stays inf and cannot join
    reach = np.asarray(floor, dtype=float) <= join_cap(space, group, best)
    return reach & ~np.asarray(group, dtype=bool)


def adverse_columns(space: Space, rows: np.ndarray, columns: dict[str, np.ndarray]
                    ) -> dict[str, np.ndarray] | None:
    """The band and uncertain-term columns of `columns` (the space's, _band_columns), the `rows`
    costed again on bands.adverse_cluster by the space's own cost function (the others keep
    their values); None when the adverse fabric changes nothing for this cluster."""
    rows = np.asarray(rows, dtype=bool)
    cluster = adverse_cluster(space.cluster)
    if cluster is space.cluster or not rows.any():
        return None
    idx = np.flatnonzero(rows)
    knobs = {k: np.asarray(v)[idx] for k, v in space.knobs.items()}
    worse = evaluate(space.model, cluster, space.job, knobs, space.batch_cost).columns
    out = {}
    for name in (*BAND_COLUMNS, *UNCERTAIN_TERMS):
        if name in columns:
            col = np.array(columns[name], dtype=float, copy=True)
            if name in worse:  # not the profile's ranking band _band_columns added
                col[idx] = np.asarray(worse[name], dtype=float)
            out[name] = col
    return out


def robust_keys(space: Space, rows: np.ndarray) -> np.ndarray:
    """Integer order key of each row (int64, lower first): first whether the peak is within the
    memory band of the usable capacity (memory.near_capacity: such a plan "may not fit", so it
    comes after every tied plan with headroom), then the robustness score in the space's time
    unit (coarsened by tens while the rows' sum could leave int64, as the space's own keys),
    then memory, then crossing groups; the same weights as Space.keys."""
    # from the ranking band's high end, the rows costed on the adverse fabric
    columns = _band_columns(space)
    weight = tp_term_weight(space.knobs["tp"], space.cluster.domain_gpus,
                            space.job.tp_comm_overlap)
    robust = robust_step_time(columns, adverse_columns(space, rows, columns), weight)
    wt, wm = space.objective_weights
    mem = np.minimum(space.mem_units, space.cap_units + 1)
    unit = space.time_unit_s
    rows = np.asarray(rows, dtype=bool)
    tight = near_capacity(space.columns["peak_mem_gb"], space.columns["mem_capacity_gb"])
    while True:
        units = scale_time(robust, unit)
        keys = units * wt + mem * wm + space.crossing
        if rows.any():  # tight rows after every row with headroom
            keys = keys + np.where(tight, int(keys[rows].max()) + 1, 0)
        if float(np.sum(keys[rows], dtype=float)) < OBJECTIVE_SUM_LIMIT:
            return keys
        unit *= 10


def unique_keys(space: Space, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`keys` made unique over `rows`: each row's position when the rows are sorted by key, then
    by lower cp (a layout costed exactly as its context-parallel twin, cp 2 with mbs 4 against
    dp 2 with mbs 2, is the simpler one to run without cp), then by their knob tuple; others
    after every row. Equal keys would otherwise leave the choice among them to the solver, and
    plan 1 could change with --top. The CP-SAT search and the exhaustive oracle both order by it."""
    rows = np.flatnonzero(np.asarray(rows, dtype=bool))
    cols = [np.asarray(space.knobs[k])[rows] for k in space.knobs]
    cp = np.asarray(space.knobs["cp"])[rows]
    order = rows[np.lexsort((*reversed(cols), cp, np.asarray(keys)[rows]))]
    out = np.full(len(keys), len(rows), dtype=np.int64)
    out[order] = np.arange(len(order), dtype=np.int64)
    return out


def merge(tied_order: Sequence[int], time_order: Sequence[int], tied: np.ndarray,
          top_k: int) -> list[int]:
    """The ranking: the tied rows in robustness order, then the other rows of `time_order`
    (the objective's order), at most top_k."""
    rest = [int(i) for i in time_order if not tied[int(i)]]
    return [int(i) for i in tied_order][:top_k] + rest[: max(0, top_k - len(tied_order))]

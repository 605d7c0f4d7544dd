"""How a layout a user already runs compares with the searched space (`solve --config`): its rank
among the layouts that fit, its distance from the best, and the smallest set of knob changes that
reaches the best's step time."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.layout import Layout
from planner.search.problem import KNOBS, Space, knob_code

# A layout "reaches the best" within this fraction of the best step time: finer than the cost
# model can tell apart (its held-out median error is several percent, README Accuracy), so the
# changes named are the few that matter, not a chase of the last 0.1%.
REACH_TOLERANCE = 0.01
# The knobs a user changes: dp follows from tp, pp and cp on a fixed cluster, so it is not counted.
CHANGE_KNOBS = tuple(k for k in KNOBS if k != "dp")


@dataclass
class Comparison:
    """The current layout against the space. step times in seconds; gap as a fraction of the
    best step time; changes as (knob, current value, new value)."""

    current: Layout
    current_step_time_s: float
    current_fits: bool
    rank: int | None  # 1-based among fitting layouts (None: it does not fit)
    fitting: int  # layouts that fit in the space
    best: Layout
    best_step_time_s: float
    changes: list[tuple[str, object, object]] = field(default_factory=list)
    target: Layout | None = None
    target_step_time_s: float | None = None
    one_change: tuple[str, object, object, float] | None = None  # best single change, its time

    @property
    def gap(self) -> float:
        return self.current_step_time_s / self.best_step_time_s - 1.0


def _value(space: Space, knob: str, i: int) -> object:
    layout = space.layout(i)
    return getattr(layout, knob)


def compare(space: Space, current: Layout, current_step_time_s: float,
            current_fits: bool) -> Comparison:
    """Rank `current` among the fitting rows of `space` (strictly faster rows ahead of it) and
    find the fewest knob changes that reach within REACH_TOLERANCE of the best (the fastest
    layout with memory headroom, as solve ranks: memory.near_capacity)."""
    from planner.costmodel.memory import near_capacity

    cols = space.columns
    fits = np.asarray(cols["fits"], dtype=bool)
    times = np.asarray(cols["step_time_s"], dtype=float)
    fitting = int(fits.sum())
    # the best and the targets are layouts with memory headroom, as solve ranks them first
    # (a peak within the memory band of the capacity "may not fit"); all fitting rows if none
    roomy = fits & ~near_capacity(cols["peak_mem_gb"], cols["mem_capacity_gb"])
    pool = roomy if roomy.any() else fits
    best_i = int(np.flatnonzero(pool)[np.argmin(times[pool])])
    best_time = float(times[best_i])
    rank = int((fits & (times < current_step_time_s)).sum()) + 1 if current_fits else None
    diff = np.zeros(len(times), dtype=int)
    for knob in CHANGE_KNOBS:
        column = np.asarray(space.knobs[knob])
        if knob == "etp":  # as a Layout holds it: 0 where expert-TP follows TP
            column = np.where(column == np.asarray(space.knobs["tp"]), 0, column)
        diff += column != knob_code(knob, getattr(current, knob))
    comparison = Comparison(current, current_step_time_s, current_fits, rank, fitting,
                            space.layout(best_i), best_time)
    reach = pool & (times <= best_time * (1 + REACH_TOLERANCE))
    if current_fits and current_step_time_s <= best_time * (1 + REACH_TOLERANCE):
        return comparison  # already there: no change needed
    candidates = np.flatnonzero(reach)
    fewest = int(diff[candidates].min())
    among = candidates[diff[candidates] == fewest]
    target = int(among[np.argmin(times[among])])
    comparison.target = space.layout(target)
    comparison.target_step_time_s = float(times[target])
    comparison.changes = [(k, getattr(current, k), getattr(comparison.target, k))
                          for k in CHANGE_KNOBS
                          if getattr(current, k) != getattr(comparison.target, k)]
    single = np.flatnonzero(pool & (diff == 1) & (times < current_step_time_s))
    if len(single):
        i = int(single[np.argmin(times[single])])
        layout = space.layout(i)
        knob = next(k for k in CHANGE_KNOBS if getattr(layout, k) != getattr(current, k))
        comparison.one_change = (knob, getattr(current, knob), getattr(layout, knob),
                                 float(times[i]))
    return comparison


def describe(c: Comparison) -> list[str]:
    """The comparison in a few lines."""
    lines = []
    if c.current_fits:
        lines.append(f"your layout {c.current}: {c.current_step_time_s:.3f} s per step, rank "
                     f"{c.rank} of {c.fitting} layouts that fit, {c.gap:+.1%} against the best "
                     f"({c.best}, {c.best_step_time_s:.3f} s)")
    else:
        lines.append(f"your layout {c.current} does not fit in memory; the best that fits is "
                     f"{c.best} ({c.best_step_time_s:.3f} s per step)")
    if not c.changes:
        if c.current_fits:
            lines.append(f"it is within {REACH_TOLERANCE:.0%} of the best: no change needed")
        return lines
    text = ", ".join(f"{k} {a} -> {b}" for k, a, b in c.changes)
    if c.target is not None and c.target.dp != c.current.dp:
        text += f" (dp {c.current.dp} -> {c.target.dp} follows)"
    lines.append(f"smallest change within {REACH_TOLERANCE:.0%} of the best "
                 f"({len(c.changes)} knob{'s' if len(c.changes) > 1 else ''}): {text} "
                 f"-> {c.target} at {c.target_step_time_s:.3f} s")
    if c.one_change and len(c.changes) > 1:
        k, a, b, t = c.one_change
        lines.append(f"best single change: {k} {a} -> {b} ({t:.3f} s, "
                     f"{t / c.current_step_time_s - 1:+.1%})")
    return lines

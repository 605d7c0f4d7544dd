"""`planner solve --config`: search the space and say where the config's own layout stands."""

from __future__ import annotations

import json
from typing import Any

from planner.layout import KNOBS, Layout, default_layout
from planner.search.compare import Comparison, compare
from planner.specs import ClusterSpec, JobSpec, ModelSpec


def current_layout(pins: dict[str, Any], num_gpus: int) -> Layout:
    """The config's layout; knobs it leaves out take `planner estimate`'s defaults (one home:
    planner.layout.default_layout)."""
    rest = {k: pins.get(k) for k in (*KNOBS, "etp") if k not in ("tp", "pp")}
    return default_layout(num_gpus, f"{num_gpus} GPUs", tp=pins.get("tp", 1),
                          pp=pins.get("pp", 1), **rest)


def compare_config(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   search_pins: dict[str, Any], current_pins: dict[str, Any],
                   top: int, stage_layers: tuple[int, ...] = ()) -> tuple[Any, Comparison]:
    """The search (SearchResult: its top plans, searching every knob not typed on the command
    line, and the size of the tie with the fastest) and the comparison of
    the config's layout, with its own layers per stage or virtual stage (`stage_layers`, the
    config's uneven split), with the whole space."""
    from dataclasses import replace

    from planner.costmodel import estimate
    from planner.search import search

    layout = current_layout(current_pins, cluster.num_gpus)
    if len(stage_layers) in (layout.pp, layout.pp * layout.vpp):
        layout = replace(layout, stage_layers=tuple(stage_layers))
    current = estimate(model, cluster, job, layout)
    result = search(model, cluster, job, search_pins, top_k=top)
    return result, compare(result.space, layout, current.step_time_s, current.fits)


def comparison_json(plans: list, comparison: Comparison) -> str:
    """{"plans": [...plan objects...], "config": {...where the config's layout stands...}}."""
    from planner.report import plan_rows

    c = comparison
    return json.dumps({
        "plans": plan_rows(plans),
        "config": {
            "layout": c.current.as_dict(), "step_time_s": c.current_step_time_s,
            "fits": c.current_fits, "rank": c.rank, "fitting_layouts": c.fitting,
            "best_step_time_s": c.best_step_time_s, "gap": c.gap,
            "changes": [{"knob": k, "from": a, "to": b} for k, a, b in c.changes],
            "target_step_time_s": c.target_step_time_s,
        },
    }, indent=2, default=str)

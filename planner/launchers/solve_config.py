"""`planner solve --config`: search the space and say where the config's own layout stands."""

from __future__ import annotations

import json
from typing import Any

from planner.launchers.compare import Comparison, compare
from planner.layout import Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec


def current_layout(pins: dict[str, Any], num_gpus: int) -> Layout:
    """The config's layout; knobs it leaves out take `planner estimate`'s defaults."""
    from planner.cli.estimate import DEFAULT_RECOMPUTE, DEFAULT_ZERO

    tp, pp, cp = pins.get("tp", 1), pins.get("pp", 1), pins.get("cp", 1)
    return Layout(
        tp=tp, pp=pp, cp=cp, dp=pins.get("dp", num_gpus // (tp * pp * cp)), ep=pins.get("ep", 1),
        vpp=pins.get("vpp", 1), mbs=pins.get("mbs", 1),
        zero=pins.get("zero", DEFAULT_ZERO), recompute=pins.get("recompute", DEFAULT_RECOMPUTE),
        sp=pins.get("sp", tp > 1),
    )


def compare_config(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   search_pins: dict[str, Any], current_pins: dict[str, Any],
                   top: int) -> tuple[list, Comparison]:
    """The top plans (searching every knob not typed on the command line) and the comparison of
    the config's layout with the whole space."""
    from planner.costmodel import estimate
    from planner.search import search

    layout = current_layout(current_pins, cluster.num_gpus)
    current = estimate(model, cluster, job, layout)
    result = search(model, cluster, job, search_pins, top_k=top)
    return result.plans(), compare(result.space, layout, current.step_time_s, current.fits)


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

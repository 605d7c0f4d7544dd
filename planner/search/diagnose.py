"""Why no plan: readable reasons when the search finds nothing (infeasibility is data).

- The pins admit no valid layout at all -> LayoutError (exit 2): which pinned value is not
  possible here, and the structural reasons (planner.costmodel.layout_violations).
- Layouts honour the pins but none fits -> InfeasibleError (exit 1) whose diagnosis says the
  smallest peak memory any of them reaches (and the layout), what dominates it, which pins bind
  (dropping them one at a time), and, when nothing fits even without pins, how many GPUs of this
  kind the model needs (the cluster grown node by node, binary search on doublings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from planner import limits
from planner.errors import InfeasibleError, LayoutError, PlannerError
from planner.layout import RECOMPUTE_LEVELS, Layout
from planner.search.problem import (
    BatchCost,
    Space,
    evaluate,
    expand_structures,
    knob_code,
    knob_domains,
)
from planner.specs import ClusterSpec

if TYPE_CHECKING:
    from planner.search.cpsat import SolverConfig

MEM_TERMS = (
    "mem_weights_gb",
    "mem_grads_gb",
    "mem_optimizer_gb",
    "mem_activations_gb",
    "mem_other_gb",
)
MAX_GROWTH_DOUBLINGS = 14  # look for a fitting cluster up to 2^14 times the given one


def _flag(knob: str, value: Any) -> str:
    if knob == "sp":
        return "--sp" if value else "--no-sp"
    return f"--{knob} {value}"


def _pins_text(pins: Mapping[str, Any]) -> str:
    return " ".join(_flag(k, v) for k, v in pins.items())


def _values_text(space: Space, knob: str) -> str:
    values = sorted(set(int(v) for v in space.knobs[knob]))
    if knob == "recompute":
        return ", ".join(RECOMPUTE_LEVELS[v] for v in values)
    if knob == "sp":
        return ", ".join("on" if v else "off" for v in values)
    return ", ".join(str(v) for v in values)


def _pinned_layout(space: Space, pins: Mapping[str, Any]) -> Layout:
    """The pins with the other degrees filled in (dp takes the GPUs left), for layout_violations."""
    degrees = {k: pins.get(k, 1) for k in ("tp", "pp", "cp")}
    dp = pins.get(
        "dp", max(1, space.cluster.num_gpus // (degrees["tp"] * degrees["pp"] * degrees["cp"]))
    )
    values = {
        "ep": 1,
        "vpp": 1,
        "mbs": 1,
        "zero": 0,
        "recompute": "none",
        "sp": False,
        **degrees,
        "dp": dp,
        **pins,
    }
    return Layout(**values)


def _about_pins(violation: str, pins: Mapping[str, Any]) -> bool:
    """Does a layout_violations line speak about the pinned knobs (not about the defaults that
    _pinned_layout filled in)? The product and batch lines only when their knobs are all pinned."""
    if violation.startswith("tp*pp*dp*cp"):
        return {"tp", "pp", "dp"} <= set(pins)
    if violation.startswith("global batch"):
        return {"mbs", "dp"} <= set(pins)
    return any(re.search(rf"\b{knob}\b", violation) for knob in pins)


def no_valid_layout(space: Space, pins: Mapping[str, Any]) -> PlannerError:
    """The error for pins that no structurally valid layout honours."""
    model, cluster = space.model, space.cluster
    where = f"{model.name} on {cluster.num_gpus} {cluster.gpu.name}"
    if not len(space):
        return InfeasibleError(
            f"no valid layout of {where} at global batch {space.job.global_batch}",
            [
                f"tp*pp*dp*cp must be {cluster.num_gpus} with tp <= {cluster.domain_gpus} "
                f"dividing the {model.num_attention_heads} heads, pp <= "
                f"{model.num_hidden_layers} layers and "
                f"dp dividing the global batch {space.job.global_batch}"
            ],
        )
    lines = []
    for knob, value in pins.items():
        if not (space.knobs[knob] == knob_code(knob, value)).any():
            lines.append(f"possible {knob} values here: {_values_text(space, knob)}")
            if knob == "tp" and int(value) > cluster.domain_gpus:
                lines.append(f"tp={value} exceeds the {cluster.domain_gpus}-GPU NVLink domain: "
                             "--tp-across-nodes searches it over the scale-out network")
    try:
        from planner.costmodel import layout_violations

        violations = layout_violations(model, cluster, space.job, _pinned_layout(space, pins))
    except (PlannerError, TypeError, ValueError):  # pins too partial to form a layout
        violations = []
    lines += [v for v in violations if _about_pins(v, pins)]
    if not lines:
        lines.append("each pin is possible alone, but not together with the others")
    return LayoutError(f"no valid layout of {where} has {_pins_text(pins)}: " + "; ".join(lines))


def _describe(space: Space, i: int) -> tuple[str, str]:
    """(layout and peak, breakdown with the dominant term) of row i."""
    cols = space.columns
    peak = float(cols["peak_mem_gb"][i])
    terms = {t: float(cols[t][i]) for t in MEM_TERMS if t in cols}
    head = f"{space.layout(i)} needs {peak:.1f} GiB"
    if not terms:
        return head, ""
    top = max(terms, key=terms.get)  # type: ignore[arg-type]
    parts = ", ".join(f"{t[4:-3]} {v:.1f}" for t, v in terms.items())
    return head, f"dominated by {top[4:-3]} ({terms[top]:.1f} of {peak:.1f} GiB: {parts})"


def _best_row(space: Space, mask: np.ndarray) -> int | None:
    rows = np.flatnonzero(mask & space.fits)
    return int(rows[np.argmin(space.keys[rows])]) if len(rows) else None


def _grown(cluster: ClusterSpec, nodes: int) -> ClusterSpec:
    return ClusterSpec(gpu=cluster.gpu, num_nodes=nodes, gpus_per_node=cluster.gpus_per_node)


def _fits_somewhere(
    space_like: Space,
    cluster: ClusterSpec,
    config: SolverConfig | None,
    batch_cost: BatchCost | None,
) -> bool:
    """Does any memory-lean layout (ZeRO-3 where possible, full recompute, sp, mbs 1, no
    interleaving) fit?"""
    from planner.search.cpsat import StructureModel

    model, job = space_like.model, space_like.job
    lean = {"mbs": 1, "recompute": "full"}
    domains = replace(knob_domains(model, cluster, job, lean), mbs=[1], vpp=[1])
    structures = StructureModel(model, cluster, job, domains, config).enumerate()
    if not structures:
        return False
    knobs = expand_structures(structures, lean, moe=model.is_moe)
    keep = (
        (knobs["recompute"] == 2)
        & (knobs["zero"] == np.where(knobs["dp"] * knobs["cp"] > 1, 3, 0))
        & (knobs["sp"] == (knobs["tp"] > 1))
    )
    knobs = {k: v[keep] for k, v in knobs.items()}
    return bool(evaluate(model, cluster, job, knobs, batch_cost).fits.any())


def gpus_needed(
    space: Space, config: SolverConfig | None = None, batch_cost: BatchCost | None = None
) -> int | None:
    """Smallest GPU count (whole nodes of this cluster's shape) on which some memory-lean layout
    fits, or None when none fits up to 2^MAX_GROWTH_DOUBLINGS times the cluster. Doubles the
    nodes until it fits, then bisects between the last two sizes (memory need shrinks with GPUs
    up to divisibility, so the answer is the smallest size found this way)."""
    cluster = space.cluster
    lo, hi = cluster.num_nodes, None
    max_nodes = limits.MAX_GPUS // cluster.gpus_per_node  # past it no cluster is accepted
    for _ in range(MAX_GROWTH_DOUBLINGS):
        nodes = lo * 2
        if nodes > max_nodes:
            break
        if _fits_somewhere(space, _grown(cluster, nodes), config, batch_cost):
            hi = nodes
            break
        lo = nodes
    if hi is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_somewhere(space, _grown(cluster, mid), config, batch_cost):
            hi = mid
        else:
            lo = mid
    return hi * cluster.gpus_per_node


def diagnose(
    space: Space,
    pins: Mapping[str, Any],
    config: SolverConfig | None = None,
    batch_cost: BatchCost | None = None,
) -> PlannerError:
    """The error to raise when no layout honours the pins and fits (module docstring)."""
    pinned = space.pin_mask(pins)
    if not pinned.any():
        return no_valid_layout(space, pins)
    model, cluster = space.model, space.cluster
    cap = float(np.asarray(space.columns["mem_capacity_gb"])[0])
    rows = np.flatnonzero(pinned)
    lean = int(rows[np.argmin(space.columns["peak_mem_gb"][rows])])
    head, dominant = _describe(space, lean)
    which = "layout with these pins" if pins else "layout"
    message = (
        f"no layout of {model.name} fits on {cluster.num_gpus} {cluster.gpu.name} "
        f"({cap:.1f} GiB usable per GPU)"
    )
    lines = [f"smallest peak memory of any {which}: {head}" + (f", {dominant}" if dominant else "")]
    from planner.costmodel.memory import MEM_REL_ERROR

    peak = float(space.columns["peak_mem_gb"][lean])
    if peak * (1 - MEM_REL_ERROR) <= cap:  # within the 1-sigma memory band: not a refusal
        lines.append(
            f"{space.layout(lean)} may not fit: {peak:.1f} GiB +- {MEM_REL_ERROR * peak:.1f} "
            f"(1 sigma) against {cap:.1f} usable; `planner estimate` answers for it and "
            "`planner validate` measures it")
    if pins:
        best = _best_row(space, np.ones(len(space), dtype=bool))
        if best is None:
            lines.append("the pins do not bind: nothing fits without them either")
        else:
            lines.append(f"the pins bind: without them the best plan is {space.layout(best)}")
            for knob in pins:
                rest = {k: v for k, v in pins.items() if k != knob}
                alone = _best_row(space, space.pin_mask(rest))
                if alone is not None:
                    lines.append(
                        f"dropping {_flag(knob, pins[knob])} alone gives {space.layout(alone)}"
                    )
            return InfeasibleError(message, lines)
    needed = gpus_needed(space, config, batch_cost)
    gpu = cluster.gpu.name
    if needed is None:
        lines.append(
            f"{model.name} does not fit even on "
            f"{min(cluster.num_gpus << MAX_GROWTH_DOUBLINGS, limits.MAX_GPUS)} "
            f"{gpu} at global batch {space.job.global_batch}"
        )
    else:
        lines.append(
            f"{model.name} needs at least {needed} {gpu} even with ZeRO-3 and full "
            f"recompute; {cluster.num_gpus} given"
        )
    return InfeasibleError(message, lines)

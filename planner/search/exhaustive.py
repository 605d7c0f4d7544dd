"""The exhaustive oracle: the same space and the same cost model as the CP-SAT search, enumerated
by plain loops and ranked by sorting. The tests hold CP-SAT to it (by objective value); it is also
a reference for anyone changing the search. No ortools here."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from planner.costmodel import checks
from planner.search.problem import (
    BatchCost,
    Space,
    etp_allowed,
    evaluate,
    expand_structures,
    knob_domains,
    normalize_pins,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec


def enumerate_structures(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: Mapping[str, Any],
    tp_across_nodes: bool = False,
) -> list[tuple[int, ...]]:
    """Every (tp, pp, dp, cp, ep, etp, vpp, mbs) of the domains that passes the structural rules,
    checked one by one (the CP-SAT StructureModel's constraints, written as loops)."""
    d = knob_domains(model, cluster, job, pins, tp_across_nodes)
    n, batch, layers = cluster.num_gpus, job.global_batch, model.num_hidden_layers
    dp_domain = set(d.dp)
    out = []
    for tp in d.tp:
        for cp in d.cp:
            for pp in d.pp:
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if dp not in dp_domain:
                    continue
                for ep, etp in itertools.product(d.ep, d.etp):
                    if not (etp_allowed(tp, etp, pins) if model.is_moe else etp == tp):
                        continue
                    if not checks.expert_fold_allowed(tp, cp, dp, ep, etp):
                        continue
                    for vpp in d.vpp:
                        if not checks.vpp_searchable(layers, pp, vpp, vpp == pins.get("vpp")):
                            continue
                        for mbs in d.mbs:
                            if batch % (mbs * dp):
                                continue
                            if not checks.interleave_batch_allowed(pp, vpp, batch // (mbs * dp)):
                                continue
                            out.append((tp, pp, dp, cp, ep, etp, vpp, mbs))
    return sorted(out)


def exhaustive_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    batch_cost: BatchCost | None = None,
    tp_across_nodes: bool = False,
) -> Space:
    """The space, enumerated by loops and evaluated by the cost model."""
    pins = normalize_pins(pins)
    structures = enumerate_structures(model, cluster, job, pins, tp_across_nodes)
    knobs = expand_structures(structures, pins, checks.offload_allowed(cluster), model.is_moe,
                              dict(job.layout_support))
    return evaluate(model, cluster, job, knobs, batch_cost)


def exhaustive_top_k(space: Space, pins: Mapping[str, Any], top_k: int) -> list[int]:
    """Row indices of the top_k plans that honour the pins and fit, best first (ties broken
    by the knob tuple, as the CP-SAT search orders its plans)."""
    pins = normalize_pins(pins)
    eligible = np.flatnonzero(space.pin_mask(pins) & space.fits)
    knob_rows = np.stack([space.knobs[k] for k in space.knobs], axis=1)
    order = sorted(eligible, key=lambda i: (int(space.keys[i]), tuple(knob_rows[i])))
    return [int(i) for i in order[:top_k]]


def exhaustive_ranking(space: Space, pins: Mapping[str, Any],
                       top_k: int) -> tuple[list[int], list[bool]]:
    """The final ranking with ties (planner.search.ties), by sorting: the rows tied with the
    fastest in robustness order (ties.unique_keys: then lower cp, then the knob tuple), then
    the others by objective value. Returns (row indices, tied flag per index); what
    planner.search.search returns."""
    from planner.search import ties

    pins = normalize_pins(pins)
    by_time = exhaustive_top_k(space, pins, top_k)
    if not by_time:
        return [], []
    eligible = space.pin_mask(pins) & space.fits
    group = ties.tie_group(space, eligible, by_time[0])
    keys = ties.unique_keys(space, ties.robust_keys(space, group), group)
    tied_order = sorted(np.flatnonzero(group), key=lambda i: int(keys[i]))
    indices = ties.merge(tied_order, by_time, group, top_k)
    return indices, [bool(group[i]) for i in indices]

"""Search: the best layouts of a model on a cluster for a job.

    solve(model, cluster, job, pins, top_k=10) -> list[Plan]     ranked, best step time first

One entry for every cluster: on a cluster of pools (specs.PooledCluster) search() places whole
stages on pools (planner.search.pools) and ranks the plans it finds with the same bands and ties.

The space and its rules: planner.search.problem. The CP-SAT models (structure enumeration, top-K
selection): planner.search.cpsat. The exhaustive oracle the tests hold CP-SAT to:
planner.search.exhaustive. Why nothing fits: planner.search.diagnose. Ranking: docs/ranking.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.costmodel import checks
from planner.errors import LayoutError
from planner.search.problem import (
    BatchCost,
    Space,
    evaluate,
    expand_structures,
    knob_domains,
    normalize_pins,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec, PooledCluster

if TYPE_CHECKING:
    from planner.layout import Layout
    from planner.plan import Plan
    from planner.search.cpsat import SolverConfig

__all__ = ["SearchResult", "build_space", "enumerate_layouts", "search", "solve"]


def enumerate_layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    config: SolverConfig | None = None,
    tp_across_nodes: bool = False,
) -> dict[str, Any]:
    """Knob columns of the space: CP-SAT enumerates the structures, the inner knobs are added.
    tp_across_nodes: tp may exceed the NVLink domain (over the scale-out network)."""
    from planner.search.cpsat import StructureModel

    pins = normalize_pins(pins)
    domains = knob_domains(model, cluster, job, pins, tp_across_nodes)
    structures = StructureModel(model, cluster, job, domains, config, pins).enumerate()
    return expand_structures(structures, pins, checks.offload_allowed(cluster), model.is_moe,
                             dict(job.layout_support))


def build_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    config: SolverConfig | None = None,
    batch_cost: BatchCost | None = None,
    tp_across_nodes: bool = False,
) -> Space:
    """The space of layouts evaluated by the cost model (estimate_batch by default)."""
    knobs = enumerate_layouts(model, cluster, job, pins, config, tp_across_nodes)
    return evaluate(model, cluster, job, knobs, batch_cost)


@dataclass
class SearchResult:
    """Ranked row indices into the evaluated space, and where the time went (seconds)."""

    space: Space | None  # None on a cluster of pools: `ranked` holds the plans
    indices: list[int]
    objectives: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    tied: list[bool] = field(default_factory=list)  # per index: tied with the fastest plan
    tied_total: int = 1  # eligible layouts of the whole space tied with the fastest (>= 1)
    tied_at_least: bool = False  # tied_total is a lower bound: layouts whose split was not
    # searched (they cannot reach the top K) might join the tie with a better one
    ranked: list[Plan] = field(default_factory=list)
    fastest: int | None = None  # row index of the smallest predicted step time (ties: knob tuple)

    def plans(self) -> list[Plan]:
        """Plans (layout + Estimate from the space's cost columns), ranked from 1."""
        if self.space is None:
            return list(self.ranked)
        tied = self.tied or [r == 0 for r in range(len(self.indices))]
        return [self._plan(i, r, bool(t))
                for r, (i, t) in enumerate(zip(self.indices, tied, strict=True), 1)]

    def fastest_plan(self) -> Plan:
        """The plan of the smallest predicted step time, whatever the tie order puts first (the
        stand-in for a recipe its team tuned for speed); its rank is its place in `plans()`,
        or len(indices) + 1 when the top-K leaves it out."""
        if self.space is None:
            return min(self.ranked, key=lambda p: p.estimate.step_time_s)
        i = self.indices[0] if self.fastest is None else self.fastest
        rank = self.indices.index(i) + 1 if i in self.indices else len(self.indices) + 1
        return self._plan(i, rank, True)

    def _plan(self, i: int, rank: int, tied: bool) -> Plan:
        from planner.costmodel import Estimate
        from planner.plan import Plan

        layout = with_stage_layers(self.space.layout(i), self.space.model.num_hidden_layers)
        return Plan(layout, Estimate.from_batch(self.space.columns, i), rank=rank,
                    tied_with_best=tied)


def with_stage_layers(layout: Layout, num_layers: int) -> Layout:
    """The layout with its layers per stage written out (the even rule's where it has none;
    layers per virtual stage stay as they are: Space.layout writes them where only a layout
    string states the chunks)."""
    from dataclasses import replace

    from planner.costmodel.pipeline import stage_counts

    if layout.virtual_split:
        return layout
    counts = stage_counts(num_layers, layout.pp, layout.vpp, layout.stage_layers)
    return replace(layout, stage_layers=tuple(counts))


def search(
    model: ModelSpec,
    cluster: ClusterSpec | PooledCluster,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    top_k: int = 10,
    config: SolverConfig | None = None,
    batch_cost: BatchCost | None = None,
    stage_layers: Sequence[int] | None = None,
    even_stages: bool = False,
    tp_across_nodes: bool = False,
) -> SearchResult:
    """Space + CP-SAT top-K selection; raises InfeasibleError / LayoutError (diagnosed) when no
    layout honours the pins and fits. Layers per pipeline stage: `stage_layers` pins them (and
    pp), `even_stages` keeps the even rule; otherwise the split is searched per layout
    (planner.search.stages) with the default cost model. tp_across_nodes: search tp beyond the
    NVLink domain."""
    from planner.search.cpsat import SelectionModel

    if top_k < 1:
        from planner.errors import SpecError

        raise SpecError(f"--top must be at least 1, got {top_k}")
    if isinstance(cluster, PooledCluster):  # stages placed on pools (planner.search.pools)
        from planner.search.pools import search_pooled

        if batch_cost is not None or tp_across_nodes:
            raise LayoutError("a cluster of pools is searched with the stock cost model and tp "
                              "inside each pool's NVLink domain")
        plans = search_pooled(model, cluster, job, normalize_pins(pins), top_k, config,
                              stage_layers=stage_layers, even_stages=even_stages)
        tied = [p.tied_with_best for p in plans]
        # the pools' search keeps its top plans: a tie that fills them may go on
        return SearchResult(None, [], [], {}, tied, max(1, sum(tied)),
                            tied_at_least=sum(tied) == len(plans) > 1, ranked=plans)
    pins = normalize_pins(pins)
    if stage_layers:
        pins = _pin_split(model, pins, stage_layers)
    t0 = time.perf_counter()
    # a split per virtual stage (Megatron's pipeline layout) pins pp and vpp (_pin_split): the
    # enumeration admits any pinned pair (checks.vpp_searchable) and keeps Megatron's
    # grad_accum % pp rule
    knobs = enumerate_layouts(model, cluster, job, pins, config, tp_across_nodes)
    if stage_layers:
        knobs["stage_layers"] = np.empty(len(knobs["tp"]), dtype=object)
        knobs["stage_layers"][:] = [tuple(stage_layers)] * len(knobs["tp"])
    t1 = time.perf_counter()
    space = evaluate(model, cluster, job, knobs, batch_cost)
    t2 = time.perf_counter()
    timings = {"structure_s": t1 - t0, "cost_model_s": t2 - t1}
    floor = None
    if not stage_layers and not even_stages and batch_cost is None:
        from planner.search.stages import improve_splits

        space, solved, floor = improve_splits(space, pins, top_k, config)
        timings["stage_split_s"] = time.perf_counter() - t2
        timings["stage_splits_solved"] = solved
    t3 = time.perf_counter()
    selection = SelectionModel(space, pins, top_k, config).solve()
    timings["selection_s"] = time.perf_counter() - t3
    if not selection.indices:
        from planner.search.diagnose import diagnose

        raise diagnose(space, pins, config=config, batch_cost=batch_cost)
    t4 = time.perf_counter()
    indices, tied, tied_total, at_least = _rank_ties(space, pins, top_k, selection.indices,
                                                     config, floor)
    timings["ties_s"] = time.perf_counter() - t4
    objectives = [int(space.keys[i]) for i in indices]
    return SearchResult(space, indices, objectives, timings, tied, tied_total, at_least,
                        fastest=selection.indices[0])


def _rank_ties(space: Space, pins: Mapping[str, Any], top_k: int, by_time: list[int],
               config: SolverConfig | None, floor: np.ndarray | None = None
               ) -> tuple[list[int], list[bool], int, bool]:
    """The final ranking (planner.search.ties): the layouts tied with the fastest, chosen and
    ordered by a second CP-SAT selection on the robustness keys, then the rest by the objective.
    Returns (indices, tied flag per index, size of the whole tie, whether that size is a lower
    bound: `floor`, improve_splits' bound on the rows it left unsolved, lets one join)."""
    from planner.search import ties
    from planner.search.cpsat import SelectionModel

    eligible = space.pin_mask(pins) & space.fits
    group = ties.tie_group(space, eligible, by_time[0])
    total = int(group.sum())
    at_least = floor is not None and bool(ties.may_join(space, floor, by_time[0], group).any())
    if total > 1:
        keys = ties.unique_keys(space, ties.robust_keys(space, group), group)
        robust = SelectionModel(space, pins, top_k, config, keys=keys, allowed=group).solve()
        indices = ties.merge(robust.indices, by_time, group, top_k)
    else:
        indices = list(by_time)
    return indices, [bool(group[i]) for i in indices], total, at_least


def _pin_split(model: ModelSpec, pins: dict[str, Any], counts: Sequence[int]) -> dict[str, Any]:
    """Pins implied by --stage-layers: pp = the number of stages (or --pp, the counts then one
    per virtual stage: vpp = counts / pp, Megatron's pipeline layout), and vpp 1 for an uneven
    split of one count per stage; SpecError when they contradict the split."""
    from planner.costmodel.checks import stage_layers_violations
    from planner.errors import SpecError
    from planner.layout import Layout, implied_vpp

    pp = pins.get("pp", len(counts))
    try:
        vpp = implied_vpp(len(counts), pp, pins.get("vpp"))
    except LayoutError as e:
        raise SpecError(str(e)) from None
    layout = Layout(pp=pp, vpp=vpp, stage_layers=tuple(counts))
    problems = stage_layers_violations(model.num_hidden_layers, layout)
    if problems:
        raise SpecError(problems[0])
    out = dict(pins, pp=pp)
    if layout.virtual_split:
        out["vpp"] = vpp
    elif not layout.even_split:
        out.setdefault("vpp", 1)
    return out


def solve(
    model: ModelSpec,
    cluster: ClusterSpec | PooledCluster,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    top_k: int = 10,
    config: SolverConfig | None = None,
    stage_layers: Sequence[int] | None = None,
    even_stages: bool = False,
    tp_across_nodes: bool = False,
) -> list[Plan]:
    """The top_k plans that fit, best first: the layouts tied with the fastest (bands overlap)
    by robustness, then the rest by step time (ties: lower memory, then fewer groups crossing
    nodes; planner.search.ties). Raises InfeasibleError (exit 1) with a diagnosis when none
    fits, LayoutError (exit 2) when the pins admit no valid layout at all. tp_across_nodes:
    search tp beyond the NVLink domain (over the scale-out network)."""
    return search(model, cluster, job, pins, top_k, config, stage_layers=stage_layers,
                  even_stages=even_stages, tp_across_nodes=tp_across_nodes).plans()

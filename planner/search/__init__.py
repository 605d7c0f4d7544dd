"""Search: the best layouts of a model on a cluster for a job.

    solve(model, cluster, job, pins, top_k=10) -> list[Plan]     ranked, best step time first

The space and its rules: planner.search.problem. The CP-SAT models (structure enumeration, top-K
selection): planner.search.cpsat. The exhaustive oracle the tests hold CP-SAT to:
planner.search.exhaustive. Why nothing fits: planner.search.diagnose. Ranking: docs/ranking.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.costmodel import checks
from planner.search.problem import (
    BatchCost,
    Space,
    evaluate,
    expand_structures,
    knob_domains,
    normalize_pins,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.search.cpsat import SolverConfig

__all__ = ["SearchResult", "build_space", "enumerate_layouts", "search", "solve"]


def enumerate_layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    config: SolverConfig | None = None,
) -> dict[str, Any]:
    """Knob columns of the space: CP-SAT enumerates the structures, the inner knobs are added."""
    from planner.search.cpsat import StructureModel

    pins = normalize_pins(pins)
    domains = knob_domains(model, cluster, job, pins)
    structures = StructureModel(model, cluster, job, domains, config).enumerate()
    return expand_structures(structures, pins, checks.offload_allowed(cluster))


def build_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    config: SolverConfig | None = None,
    batch_cost: BatchCost | None = None,
) -> Space:
    """The space of layouts evaluated by the cost model (estimate_batch by default)."""
    knobs = enumerate_layouts(model, cluster, job, pins, config)
    return evaluate(model, cluster, job, knobs, batch_cost)


@dataclass
class SearchResult:
    """Ranked row indices into the evaluated space, and where the time went (seconds)."""

    space: Space
    indices: list[int]
    objectives: list[int]
    timings: dict[str, float] = field(default_factory=dict)

    def plans(self) -> list[Plan]:
        """Plans (layout + Estimate from the space's cost columns), ranked from 1."""
        from planner.costmodel import Estimate
        from planner.plan import Plan

        return [
            Plan(self.space.layout(i), Estimate.from_batch(self.space.columns, i), rank=r)
            for r, i in enumerate(self.indices, 1)
        ]


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    top_k: int = 10,
    config: SolverConfig | None = None,
    batch_cost: BatchCost | None = None,
) -> SearchResult:
    """Space + CP-SAT top-K selection; raises InfeasibleError / LayoutError (diagnosed) when no
    layout honours the pins and fits."""
    from planner.search.cpsat import SelectionModel

    if top_k < 1:
        from planner.errors import SpecError

        raise SpecError(f"--top must be at least 1, got {top_k}")
    pins = normalize_pins(pins)
    t0 = time.perf_counter()
    knobs = enumerate_layouts(model, cluster, job, pins, config)
    t1 = time.perf_counter()
    space = evaluate(model, cluster, job, knobs, batch_cost)
    t2 = time.perf_counter()
    selection = SelectionModel(space, pins, top_k, config).solve()
    t3 = time.perf_counter()
    if not selection.indices:
        from planner.search.diagnose import diagnose

        raise diagnose(space, pins, config=config, batch_cost=batch_cost)
    timings = {"structure_s": t1 - t0, "cost_model_s": t2 - t1, "selection_s": t3 - t2}
    return SearchResult(space, selection.indices, selection.objectives, timings)


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    top_k: int = 10,
    config: SolverConfig | None = None,
) -> list[Plan]:
    """The top_k plans that fit, best step time first (ties: lower memory, then fewer groups
    crossing nodes). Raises InfeasibleError (exit 1) with a diagnosis when none fits, LayoutError
    (exit 2) when the pins admit no valid layout at all."""
    return search(model, cluster, job, pins, top_k, config).plans()

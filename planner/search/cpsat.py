"""The search in OR-Tools CP-SAT (the only module that imports ortools).

Two models, in the shape of the CP-SAT Primer (problem / config / solution split; solver
classes built from small _add_* methods; time limit, workers, seed, hints and search logging
passed through):

1. StructureModel: the parallel degrees and the batch split as integer variables with their
   domains (problem.knob_domains) and the structural constraints: tp*pp*dp*cp = GPUs
   (AddMultiplicationEquality), mbs*grad_accum*dp = global batch, ep divides dp*cp (modulo),
   interleaving only with pp > 1 and layers divisible by pp*vpp. All its solutions are enumerated:
   they are the structures of the space, which the cost model then evaluates in one vectorized call.

2. SelectionModel: one Boolean per evaluated layout ("is among the K plans returned"); at most K
   chosen; every pin excludes the layouts without the pinned value; every chosen layout's peak
   memory <= the usable capacity; minimize the sum of the chosen layouts' objective values
   (step time, then memory, then groups crossing nodes; problem.Space.keys). The optimum is the
   K best distinct plans in one solve: the constraint matrix is a cardinality row plus fixings,
   so the LP relaxation is integral and CP-SAT proves it at the root.

Why not one model with the cost terms as functions of the knob variables: the cost model is not
linear in the knobs, so the link is a table over the evaluated layouts; linking ten knob variables
to thousands of table rows and re-solving K times with the previous plans forbidden (measured on
llama-70B / 128 GPUs, 7,560 layouts) took 0.7 to 8 s per solve, against tens of ms here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model
from ortools.sat.python import cp_model_helper as cmh

from planner.search.problem import (
    KNOBS,
    STRUCTURE_KNOBS,
    Domains,
    Space,
    knob_code,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec

INT64_SAFE = 2**62  # CP-SAT rejects models whose objective may overflow int64


@dataclass(frozen=True)
class SolverConfig:
    """How CP-SAT runs. One worker by default: the models are small and a single worker is
    deterministic (same inputs, same ranking)."""

    time_limit_s: float = 10.0
    num_workers: int = 1
    random_seed: int = 0
    log_search_progress: bool = False

    def solver(self) -> cp_model.CpSolver:
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.max_time_in_seconds = self.time_limit_s
        params.num_workers = self.num_workers
        params.random_seed = self.random_seed
        params.log_search_progress = self.log_search_progress
        return solver


@dataclass
class Selection:
    """The selection model's answer: row indices into the Space, best first, their objective
    values (Space.keys), the solver status and its wall time."""

    indices: list[int] = field(default_factory=list)
    objectives: list[int] = field(default_factory=list)
    status: str = ""
    wall_s: float = 0.0


class _Collector(cp_model.CpSolverSolutionCallback):
    """Records every solution of the structure model."""

    def __init__(self, variables: list[cp_model.IntVar]) -> None:
        super().__init__()
        self.variables = variables
        self.rows: list[tuple[int, ...]] = []

    def on_solution_callback(self) -> None:
        self.rows.append(tuple(int(self.Value(v)) for v in self.variables))


class StructureModel:
    """Degrees and batch split that satisfy the structural constraints (module docstring 1)."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        job: JobSpec,
        domains: Domains,
        config: SolverConfig | None = None,
    ) -> None:
        self.spec, self.cluster, self.job, self.domains = model, cluster, job, domains
        self.config = config or SolverConfig()
        self.model = cp_model.CpModel()
        self.var: dict[str, cp_model.IntVar] = {}
        self._add_variables()
        self._add_gpu_product()
        self._add_global_batch()
        self._add_expert_divisibility()
        self._add_interleaving()

    def _add_variables(self) -> None:
        for knob in STRUCTURE_KNOBS:
            values = getattr(self.domains, knob) or [1]
            domain = cp_model.Domain.FromValues(values)
            self.var[knob] = self.model.NewIntVarFromDomain(domain, knob)
        self.empty = any(not getattr(self.domains, k) for k in STRUCTURE_KNOBS)

    def _add_gpu_product(self) -> None:
        # tp * pp * dp * cp = GPUs (ep is carved out of dp*cp and does not multiply the world)
        v = self.var
        self.model.AddMultiplicationEquality(
            self.cluster.num_gpus, [v["tp"], v["pp"], v["dp"], v["cp"]]
        )

    def _add_global_batch(self) -> None:
        # global_batch = mbs * grad_accum * dp
        batch = self.job.global_batch
        grad_accum = self.model.NewIntVar(1, batch, "grad_accum")
        self.model.AddMultiplicationEquality(batch, [self.var["mbs"], grad_accum, self.var["dp"]])

    def _add_expert_divisibility(self) -> None:
        # ep divides dp*cp: experts are sharded over ranks of the data/context group
        if len(self.domains.ep) <= 1:
            return
        dp_cp = self.model.NewIntVar(1, self.cluster.num_gpus, "dp_cp")
        self.model.AddMultiplicationEquality(dp_cp, [self.var["dp"], self.var["cp"]])
        self.model.AddModuloEquality(0, dp_cp, self.var["ep"])

    def _add_interleaving(self) -> None:
        # vpp > 1 only with pp > 1 and layers divisible by pp*vpp
        if max(self.domains.vpp) <= 1:
            return
        layers = self.spec.num_hidden_layers
        interleaved = self.model.NewBoolVar("interleaved")
        self.model.Add(self.var["vpp"] >= 2).OnlyEnforceIf(interleaved)
        self.model.Add(self.var["vpp"] == 1).OnlyEnforceIf(interleaved.Not())
        self.model.Add(self.var["pp"] >= 2).OnlyEnforceIf(interleaved)
        chunks = self.model.NewIntVar(1, layers * max(self.domains.vpp), "pp_vpp")
        self.model.AddMultiplicationEquality(chunks, [self.var["pp"], self.var["vpp"]])
        chunks_when_on = self.model.NewIntVar(1, layers * max(self.domains.vpp), "chunks_on")
        self.model.Add(chunks_when_on == chunks).OnlyEnforceIf(interleaved)
        self.model.Add(chunks_when_on == 1).OnlyEnforceIf(interleaved.Not())
        self.model.AddModuloEquality(0, layers, chunks_when_on)

    def enumerate(self) -> list[tuple[int, ...]]:
        """Every (tp, pp, dp, cp, ep, vpp, mbs) that satisfies the constraints, sorted."""
        if self.empty:
            return []
        variables = [self.var[k] for k in STRUCTURE_KNOBS]
        self.model.AddDecisionStrategy(variables, cp_model.CHOOSE_FIRST, cp_model.SELECT_MIN_VALUE)
        solver = self.config.solver()
        params = solver.parameters
        params.enumerate_all_solutions = True
        params.num_workers = 1  # enumeration is single-threaded in CP-SAT
        # pure propagation and a fixed branching order: no LP (measured 15x faster here)
        params.linearization_level = 0
        params.search_branching = cp_model.FIXED_SEARCH
        collector = _Collector(variables)
        status = solver.Solve(self.model, collector)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE):
            raise RuntimeError(
                f"CP-SAT did not finish enumerating the layouts: {solver.StatusName(status)}"
            )
        return sorted(set(collector.rows))


class SelectionModel:
    """Top-K selection over an evaluated space (module docstring 2).

    Built on the model proto directly (one Boolean per layout, variable i = row i of the space):
    with thousands of layouts the Python expression layer (NewBoolVar, Minimize(WeightedSum))
    took 0.2 s to build what the proto takes 10 ms for."""

    def __init__(
        self, space: Space, pins: Mapping[str, Any], top_k: int, config: SolverConfig | None = None
    ) -> None:
        self.space, self.pins, self.top_k = space, dict(pins), top_k
        self.config = config or SolverConfig()
        self.model = cp_model.CpModel()
        self.proto = self.model.Proto()
        self._add_choice_variables()
        self._add_cardinality()
        self._add_pins()
        self._add_memory_limit()
        self._add_objective()
        self._add_hint()

    def _add_choice_variables(self) -> None:
        # x_i in {0, 1}: layout i is among the plans returned
        boolean = cmh.IntegerVariableProto()
        boolean.domain.extend([0, 1])
        self.proto.variables.extend([boolean] * len(self.space))

    def _add_linear(self, rows: np.ndarray, coeffs: list[int], lo: int, hi: int) -> None:
        """lo <= sum(coeffs[j] * x[rows[j]]) <= hi."""
        linear = self.proto.constraints.add().linear
        linear.vars.extend(int(i) for i in rows)
        linear.coeffs.extend(coeffs)
        linear.domain.extend([lo, hi])

    def _excluded(self, mask: np.ndarray) -> None:
        """No chosen layout among the rows where mask is True."""
        rows = np.flatnonzero(mask)
        if len(rows):
            self._add_linear(rows, [1] * len(rows), 0, 0)

    def _eligible(self) -> np.ndarray:
        return self.space.pin_mask(self.pins) & self.space.fits

    def _add_cardinality(self) -> None:
        # exactly min(K, number of eligible layouts) plans: as many as exist, up to K
        count = min(self.top_k, int(self._eligible().sum()))
        self._add_linear(np.arange(len(self.space)), [1] * len(self.space), count, count)

    def _add_pins(self) -> None:
        # a pinned knob excludes every layout with another value
        for knob, value in self.pins.items():
            self._excluded(self.space.knobs[knob] != knob_code(knob, value))

    def _add_memory_limit(self) -> None:
        # peak memory of the most loaded GPU <= usable capacity, for every chosen layout
        self._excluded(self.space.mem_units > self.space.cap_units)

    def _add_objective(self) -> None:
        # sum of the chosen objective values: step time, then memory, then crossing groups
        keys = self.space.keys
        if len(keys) and int(keys.max()) * max(self.top_k, 1) >= INT64_SAFE:
            raise OverflowError("objective out of int64 range; raise problem.TIME_UNIT_S")
        self.proto.objective.vars.extend(range(len(keys)))
        self.proto.objective.coeffs.extend(keys.tolist())

    def _add_hint(self) -> None:
        # start from the lowest-memory eligible layouts (a feasible point)
        eligible = np.flatnonzero(self._eligible())
        order = eligible[np.argsort(self.space.mem_units[eligible], kind="stable")]
        chosen = order[: self.top_k].tolist()
        self.proto.solution_hint.vars.extend(chosen)
        self.proto.solution_hint.values.extend([1] * len(chosen))

    def solve(self) -> Selection:
        """Solve; the chosen rows ordered by objective value, ties by the knob tuple."""
        start = time.perf_counter()
        out = Selection()
        if not len(self.space):
            out.status = "EMPTY"
            return out
        solver = self.config.solver()
        status = solver.Solve(self.model)
        out.status = solver.StatusName(status)
        if status == cp_model.FEASIBLE:
            raise RuntimeError("CP-SAT hit its time limit before proving the top plans optimal")
        if status == cp_model.OPTIMAL:
            values = np.asarray(solver.ResponseProto().solution, dtype=np.int64)
            picked = np.flatnonzero(values[: len(self.space)])
            rows = sorted(picked.tolist(), key=lambda i: (int(self.space.keys[i]), self._row(i)))
            out.indices = rows
            out.objectives = [int(self.space.keys[i]) for i in rows]
        out.wall_s = time.perf_counter() - start
        return out

    def _row(self, i: int) -> tuple[int, ...]:
        return tuple(int(self.space.knobs[k][i]) for k in KNOBS)

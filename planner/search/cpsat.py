"""The search in OR-Tools CP-SAT (the only module that imports ortools).

Two models, in the shape of the CP-SAT Primer (problem / config / solution split; solver
classes built from small _add_* methods; time limit, workers, seed, hints and search logging
passed through):

1. StructureModel: the parallel degrees and the batch split as integer variables with their
   domains (problem.knob_domains) and the structural constraints: tp*pp*dp*cp = GPUs
   (int_prod, CP-SAT's AddMultiplicationEquality), mbs*grad_accum*dp = global batch,
   interleaving only with pp > 1, pp*vpp at most the layers + 2 (checks.vpp_searchable)
   and pp dividing grad_accum (Megatron's interleaved schedule). All its
   solutions are enumerated with ep, etp and mbs held at 1, then each is expanded into its valid
   (ep, etp, mbs) by problem.expand_held_knobs (the expert folding etp*ep | tp*cp*dp with etp 1,
   tp or the pinned value; mbs*dp dividing the batch): the structures of the space, which the
   cost model then evaluates in one vectorized call.

2. SelectionModel: one Boolean per evaluated layout ("is among the K plans returned"); exactly
   min(K, eligible) chosen; every pin and the memory limit (peak memory <= usable capacity)
   exclude layouts; minimize the sum of the chosen layouts' objective values (step time, then
   memory, then groups crossing nodes; problem.Space.keys). The optimum is the K best distinct
   plans in one solve: a cardinality row plus fixings has an integral LP relaxation, and CP-SAT
   proves it in presolve. Rows above the K-th smallest objective value are fixed out first;
   when at most K rows remain (no tie at the K-th value) the selection is forced, and they are
   the answer without a solve.

Why not one model with the cost terms as functions of the knob variables: the cost model is not
linear in the knobs, so the link is a table over the evaluated layouts; linking ten knob variables
to thousands of table rows and re-solving K times with the previous plans forbidden (measured on
llama-70B / 128 GPUs, 7,560 layouts) took 0.7 to 8 s per solve, against tens of ms here.

The models are written on CP-SAT's model proto through ortools' pybind layer (cp_model_helper),
not the Python `cp_model` wrapper: that wrapper imports pandas at import time, 0.2 to 0.5 s of
`planner solve`'s start-up, and its expression layer took 0.2 s to build a 7,560-term objective
that the proto takes 10 ms for. `Proto` below is the small builder the two models share.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model_helper as cmh

from planner.costmodel.checks import vpp_searchable
from planner.search import problem
from planner.search.problem import (
    KNOBS,
    STRUCTURE_KNOBS,
    Domains,
    Space,
    Split,
    divisors,
    expand_held_knobs,
    knob_code,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec

HELD_KNOBS = ("ep", "etp", "mbs")  # held at 1 in the structure model, expanded after it
INT64_SAFE = 2**62  # CP-SAT rejects models whose objective may overflow int64
OPTIMAL, FEASIBLE, INFEASIBLE = cmh.OPTIMAL, cmh.FEASIBLE, cmh.INFEASIBLE


@dataclass(frozen=True)
class SolverConfig:
    """How CP-SAT runs. One worker by default: the models are small and a single worker is
    deterministic (same inputs, same ranking)."""

    time_limit_s: float = 10.0
    num_workers: int = 1
    random_seed: int = 0
    log_search_progress: bool = False

    def parameters(self) -> cmh.SatParameters:
        params = cmh.SatParameters()
        params.max_time_in_seconds = self.time_limit_s
        params.num_workers = self.num_workers
        params.random_seed = self.random_seed
        params.log_search_progress = self.log_search_progress
        return params


class Proto:
    """A CP-SAT model proto with the few builders the search needs. Variables are indices;
    `-i - 1` is the negation of Boolean i (CP-SAT's literal convention)."""

    def __init__(self) -> None:
        self.proto = cmh.CpModelProto()

    def new_var(self, values: Sequence[int], name: str = "") -> int:
        """An integer variable whose domain is exactly `values`."""
        var = self.proto.variables.add()
        var.name = name
        var.domain.extend(_intervals(sorted(set(values))))
        return len(self.proto.variables) - 1

    def new_range(self, lo: int, hi: int, name: str = "") -> int:
        """An integer variable with domain lo..hi."""
        var = self.proto.variables.add()
        var.name = name
        var.domain.extend([lo, hi])
        return len(self.proto.variables) - 1

    def linear(
        self, terms: Sequence[tuple[int, int]], lo: int, hi: int, enforce: Sequence[int] = ()
    ) -> None:
        """lo <= sum(coeff * var) <= hi, only when every literal in `enforce` is true."""
        con = self.proto.constraints.add()
        con.enforcement_literal.extend(enforce)
        con.linear.vars.extend(v for v, _ in terms)
        con.linear.coeffs.extend(c for _, c in terms)
        con.linear.domain.extend([lo, hi])

    def product(self, target: int | None, factors: Sequence[int], constant: int = 0) -> None:
        """var[target] (or `constant` when target is None) = product of the factor variables."""
        prod = self.proto.constraints.add().int_prod
        _expr(prod.target, target, constant)
        for var in factors:
            _expr(prod.exprs.add(), var)

    def table(self, variables: Sequence[int], rows: Sequence[Sequence[int]]) -> None:
        """The variables take one of the given rows of values (CP-SAT's table constraint)."""
        con = self.proto.constraints.add().table
        for var in variables:
            _expr(con.exprs.add(), var)
        con.values.extend(x for row in rows for x in row)

    def modulo(self, target: int, numerator: int, modulus: int) -> None:
        """var[target] = var[numerator] mod var[modulus]."""
        mod = self.proto.constraints.add().int_mod
        _expr(mod.target, target)
        _expr(mod.exprs.add(), numerator)
        _expr(mod.exprs.add(), modulus)

    def solve(
        self, config: SolverConfig, callback: cmh.SolutionCallback | None = None, **overrides: Any
    ) -> cmh.CpSolverResponse:
        params = config.parameters()
        for key, value in overrides.items():
            setattr(params, key, value)
        wrapper = cmh.SolveWrapper()
        wrapper.set_parameters(params)
        if callback is not None:
            wrapper.add_solution_callback(callback)
        response = wrapper.solve(self.proto)
        if callback is not None:
            wrapper.clear_solution_callback(callback)
        return response


def _intervals(values: list[int]) -> list[int]:
    """Sorted values -> CP-SAT's flat domain [lo0, hi0, lo1, hi1, ...]."""
    flat: list[int] = []
    for v in values:
        if flat and flat[-1] == v - 1:
            flat[-1] = v
        else:
            flat += [v, v]
    return flat


def _expr(proto: cmh.LinearExpressionProto, var: int | None, constant: int = 0) -> None:
    if var is not None:
        proto.vars.append(var)
        proto.coeffs.append(1)
    proto.offset = constant


@dataclass
class Selection:
    """The selection model's answer: row indices into the Space, best first, their objective
    values (Space.keys), the solver status and its wall time."""

    indices: list[int] = field(default_factory=list)
    objectives: list[int] = field(default_factory=list)
    status: str = ""
    wall_s: float = 0.0


class _Collector(cmh.SolutionCallback):
    """Records every solution of the structure model (values of the given variables)."""

    def __init__(self, variables: list[int]) -> None:
        cmh.SolutionCallback.__init__(self)
        self.variables = variables
        self.rows: list[tuple[int, ...]] = []

    def OnSolutionCallback(self) -> None:
        self.rows.append(tuple(self.SolutionIntegerValue(v) for v in self.variables))


class StructureModel:
    """Degrees and batch split that satisfy the structural constraints (module docstring 1)."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        job: JobSpec,
        domains: Domains,
        config: SolverConfig | None = None,
        pins: Mapping[str, Any] | None = None,
    ) -> None:
        self.spec, self.cluster, self.job, self.domains = model, cluster, job, domains
        self.pins = dict(pins or {})
        self.config = config or SolverConfig()
        self.model = Proto()
        self.var: dict[str, int] = {}
        self._add_variables()
        self._add_gpu_product()
        self._add_global_batch()
        self._add_interleaving()
        self._add_search_order()

    def _add_variables(self) -> None:
        # one variable per structural knob, domain = the values the space allows for it; ep,
        # etp and mbs are held at 1 here and expanded after the enumeration
        # (problem.expand_held_knobs, exact): their rules are per-structure checks, far cheaper
        # than CP-SAT's ~0.1 ms per enumerated solution (DeepSeek-V3 on 65536 GPUs at seq 32768
        # and 2**20 sequences: 11,340 structures in 1.5 s, 0.1 s held)
        for knob in STRUCTURE_KNOBS:
            values = [1] if knob in HELD_KNOBS else getattr(self.domains, knob)
            self.var[knob] = self.model.new_var(values or [1], knob)
        self.empty = any(not getattr(self.domains, k) for k in STRUCTURE_KNOBS)

    def _add_gpu_product(self) -> None:
        # tp * pp * dp * cp = GPUs (ep is carved out of dp*cp and does not multiply the world)
        v = self.var
        self.model.product(None, [v["tp"], v["pp"], v["dp"], v["cp"]], self.cluster.num_gpus)

    def _add_global_batch(self) -> None:
        # global_batch = mbs * grad_accum * dp
        batch = self.job.global_batch
        # the micro-batches per step divide the batch: a sparse domain (21 values for 2**20
        # sequences, not a million) keeps the product's propagation cheap
        self.grad_accum = self.model.new_var(divisors(batch), "grad_accum")
        self.model.product(None, [self.var["mbs"], self.grad_accum, self.var["dp"]], batch)

    def _add_interleaving(self) -> None:
        # vpp > 1 only with the (pp, vpp) pairs checks.vpp_searchable allows (one rule with the
        # exhaustive oracle: the flags' even chunks, or a layout string's), pp dividing grad_accum
        if max(self.domains.vpp) <= 1:
            return
        layers, v = self.spec.num_hidden_layers, self.var
        pinned = self.pins.get("vpp")
        pairs = [(pp, vpp) for pp in self.domains.pp for vpp in self.domains.vpp
                 if vpp_searchable(layers, pp, vpp, vpp == pinned)]
        self.model.table([v["pp"], v["vpp"]], pairs)
        on = self.model.new_var([0, 1], "interleaved")
        self.model.linear([(v["vpp"], 1)], 2, max(self.domains.vpp), enforce=[on])
        self.model.linear([(v["vpp"], 1)], 1, 1, enforce=[-on - 1])
        # Megatron's interleaved schedule needs the micro-batches to divide into pp groups
        # (schedules.py: "number of microbatches is not divisible by pipeline-parallel size")
        remainder = self.model.new_var(range(0, layers), "grad_accum_mod_pp")
        self.model.modulo(remainder, self.grad_accum, v["pp"])
        self.model.linear([(remainder, 1)], 0, 0, enforce=[on])

    def _add_search_order(self) -> None:
        # enumeration: branch on the knobs in a fixed order, smallest value first
        strategy = self.model.proto.search_strategy.add()
        strategy.variables.extend(self.var[k] for k in STRUCTURE_KNOBS)
        strategy.variable_selection_strategy = cmh.DecisionStrategyProto.CHOOSE_FIRST
        strategy.domain_reduction_strategy = cmh.DecisionStrategyProto.SELECT_MIN_VALUE

    def enumerate(self) -> list[tuple[int, ...]]:
        """Every (tp, pp, dp, cp, ep, etp, vpp, mbs) that satisfies the constraints, sorted."""
        if self.empty:
            return []
        collector = _Collector([self.var[k] for k in STRUCTURE_KNOBS])
        # enumeration is single-threaded in CP-SAT; pure propagation with a fixed branching order
        # and no LP (linearization 0) measured 15x faster than the defaults here
        response = self.model.solve(
            self.config,
            collector,
            enumerate_all_solutions=True,
            num_workers=1,
            linearization_level=0,
            search_branching=cmh.SatParameters.FIXED_SEARCH,
        )
        if response.status not in (OPTIMAL, INFEASIBLE):  # FEASIBLE = stopped part way
            from planner.errors import SpecError

            raise SpecError(
                f"the layout space is too large to enumerate within {self.config.time_limit_s:g}"
                f" s (CP-SAT status {response.status}); pin some knobs (--tp, --pp, --cp, --vpp,"
                " --mbs) to narrow it")
        return expand_held_knobs(sorted(set(collector.rows)), self.domains, self.spec.is_moe,
                                 self.pins, self.job.global_batch)


class SelectionModel:
    """Top-K selection over an evaluated space (module docstring 2); variable j is row
    self.rows[j]: the free rows (the reference: every row, variable i is row i)."""

    def __init__(
        self, space: Space, pins: Mapping[str, Any], top_k: int, config: SolverConfig | None = None,
        keys: np.ndarray | None = None, allowed: np.ndarray | None = None,
    ) -> None:
        """keys: another order than space.keys (the tie's robustness order, planner.search.ties);
        allowed: choose only among these rows (the tie)."""
        self.space, self.pins, self.top_k = space, dict(pins), top_k
        self.keys = space.keys if keys is None else np.asarray(keys, dtype=np.int64)
        self.config = config or SolverConfig()
        self.model = Proto()
        self.proto = self.model.proto
        self._excluded = np.zeros(len(space), dtype=bool)
        if allowed is not None:
            self._excluded |= ~np.asarray(allowed, dtype=bool)
        self._add_pins()
        self._add_memory_limit()
        self._add_key_bound()
        # the rows left after the key bound: when there are at most K of them (no tie at the
        # K-th value), every optimal selection takes them all, so that is CP-SAT's answer and
        # the model is not built (Mixtral on 65536 H100 at 2**20 sequences: 161k variables,
        # 0.1 s to build and 0.2 s to solve and read back, twice per search)
        self.free = np.flatnonzero(~self._excluded)
        self.forced = problem.EXACT_SHORTCUTS and 1 <= len(self.free) <= top_k
        # the model's variables: one per free row (the excluded rows are fixed to 0, which
        # presolve drops first; 136k of DeepSeek-V3's rows took 0.1 s to write and 0.1 s to
        # drop, twice per search), or, for the reference, one per row of the space
        self.rows = self.free if problem.EXACT_SHORTCUTS else np.arange(len(space))
        if not self.forced:
            self._add_choice_variables()
            self._add_cardinality()
            self._add_objective()
            self._add_hint()

    def _add_pins(self) -> None:
        # a pinned knob excludes every layout with another value
        for knob, value in self.pins.items():
            self._excluded |= self.space.knobs[knob] != knob_code(knob, value)

    def _add_memory_limit(self) -> None:
        # peak memory of the most loaded GPU <= usable capacity, for every chosen layout
        self._excluded |= self.space.mem_units > self.space.cap_units

    def _add_key_bound(self) -> None:
        # a row whose objective value exceeds the K-th smallest among the eligible rows is in no
        # optimal selection (swapping it for an unchosen row at or below that value lowers the
        # sum), so it is fixed to 0 like a pinned-out row. Without this bound a large --top
        # (3,000 of Mixtral's 27k fitting layouts on 64 H100) ran past the 10 s time limit.
        free = np.flatnonzero(~self._excluded)
        if len(free) > self.top_k >= 1:
            kth = np.partition(self.keys[free], self.top_k - 1)[self.top_k - 1]
            self._excluded |= self.keys > kth

    def _add_choice_variables(self) -> None:
        # x_i in {0, 1}: layout i is among the plans returned; x_i in {0} where a pin or the
        # memory limit excludes layout i (unary constraints written as domains: presolve drops
        # those rows at no cost, where one 0-sum row over 40k layouts took 0.5 s)
        free, fixed = cmh.IntegerVariableProto(), cmh.IntegerVariableProto()
        free.domain.extend([0, 1])
        fixed.domain.extend([0, 0])
        self.proto.variables.extend([fixed if ex else free
                                     for ex in self._excluded[self.rows].tolist()])

    def _var(self, rows: np.ndarray) -> np.ndarray:
        """The variables of the given rows (each in self.rows)."""
        return np.searchsorted(self.rows, rows)

    def _add_cardinality(self) -> None:
        # exactly min(K, number of eligible layouts) plans: as many as exist, up to K
        free = self._var(self.free).tolist()
        count = min(self.top_k, len(free))
        self.model.linear([(i, 1) for i in free], count, count)

    def _add_objective(self) -> None:
        # sum of the chosen objective values: step time, then memory, then crossing groups
        keys = self.keys
        free = self.free  # the others are 0 and add nothing
        # the objective is a sum of at most top_k chosen keys, so it is bounded by both top_k x
        # the largest key and the sum of all keys; only rows that may be chosen count (a
        # layout that does not fit may take days, and its key never enters the objective)
        free_keys = keys[free].astype(float)
        bound = min(free_keys.max() * max(self.top_k, 1), free_keys.sum()) if len(free) else 0
        if bound >= INT64_SAFE:
            raise OverflowError("objective out of int64 range; raise problem.TIME_UNIT_S")
        self.proto.objective.vars.extend(self._var(free).tolist())
        self.proto.objective.coeffs.extend(keys[free].tolist())

    def _add_hint(self) -> None:
        # start from the lowest-memory eligible layouts (a feasible point)
        eligible = self.free
        order = eligible[np.argsort(self.space.mem_units[eligible], kind="stable")]
        chosen = self._var(order[: self.top_k]).tolist()
        self.proto.solution_hint.vars.extend(chosen)
        self.proto.solution_hint.values.extend([1] * len(chosen))

    def solve(self) -> Selection:
        """Solve; the chosen rows ordered by objective value, ties by the knob tuple."""
        start = time.perf_counter()
        out = Selection()
        if not len(self.space):
            out.status = "EMPTY"
            return out
        if self.forced:  # every row the bound leaves is chosen (__init__)
            out.status = "OPTIMAL"
            picked = self.free.tolist()
        else:
            response = self.model.solve(self.config)
            out.status = response.status.name
            if response.status == FEASIBLE:
                raise RuntimeError("CP-SAT hit its time limit before proving the top plans "
                                   "optimal")
            if response.status not in (OPTIMAL, INFEASIBLE):  # a fault is not "nothing fits"
                raise RuntimeError(f"CP-SAT could not solve the selection model: {out.status}")
            # the excluded rows are fixed to 0: read back the free ones only
            solution = response.solution
            picked = ([r for r, v in zip(self.free.tolist(), self._var(self.free).tolist(),
                                         strict=True) if solution[v]]
                      if response.status == OPTIMAL else [])
        if out.status == "OPTIMAL":
            rows = sorted(picked, key=lambda i: (int(self.keys[i]), self._row(i)))
            out.indices = rows
            out.objectives = [int(self.keys[i]) for i in rows]
        out.wall_s = time.perf_counter() - start
        return out

    def _row(self, i: int) -> tuple[int, ...]:
        return tuple(int(self.space.knobs[k][i]) for k in KNOBS)


class SplitModel:
    """Layers per pipeline stage for one layout (planner.search.stages.SplitProblem), in the
    order encoding: stage i holds n_i = lo_i + sum_k y[i, k] layers with Booleans y[i, k] =
    [n_i >= k] (y[i, k] >= y[i, k+1]; a count the stage may not hold between lo_i and hi_i is cut
    by y[i, k] <= y[i, k+1]); its time and memory are then linear in y, the increments of its
    tables (exact for any table, and the LP relaxation of a monotone one is tight). The counts
    sum to the layers; the slowest stage's time T >= each stage's and the highest memory
    M >= each stage's; minimize T x (memory range) + M (time first, then memory). Measured on
    the Llama 3 405B splits: 4x faster than one Boolean per (stage, count)."""

    def __init__(self, problem: Any, config: SolverConfig | None = None) -> None:
        self.problem = problem
        self.config = config or SolverConfig()
        self.model = Proto()
        self.stages: list[tuple[int, list[int]]] = []  # per stage: (lo, y variables)
        self.empty = not all(problem.fits[i].any() for i in range(problem.stages))
        if not self.empty:
            self._add_objective_variables()
            self._add_stages()
            self._add_layer_sum()

    def _add_objective_variables(self) -> None:
        p = self.problem
        self.m_hi = int(p.memory[p.fits].max())
        self.slowest = self.model.new_range(0, int(p.time[p.fits].max()), "T")
        self.peak = self.model.new_range(0, self.m_hi, "M")
        self.model.proto.objective.vars.extend([self.slowest, self.peak])
        self.model.proto.objective.coeffs.extend([self.m_hi + 1, 1])

    def _add_stages(self) -> None:
        # n_i = lo + sum y; T >= time(lo) + sum y_k (time(k) - time(k-1)); M likewise
        p = self.problem
        for i in range(p.stages):
            allowed = np.flatnonzero(p.fits[i]) + 1
            lo, hi = int(allowed[0]), int(allowed[-1])
            ys = [self.model.new_var([0, 1], f"stage{i}_ge{k}") for k in range(lo + 1, hi + 1)]
            for k, (y, y_next) in enumerate(itertools.pairwise(ys), start=lo + 1):
                self.model.linear([(y, 1), (y_next, -1)], 0, 1)  # n >= k+1 implies n >= k
                if not p.fits[i, k - 1]:  # n == k not allowed: n >= k implies n >= k+1
                    self.model.linear([(y, 1), (y_next, -1)], 0, 0)
            for table, var in ((p.time, self.slowest), (p.memory, self.peak)):
                steps = [(y, -int(table[i, k - 1] - table[i, k - 2]))
                         for k, y in zip(range(lo + 1, hi + 1), ys, strict=True)]
                self.model.linear([(var, 1), *steps], int(table[i, lo - 1]), INT64_SAFE)
            self.stages.append((lo, ys))

    def _add_layer_sum(self) -> None:
        # sum over stages of their layers = the model's layers
        base = sum(lo for lo, _ in self.stages)
        terms = [(y, 1) for _, ys in self.stages for y in ys]
        if not terms:
            self.empty = base != self.problem.layers
            return
        self.model.linear(terms, self.problem.layers - base, self.problem.layers - base)

    def solve(self) -> Any:
        """The best Split (empty counts when no split fits)."""
        if self.empty:
            return Split()
        response = self.model.solve(self.config)
        if response.status == INFEASIBLE:
            return Split()
        if response.status != OPTIMAL:
            raise RuntimeError(f"CP-SAT could not solve the stage split: {response.status.name}")
        values = response.solution
        counts = tuple(lo + sum(values[y] for y in ys) for lo, ys in self.stages)
        return Split(counts, int(values[self.slowest]), int(values[self.peak]))

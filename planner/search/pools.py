"""The search on a cluster of several GPU pools (specs.PooledCluster).

A plan: tp, cp, dp (and ep, mbs, zero, recompute, sp) alike in every pool, pool j holding
GPUs_j / (tp cp dp) consecutive pipeline stages (its GPUs all used), the pools in some order
along the pipeline, and the layers per stage (costmodel.pools has the cost terms). Plain 1F1B
(vpp 1). The space: every such structure whose tp fits each pool's NVLink domain and divides
the heads, whose stages number at most the layers, times the inner knobs and the pool orders.

For each (layout, order) the layers per stage are the split problem of planner.search.stages
with each stage's table from its own pool's GPU (time per micro-batch, memory against that
pool's capacity), solved by CP-SAT (cpsat.SplitModel). Branch and bound keeps it fast and
exact for the top K: with stage times linear in their layers (T_i(n) = a_i n + b_i), any
split has a slowest stage T >= (layers + sum b_i / a_i) / sum 1 / a_i, so the step is at least
(grad_accum + bubble slots) x that (pools of different GPUs, which keep the equal-stage bubble),
or, on pools of one GPU, (grad_accum - 1) x that + min a_i x layers + sum b_i (the bubble of
pipeline.bubble_time); candidates are solved in the order of this bound and the
search stops when the next bound exceeds the K-th best step found.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.costmodel import checks, pipeline
from planner.errors import InfeasibleError, LayoutError
from planner.layout import RECOMPUTE_LEVELS
from planner.search.bands import order_ties, tp_term_weight
from planner.search.problem import (
    CP_MIN_SEQ_LEN,
    KNOBS,
    MEM_UNIT_GIB,
    TIME_UNIT_S,
    divisors,
    inner_knobs,
    knob_code,
    micro_batch_sizes,
    normalize_pins,
)
from planner.search.stages import SplitProblem, split_width
from planner.specs import GIB, JobSpec, ModelSpec, PooledCluster

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.search.cpsat import SolverConfig

CHUNK = 32  # candidates solved and evaluated together


def pooled_knobs(model: ModelSpec, pooled: PooledCluster, job: JobSpec,
                 pins: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Knob columns (problem.KNOBS) of the pooled space that honour the pins (module
    docstring)."""
    sizes = [p.num_gpus for p in pooled.pools]
    domain = min(p.domain_gpus for p in pooled.pools)
    tps = [t for t in (2**i for i in range(domain.bit_length())) if t <= domain
           and all(checks.tp_allowed(model, p, t) for p in pooled.pools)]
    cps = ([c for c in (2**i for i in range(min(sizes).bit_length()))
            if checks.cp_allowed(job, c)] if job.seq_len >= CP_MIN_SEQ_LEN else [1])
    eps = divisors(model.num_experts) if model.is_moe else [1]
    offload = all(checks.offload_allowed(p) for p in pooled.pools)
    batch, layers = job.global_batch, model.num_hidden_layers
    rows = []
    for tp, cp, dp in itertools.product(tps, cps, divisors(batch)):
        width = tp * cp * dp
        if any(n % width for n in sizes):
            continue
        pp = sum(n // width for n in sizes)
        if pp > layers:
            continue
        for ep in eps:
            if (dp * cp) % ep:
                continue
            for mbs in micro_batch_sizes(batch, dp):
                for z, r, s in inner_knobs(tp, dp, cp, pins, offload, model.is_moe):
                    rows.append((tp, pp, dp, cp, ep, tp, 1, mbs, z, r, s))  # etp = tp
    table = np.array(rows, dtype=np.int64).reshape(-1, len(KNOBS))
    keep = np.ones(len(table), dtype=bool)
    for knob, value in pins.items():
        keep &= table[:, KNOBS.index(knob)] == knob_code(knob, value)
    return {k: table[keep, i] for i, k in enumerate(KNOBS)}


def _tables(model: ModelSpec, pooled: PooledCluster, job: JobSpec,
            knobs: Mapping[str, np.ndarray], pp: int, width: int):
    """Per pool: (time s, memory bytes) of every (stage, layer count) row, (rows, pp * width)."""
    from planner.costmodel.batch import stage_costs

    feats = pipeline.count_features(model, pp, width)
    return [stage_costs(model, cl, job, knobs, feats) for cl in pooled.pools]


def _problem(tables, stage_pool: Sequence[int], row: int, pp: int, width: int,
             layers: int, caps: Sequence[float]) -> SplitProblem:
    """The split problem of one layout and pool order: stage i's rows from its pool's table."""
    time = np.empty((pp, width))
    mem = np.empty((pp, width))
    for i, j in enumerate(stage_pool):
        t, m = tables[j]
        time[i] = t[row, i * width:(i + 1) * width]
        mem[i] = m[row, i * width:(i + 1) * width]
    cap = np.array([caps[j] for j in stage_pool])[:, None]
    fits = mem / GIB <= cap
    cap_units = int(max(caps) / MEM_UNIT_GIB)
    m_units = np.minimum(np.rint(mem / GIB / MEM_UNIT_GIB), cap_units + 1).astype(np.int64)
    return SplitProblem(layers, np.rint(time / TIME_UNIT_S).astype(np.int64), m_units, fits)


def _bound(problem: SplitProblem, m: float, pp: int, same_gpu: bool = True) -> float:
    """Lower bound of the step (seconds) over every split (module docstring); pools of
    different GPUs keep the equal-stage bubble (costmodel.pools.one_gpu)."""
    t = problem.time.astype(float) * TIME_UNIT_S
    a = np.maximum(t[:, 1] - t[:, 0], 1e-12) if t.shape[1] > 1 else t[:, 0]
    b = t[:, 0] - a
    balanced = (problem.layers + (b / a).sum()) / (1.0 / a).sum()
    slowest = max(balanced, float(t[:, 0].max()))
    # step = (m - 1) x the slowest + the sum of all stages (pipeline.bubble_time, plain 1F1B);
    # the sum is at least every layer at the cheapest stage's rate plus each stage's fixed part
    if not same_gpu:
        return float((m + pipeline.bubble_slots(pp, 1, m)) * slowest)
    whole = max(float(a.min()) * problem.layers + float(b.sum()), slowest)
    return float((m - 1) * slowest + whole)


def search_pooled(
    model: ModelSpec,
    pooled: PooledCluster,
    job: JobSpec,
    pins: Mapping[str, Any] | None = None,
    top_k: int = 10,
    config: SolverConfig | None = None,
    stage_layers: Sequence[int] | None = None,
    even_stages: bool = False,
) -> list[Plan]:
    """The top_k plans on the pools that fit: those whose band overlaps the fastest's first, the
    most robust first (search.bands.order_ties, flagged tied_with_best), then by step time
    (ties: lower memory)."""
    from planner.costmodel import Estimate
    from planner.costmodel.pools import estimate_pooled_batch
    from planner.layout import Layout
    from planner.plan import Plan
    from planner.search.cpsat import SplitModel
    from planner.search.problem import Split

    pins = normalize_pins(pins)
    if not pipeline.uniform_layers(model):
        from planner.errors import SpecError

        raise SpecError(f"{model.name} mixes dense and MoE layers; the search on a cluster of "
                        "pools needs layers of one kind (estimate takes it with --stage-layers)")
    if pins.get("vpp", 1) != 1:
        raise LayoutError("interleaving (vpp > 1) is not searched on a cluster of pools; "
                          "use --vpp 1")
    if stage_layers:
        pins = {**pins, "pp": len(stage_layers)}
    knobs = pooled_knobs(model, pooled, job, pins)
    if not len(knobs["tp"]):
        raise LayoutError(f"no layout of {model.name} on {pooled} honours the pins: tp*cp*dp must "
                          "divide every pool's GPU count, with one or more stages per pool")
    from planner.costmodel.pools import one_gpu

    same = one_gpu(pooled)
    layers = model.num_hidden_layers
    caps = [p.gpu.usable_memory_gib for p in pooled.pools]
    orders = list(itertools.permutations(range(len(pooled.pools))))
    grad_accum = job.global_batch // (knobs["mbs"] * knobs["dp"])
    candidates = []  # (bound, row, order index, problem)
    for pp in np.unique(knobs["pp"]):
        rows = np.flatnonzero(knobs["pp"] == pp)
        pp = int(pp)
        width = split_width(layers, pp)
        sub = {k: v[rows] for k, v in knobs.items()}
        tables = _tables(model, pooled, job, sub, pp, width)
        for local, row in enumerate(rows.tolist()):
            counts = [pooled.pools[j].num_gpus // int(knobs["tp"][row] * knobs["cp"][row]
                                                      * knobs["dp"][row])
                      for j in range(len(pooled.pools))]
            for o, order in enumerate(orders):
                stage_pool = [j for j in order for _ in range(counts[j])]
                prob = _problem(tables, stage_pool, local, pp, width, layers, caps)
                if stage_layers or even_stages:
                    fixed = list(stage_layers or pipeline.stage_layer_counts(layers, pp))
                    allowed = np.zeros_like(prob.fits)
                    for i, n in enumerate(fixed):
                        if n <= width:
                            allowed[i, n - 1] = prob.fits[i, n - 1]
                    prob = SplitProblem(layers, prob.time, prob.memory, allowed)
                bound = _bound(prob, float(grad_accum[row]), pp, same)
                candidates.append((bound, row, o, prob))
    candidates.sort(key=lambda c: c[0])
    best: list[tuple[float, float, int, Plan]] = []  # max-heap of the K best (negated)
    solved: dict[bytes, Split] = {}
    seq = itertools.count()
    for start in range(0, len(candidates), CHUNK):
        chunk = candidates[start:start + CHUNK]
        if len(best) >= top_k and chunk[0][0] > -best[0][0]:
            break
        found = []
        for _, row, o, prob in chunk:
            limit = None
            if len(best) >= top_k:  # a slowest stage above this cannot enter the top K
                # step >= m x the slowest stage (the sum of all stages is at least the slowest)
                m = float(grad_accum[row])
                slots = m if same else m + float(pipeline.bubble_slots(int(knobs["pp"][row]), 1,
                                                                       m))
                limit = int(-best[0][0] / slots / TIME_UNIT_S) + 1
            prob = prob.pruned(limit)
            key = prob.time.tobytes() + prob.memory.tobytes() + prob.fits.tobytes()
            if key not in solved:
                solved[key] = SplitModel(prob, config).solve()
            if solved[key].counts:
                found.append((row, o, solved[key].counts))
        for o in {f[1] for f in found}:
            mine = [f for f in found if f[1] == o]
            layouts = []
            for row, _, counts in mine:
                names = []
                width_gpus = int(knobs["tp"][row] * knobs["cp"][row] * knobs["dp"][row])
                for j in orders[o]:
                    names += [pooled.pools[j].gpu.name] * (pooled.pools[j].num_gpus // width_gpus)
                layouts.append(Layout(
                    tp=int(knobs["tp"][row]), pp=int(knobs["pp"][row]), dp=int(knobs["dp"][row]),
                    cp=int(knobs["cp"][row]), ep=int(knobs["ep"][row]), vpp=1,
                    mbs=int(knobs["mbs"][row]), zero=int(knobs["zero"][row]),
                    recompute=RECOMPUTE_LEVELS[int(knobs["recompute"][row])],  # type: ignore[arg-type]
                    sp=bool(knobs["sp"][row]), stage_layers=counts, stage_gpu=tuple(names)))
            cols = estimate_pooled_batch(model, pooled, job, layouts, orders[o])
            for i, layout in enumerate(layouts):
                if not cols["fits"][i]:
                    continue
                step, mem = float(cols["step_time_s"][i]), float(cols["peak_mem_gb"][i])
                item = (-step, -mem, -next(seq), Plan(layout, Estimate.from_batch(cols, i)))
                if len(best) < top_k:
                    heapq.heappush(best, item)
                elif item[:2] > best[0][:2]:
                    heapq.heapreplace(best, item)
    if not best:
        raise InfeasibleError(
            f"no layout of {model.name} fits on {pooled}",
            [f"searched {len(candidates)} layouts and pool orders; the pools hold "
             + ", ".join(f"{p.num_gpus} {p.gpu.name} ({p.gpu.usable_memory_gib:.1f} GiB usable)"
                         for p in pooled.pools)])
    ranked = sorted(best, key=lambda item: (-item[0], -item[1], -item[2]))
    # the same ties as the search of one cluster, among the plans found (bands.order_ties)
    plans = [p for _, _, _, p in ranked]
    domain = min(pool.domain_gpus for pool in pooled.pools)
    return order_ties(plans, tp_weight=tp_term_weight([p.layout.tp for p in plans], domain,
                                                      job.tp_comm_overlap))

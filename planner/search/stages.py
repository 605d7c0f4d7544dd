"""Uneven pipeline stages: how many layers each stage holds, searched per layout.

The split problem of one layout (pp > 1, a model whose layers are all of one kind): integer
layers n_i >= 1 per stage (interleaved, vpp > 1: one per chunk, the end stages' outer chunks
may hold none, least_layers) summing to the model's layers, the embedding on stage 0 and
the LM head on the last stage, each stage's GPU within its usable memory (the cost model's peak
of that stage with n_i layers: its in-flight micro-batches, its parameters), minimizing the
slowest stage's time per micro-batch (the step is grad_accum - 1 times it plus the sum of all
stages, which every split shares: pipeline.bubble_time), then the highest stage memory. The
tables are the cost model's own stage terms (costmodel.batch.stage_costs on
pipeline.count_features), in the search's integer units, so the split is exact for the cost
model; a stage holds at most SPLIT_MAX_FACTOR x ceil(layers / pp) + 2 layers (beyond that it
is never the best split with linear stage times; the bound keeps the tables small).

Solved by CP-SAT (cpsat.SplitModel); split_dp is the exact dynamic-programming oracle over
(stages, layers) the tests hold it to. improve_splits runs the split search inside `search`:
a layout's split replaces the even rule's (pipeline.stage_layer_counts) only where its
re-evaluated step time is lower, or it fits where the even one does not. Layouts whose step
time cannot beat the K-th best plan even with perfectly balanced stages (a lower bound from the
linear stage times) are skipped, which keeps the search exact for the top K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.costmodel import pipeline
from planner.layout import chunks_of_stages
from planner.search.problem import MEM_UNIT_GIB, Space, Split, evaluate
from planner.specs import GIB

if TYPE_CHECKING:
    from planner.search.cpsat import SolverConfig

SPLIT_MAX_FACTOR = 2  # a stage holds at most 2 x ceil(L / pp) + 2 layers in the split tables
BIG = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class SplitProblem:
    """Layers on pipeline stages: stage i holding n layers (n = 1..width) takes time[i, n-1]
    (integer time units per micro-batch) and memory[i, n-1] (MiB), allowed where
    fits[i, n-1]."""

    layers: int
    time: np.ndarray  # (stages, width) int64
    memory: np.ndarray  # (stages, width) int64
    fits: np.ndarray  # (stages, width) bool

    @property
    def stages(self) -> int:
        return self.time.shape[0]

    def pruned(self, slowest_bound: int | None = None) -> SplitProblem:
        """The same problem with the counts no optimal split uses taken out: a stage time above
        a known split's slowest stage (`slowest_bound`), and counts the other stages cannot
        complete to the layers (too few: they hold at most their largest allowed counts; too
        many: they need at least their smallest). The optimum is unchanged."""
        fits = self.fits.copy()
        if slowest_bound is not None:
            fits &= self.time <= slowest_bound
        n = np.arange(1, fits.shape[1] + 1)
        for _ in range(2):
            most = np.where(fits, n, 0).max(axis=1)
            least = np.where(fits, n, BIG).min(axis=1)
            if (most == 0).any():
                break
            lo = self.layers - (most.sum() - most)  # what stage i must take at least
            hi = self.layers - (least.sum() - least)  # and at most
            fits &= (n[None, :] >= lo[:, None]) & (n[None, :] <= hi[:, None])
        return SplitProblem(self.layers, self.time, self.memory, fits)

    def objective(self, counts: Sequence[int]) -> tuple[int, int]:
        """(slowest stage time, highest stage memory) of a split, in the problem's units."""
        rows = np.arange(self.stages)
        idx = np.asarray(counts) - 1
        return int(self.time[rows, idx].max()), int(self.memory[rows, idx].max())


def least_layers(pp: int, vpp: int) -> list[int]:
    """Fewest layers each stage may hold in the split search: one (vpp 1); one per chunk with
    vpp > 1, but the first chunk (beside the embedding) and the last (beside the loss) may hold
    none, as Megatron's layout allows ('E|...', '...|L'), so the end stages need vpp - 1."""
    if vpp == 1:
        return [1] * pp
    return [vpp - 1 if i in (0, pp - 1) else vpp for i in range(pp)]


@lru_cache(maxsize=4096)
def even_totals(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Layers per stage under the even rule (its chunks together)."""
    return tuple(len(s) for s in pipeline.stage_layers(layers, pp, vpp))


def split_width(layers: int, pp: int) -> int:
    """Most layers one stage may hold in the split tables (module docstring)."""
    return min(layers - pp + 1, SPLIT_MAX_FACTOR * math.ceil(layers / pp) + 2)


def split_problems(space: Space, rows: Sequence[int],
                   time_unit_s: float | None = None) -> list[SplitProblem]:
    """The split problem of each given row of the space (rows of one model, any pp > 1)."""
    from planner.costmodel.batch import stage_costs

    model, cluster, job = space.model, space.cluster, space.job
    layers = model.num_hidden_layers
    unit = time_unit_s or space.time_unit_s
    cap = space.cap_units
    out: dict[int, SplitProblem] = {}
    rows = np.asarray(rows, dtype=np.int64)
    pps = space.knobs["pp"][rows]
    vpps = space.knobs["vpp"][rows]
    for pp in np.unique(pps).tolist():
        mine = rows[pps == pp]
        width = split_width(layers, pp)
        feats = pipeline.count_features(model, pp, width)
        knobs = {k: v[mine] for k, v in space.knobs.items() if k != "stage_layers"}
        t, mem = stage_costs(model, cluster, job, knobs, feats)
        t_units = np.rint(t / unit).astype(np.int64)
        m_units = np.rint(mem / GIB / MEM_UNIT_GIB).astype(np.int64)
        fits = mem / GIB <= cluster.gpu.usable_memory_gib
        m_units = np.where(fits, np.minimum(m_units, cap), np.maximum(m_units, cap + 1))
        # each stage at least least_layers (every chunk a layer but the two end chunks)
        n = np.arange(1, width + 1)[None, :]
        enough = {v: (n >= np.asarray(least_layers(pp, v))[:, None]).reshape(-1)
                  for v in np.unique(vpps[pps == pp]).tolist()}
        for j, r in enumerate(mine.tolist()):
            ok = fits[j] & enough[int(space.knobs["vpp"][r])]
            out[r] = SplitProblem(layers, t_units[j].reshape(pp, width),
                                  m_units[j].reshape(pp, width), ok.reshape(pp, width))
    return [out[int(r)] for r in rows]


def _minmax_dp(layers: int, cost: np.ndarray, allowed: np.ndarray
               ) -> tuple[int, list[int]] | None:
    """min over splits of max_i cost[i, n_i - 1] with allowed[i, n_i - 1] and sum n_i = layers;
    (value, counts) or None. best[l] = the lowest max over the stages so far holding l layers."""
    stages, width = cost.shape
    best = np.full(layers + 1, BIG, dtype=np.int64)
    best[0] = 0
    choice = np.zeros((stages, layers + 1), dtype=np.int64)
    for i in range(stages):
        new = np.full(layers + 1, BIG, dtype=np.int64)
        for n in range(1, width + 1):
            if not allowed[i, n - 1] or n > layers:
                continue
            cand = np.maximum(best[: layers + 1 - n], cost[i, n - 1])
            cand = np.where(best[: layers + 1 - n] >= BIG, BIG, cand)
            better = cand < new[n:]
            new[n:] = np.where(better, cand, new[n:])
            choice[i, n:][better] = n
        best = new
    if best[layers] >= BIG:
        return None
    counts, left = [], layers
    for i in range(stages - 1, -1, -1):
        n = int(choice[i, left])
        counts.append(n)
        left -= n
    return int(best[layers]), counts[::-1]


def split_dp(problem: SplitProblem) -> Split:
    """The exact oracle: dynamic programming over (stages, layers), first the lowest slowest-
    stage time over the splits that fit, then the lowest peak memory among those at that time."""
    first = _minmax_dp(problem.layers, problem.time, problem.fits)
    if first is None:
        return Split()
    slowest = first[0]
    second = _minmax_dp(problem.layers, problem.memory, problem.fits & (problem.time <= slowest))
    assert second is not None  # the first phase's split is one
    return Split(tuple(second[1]), slowest, second[0])


def _balanced_bound(space: Space, rows: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower bound on each row's step time over every split, whether some split can lower
    its slowest stage below the even rule's, whether some split may fit in memory). Stage
    times are linear in their layers (T_i(n) = a n + b_i, b_i the embedding or LM head
    alone); the lowest slowest-stage time with whole layers, T*, is the smallest T with
    sum_i floor((T - b_i) / a) >= layers and T >= every T_i(least_i) (least_layers: one
    layer, one a chunk when interleaved). It lies within one layer's time a above the
    balanced average (at T = that + a every stage holds one more layer than its share), so T*
    is the smallest of the pp candidates a ceil((lo - b_i) / a) + b_i that holds the layers.
    Plain 1F1B's step is (grad_accum - 1) x the slowest stage + the sum of all stage times
    (pipeline.bubble_time), and the sum is the same for every split, so the bound is
    (grad_accum - 1) x T* + that sum; interleaved, the bubble is bubble_slots x (sum - T*) /
    (pp - 1), which the general form m T* + slots (sum - T*) / (pp - 1) covers (equal to the
    above with vpp 1, and increasing in T* since slots <= pp - 1)."""
    from planner.costmodel.batch import stage_costs

    model, cluster, job = space.model, space.cluster, space.job
    layers = model.num_hidden_layers
    out = np.zeros(len(rows))
    gains = np.zeros(len(rows), dtype=bool)
    can_fit = np.zeros(len(rows), dtype=bool)
    pps = space.knobs["pp"][rows]
    for pp in np.unique(pps).tolist():
        mine = np.flatnonzero(pps == pp)
        feats = pipeline.count_features(model, pp, 2)  # every stage with 1 and 2 layers
        knobs = {k: v[rows[mine]] for k, v in space.knobs.items() if k != "stage_layers"}
        t, mem = stage_costs(model, cluster, job, knobs, feats)
        one, two = t[:, 0::2], t[:, 1::2]  # (rows, stages)
        a = np.maximum(two[:, 0] - one[:, 0], 1e-30)[:, None]  # time per layer
        fixed = one - a  # b_i: the embedding, the LM head, nothing on inner stages
        average = (a[:, 0] * layers + fixed.sum(axis=1)) / pp
        vpp = space.knobs["vpp"][rows[mine]]
        # every stage holds at least least_layers (one a chunk when interleaved)
        least = np.array([least_layers(pp, v) for v in range(1, int(vpp.max()) + 1)],
                         dtype=float)[vpp - 1]  # (rows, pp)
        floor_t = (a * least + fixed).max(axis=1)
        lo = np.maximum(np.maximum(average, one.max(axis=1)), floor_t)[:, None]
        eps = 1e-9 * lo
        cand = a * np.ceil((lo - fixed) / a - 1e-9) + fixed  # (rows, pp): one per stage
        cand = np.maximum(cand, lo)
        held = np.floor((cand[:, :, None] - fixed[:, None, :]) / a[:, :, None] + 1e-9)
        ok = held.sum(axis=2) >= layers - 1e-9
        best = np.where(ok, cand, np.inf).min(axis=1)
        rule = {v: even_totals(layers, pp, v) for v in np.unique(vpp).tolist()}
        even = np.array([rule[v] for v in vpp.tolist()], dtype=float)
        even_slowest = (a * even + fixed).max(axis=1)
        m = space.columns["grad_accum"][rows[mine]].astype(float)
        whole = a[:, 0] * layers + fixed.sum(axis=1)  # every stage's time: the same for any split
        slots = pipeline.bubble_slots(pp, vpp, m)
        out[mine] = m * best + slots * (whole - best) / (pp - 1)
        gains[mine] = best < even_slowest - eps[:, 0]
        # memory: a stage's peak is convex in its layers (linear terms and maxima of linear
        # terms: costmodel.memory), so the line through 1 and 2 layers lies below it beyond 2
        # and the layers it lets fit bound what any split can fit from above; a row whose
        # stages cannot hold the layers (or their least) that way fits under no split
        cap = cluster.gpu.usable_memory_gib * GIB
        m1, m2 = mem[:, 0::2], mem[:, 1::2]
        slope = np.maximum(m2 - m1, 1e-30)
        most = np.where(m1 <= cap, np.floor((cap - m1) / slope + 1e-9) + 1, 0)
        can_fit[mine] = (most >= least).all(axis=1) & (most.sum(axis=1) >= layers)
    return out, gains, can_fit


SPLIT_CHUNK = 32  # candidate layouts whose splits are solved between two updates of the bound


def improve_splits(space: Space, pins: Mapping[str, Any], top_k: int,
                   config: SolverConfig | None = None) -> tuple[Space, int]:
    """The space with each eligible layout's best split where it beats the even rule (module
    docstring); returns the new space and how many layouts the split search solved."""
    from planner.search.cpsat import SplitModel  # ortools only when a split is searched

    model = space.model
    if not len(space) or not pipeline.uniform_layers(model):
        return space, 0
    k = space.knobs
    mask = space.pin_mask(pins) & (k["pp"] > 1)
    if "stage_layers" in k:
        mask &= np.array([not s for s in k["stage_layers"]], dtype=bool)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return space, 0
    step = np.asarray(space.columns["step_time_s"])
    eligible = space.pin_mask(pins) & space.fits
    kth = np.inf
    if eligible.sum() >= top_k:
        kth = float(np.partition(step[eligible], top_k - 1)[top_k - 1])
    bound, gains, can_fit = _balanced_bound(space, rows)
    # a row can gain only if its best whole-layer split beats the K-th best plan, and lowers
    # the slowest stage below its even split's (or the even split does not fit)
    slack = 1e-9 * np.maximum(step[rows], 1.0)
    keep = (bound <= kth + slack) & (gains | ~space.fits[rows]) & (space.fits[rows] | can_fit)
    cand, bound = rows[keep], bound[keep]
    if not len(cand):
        return space, 0
    # branch and bound: the candidates by bound, SPLIT_CHUNK at a time; each chunk's better
    # splits lower the K-th best step time, and the rows whose bound no longer beats it are
    # left (their split cannot reach the top K). Mixtral on 65536 H100 at 2**20 sequences:
    # 532 splits solved -> (measured in docs/solve_speed.md)
    order = np.argsort(bound, kind="stable")
    cand, bound = cand[order], bound[order]
    current, current_fits = step.copy(), space.fits.copy()
    pinned = space.pin_mask(pins)
    found: dict[int, tuple[int, ...]] = {}
    solved: dict[bytes, Split] = {}  # layouts that differ in knobs the split ignores
    done = 0
    for start in range(0, len(cand), SPLIT_CHUNK):
        chunk = cand[start:start + SPLIT_CHUNK]
        live = bound[start:start + SPLIT_CHUNK] <= kth + 1e-9 * max(kth, 1.0)
        if not live.any():
            break  # sorted by bound: every later row is out as well
        chunk = chunk[live]
        done += len(chunk)
        new: dict[int, tuple[int, ...]] = {}
        for r, prob in zip(chunk.tolist(), split_problems(space, chunk), strict=True):
            pp, vpp = int(k["pp"][r]), int(k["vpp"][r])
            even = even_totals(model.num_hidden_layers, pp, vpp)
            even_obj = None
            if all(prob.fits[i, n - 1] for i, n in enumerate(even)):
                even_obj = prob.objective(even)[0]
            prob = prob.pruned(even_obj)
            key = prob.time.tobytes() + prob.memory.tobytes() + prob.fits.tobytes()
            if key not in solved:
                solved[key] = SplitModel(prob, config).solve()
            split = solved[key]
            if split.counts and split.counts != even:
                # interleaved: the stage's layers over its chunks (layout.chunks_of_stages)
                new[r] = (split.counts if vpp == 1
                          else tuple(chunks_of_stages(split.counts, vpp)))
        if new:
            found.update(new)
            idx = np.fromiter(new, dtype=np.int64)
            trial = _trial(space, idx, new)
            t_new = np.asarray(trial.columns["step_time_s"])
            better = trial.fits & (~current_fits[idx] | (t_new < current[idx]))
            current[idx[better]] = t_new[better]
            current_fits[idx[better]] = True
            eligible = pinned & current_fits
            if eligible.sum() >= top_k:
                kth = float(np.partition(current[eligible], top_k - 1)[top_k - 1])
    if not found:
        return space, done
    return _with_splits(space, found), done


def _trial(space: Space, rows: np.ndarray, found: Mapping[int, tuple[int, ...]]) -> Space:
    """The rows with the splits in `found`, evaluated by the cost model."""
    knobs = {k: v[rows] for k, v in space.knobs.items()}
    knobs["stage_layers"] = np.empty(len(rows), dtype=object)
    knobs["stage_layers"][:] = [found[int(r)] for r in rows]
    return evaluate(space.model, space.cluster, space.job, knobs)


def _with_splits(space: Space, found: Mapping[int, tuple[int, ...]]) -> Space:
    """A new space whose rows in `found` take those splits where the cost model says they are
    better (lower step time, or fitting where the even split does not)."""
    rows = np.fromiter(found, dtype=np.int64)
    trial = _trial(space, rows, found)
    old_step = np.asarray(space.columns["step_time_s"])[rows]
    new_step = np.asarray(trial.columns["step_time_s"])
    better = (trial.fits & ~space.fits[rows]) | (trial.fits & (new_step < old_step))
    if not better.any():
        return space
    take = rows[better]
    all_knobs = dict(space.knobs)
    splits = all_knobs.get("stage_layers")
    if splits is None:
        splits = np.empty(len(space), dtype=object)
        splits[:] = [()] * len(space)
    else:
        splits = splits.copy()
    splits[take] = [found[int(r)] for r in take]
    all_knobs["stage_layers"] = splits
    columns = {}
    for name, col in space.columns.items():
        col = np.array(col, copy=True)
        col[take] = np.asarray(trial.columns[name])[better]
        columns[name] = col
    return Space(space.model, space.cluster, space.job, all_knobs, columns)


def _minmax_block(start: np.ndarray, cost: np.ndarray, allowed: np.ndarray, layers: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Extend best-so-far values `start` (per layers used) over a block of stages (rows of
    cost/allowed): the new values and each stage's choice (stages, layers + 1)."""
    best = start.copy()
    stages, width = cost.shape
    choice = np.zeros((stages, layers + 1), dtype=np.int64)
    for i in range(stages):
        new = np.full(layers + 1, BIG, dtype=np.int64)
        for n in range(1, min(width, layers) + 1):
            if not allowed[i, n - 1]:
                continue
            prev = best[: layers + 1 - n]
            cand = np.where(prev >= BIG, BIG, np.maximum(prev, cost[i, n - 1]))
            better = cand < new[n:]
            new[n:] = np.where(better, cand, new[n:])
            choice[i, n:][better] = n
        best = new
    return best, choice


def _minmax_pools(layers: int, costs: Sequence[np.ndarray], allowed: Sequence[np.ndarray],
                  pool_stages: Sequence[int]) -> tuple[int, list[int], tuple[int, ...]] | None:
    """min over pool orders (each pool one block of consecutive stages) and splits of the
    highest stage cost: dynamic programming over (set of pools placed first, layers), each
    block by _minmax_block on the pool's own rows at the block's stage positions."""
    k = len(pool_stages)
    start = np.full(layers + 1, BIG, dtype=np.int64)
    start[0] = 0
    best: dict[int, np.ndarray] = {0: start}
    # every way into a set: (previous set, pool, its block's choices, the values it gives)
    back: dict[int, list[tuple[int, int, np.ndarray, np.ndarray]]] = {}
    for mask in range(1 << k):  # subsets in increasing order: every predecessor done first
        if mask not in best:
            continue
        offset = sum(pool_stages[j] for j in range(k) if mask >> j & 1)
        for j in range(k):
            if mask >> j & 1:
                continue
            rows = slice(offset, offset + pool_stages[j])
            vals, choice = _minmax_block(best[mask], costs[j][rows], allowed[j][rows], layers)
            nxt = mask | 1 << j
            best[nxt] = np.minimum(best[nxt], vals) if nxt in best else vals
            back.setdefault(nxt, []).append((mask, j, choice, vals))
    full = (1 << k) - 1
    if full not in best or best[full][layers] >= BIG:
        return None
    counts: list[int] = []
    order: list[int] = []
    mask, left = full, layers
    while mask:
        prev, j, choice, _ = next(b for b in back[mask] if b[3][left] == best[mask][left])
        block = []
        for i in range(choice.shape[0] - 1, -1, -1):
            n = int(choice[i, left])
            block.append(n)
            left -= n
        counts = block[::-1] + counts
        order.insert(0, j)
        mask = prev
    return int(best[full][layers]), counts, tuple(order)


def split_dp_pools(layers: int, pool_tables: Sequence[SplitProblem],
                   pool_stages: Sequence[int]) -> tuple[Split, tuple[int, ...]]:
    """The exact oracle on a cluster of pools: pool_tables[j] is the split problem as if every
    stage position ran on pool j's GPU (its time, memory and fits rows), pool_stages[j] how many
    stages pool j holds. Dynamic programming over (pools placed, layers, stages): the lowest
    slowest stage over every pool order and split, then the lowest peak memory at that time.
    Returns the split and the pool order (empty split when none fits)."""
    times = [p.time for p in pool_tables]
    fits = [p.fits for p in pool_tables]
    first = _minmax_pools(layers, times, fits, pool_stages)
    if first is None:
        return Split(), ()
    slowest = first[0]
    second = _minmax_pools(layers, [p.memory for p in pool_tables],
                           [f & (t <= slowest) for f, t in zip(fits, times, strict=True)],
                           pool_stages)
    assert second is not None  # the first phase's split is one
    return Split(tuple(second[1]), slowest, second[0]), second[2]

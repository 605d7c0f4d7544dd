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
(stages, layers) the tests hold it to. solve_splits runs that dynamic program first, batched
over problems of one shape, and takes its split where the optimum is unique (CP-SAT's answer
then); CP-SAT chooses where several splits tie.

improve_splits runs the split search inside `search`: a layout's split replaces the even
rule's (pipeline.stage_layer_counts) only where its re-evaluated step time is lower, or it fits
where the even one does not. Layouts whose step time cannot beat the K-th best plan even with
perfectly balanced stages (a lower bound from the linear stage times) are skipped, which keeps
the search exact for the top K, unless that bound could put them in the tie with the fastest
(planner.search.ties.join_cap): the tie's robust order picks plan 1 among its layouts, so all of
them are solved and plan 1 and the tie's count do not depend on K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.costmodel import pipeline
from planner.layout import chunks_of_stages
from planner.search import problem as _problem
from planner.search import ties
from planner.search.problem import MEM_UNIT_GIB, Space, Split
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
    """Layers per stage under the even rule (its chunks together; pipeline.stage_counts)."""
    return tuple(pipeline.stage_counts(layers, pp, vpp))


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


def _shifts(layers: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(index, valid) of shape (width, layers + 1): a stage taking n = row + 1 layers to reach
    l = column layers follows l - n layers on the stages before it (valid where l >= n)."""
    idx = np.arange(layers + 1)[None, :] - np.arange(1, width + 1)[:, None]
    return np.maximum(idx, 0), idx >= 0


def _minmax_batch(layers: int, cost: np.ndarray, allowed: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """_minmax_dp over a batch of problems of one shape ((P, stages, width) tables), each
    stage's counts in one numpy step: (optimum per problem, BIG where none; choices
    (P, stages, layers + 1), the smallest count among equal values as _minmax_dp picks)."""
    batch, stages, width = cost.shape
    idx, valid = _shifts(layers, width)
    best = np.full((batch, layers + 1), BIG, dtype=np.int64)
    best[:, 0] = 0
    choice = np.zeros((batch, stages, layers + 1), dtype=np.int64)
    for i in range(stages):
        prev = best[:, idx]  # (P, width, layers + 1)
        ok = valid[None] & allowed[:, i, :, None] & (prev < BIG)
        cand = np.where(ok, np.maximum(prev, cost[:, i, :, None]), BIG)
        pick = np.argmin(cand, axis=1)
        best = np.take_along_axis(cand, pick[:, None, :], axis=1)[:, 0, :]
        choice[:, i] = pick + 1
    return best[:, layers], choice


def _counts_of(choice: np.ndarray, layers: int) -> tuple[int, ...]:
    """The split a (stages, layers + 1) choice table leads to, back from the last stage."""
    counts, left = [], layers
    for i in range(choice.shape[0] - 1, -1, -1):
        n = int(choice[i, left])
        counts.append(n)
        left -= n
    return tuple(counts[::-1])


def _ways_batch(layers: int, allowed: np.ndarray, cap: int = 2) -> np.ndarray:
    """How many splits use only allowed counts ((P, stages, width)), per problem, up to cap."""
    batch, stages, width = allowed.shape
    idx, valid = _shifts(layers, width)
    ways = np.zeros((batch, layers + 1), dtype=np.int64)
    ways[:, 0] = 1
    for i in range(stages):
        take = valid[None] & allowed[:, i, :, None]
        ways = np.minimum(np.where(take, ways[:, idx], 0).sum(axis=1), cap)
    return ways[:, layers]


def solve_splits(layers: int, time: np.ndarray, memory: np.ndarray, fits: np.ndarray,
                 config: SolverConfig | None = None) -> list[Split]:
    """CP-SAT's answers (cpsat.SplitModel) to a batch of split problems of one shape
    ((P, stages, width) tables), fast: the dynamic program finds each optimum (slowest stage,
    then peak memory; exact, the tests hold CP-SAT to it) and counts the splits that reach it.
    Where one split does, it is the split any exact solver returns, CP-SAT included, and CP-SAT
    is not run; where several tie, CP-SAT chooses among them as before (its choice is what the
    plans show). Mixtral on 65536 H100 at 2**20 sequences: 135 problems, every optimum unique,
    4 ms per CP-SAT solve -> ~0.1 ms each."""
    slowest, _ = _minmax_batch(layers, time, fits)
    feasible = slowest < BIG
    within = fits & (time <= slowest[:, None, None])
    peak, choice = _minmax_batch(layers, memory, within)
    ways = _ways_batch(layers, within & (memory <= peak[:, None, None]))
    out = []
    for p in range(len(slowest)):
        if not _problem.EXACT_SHORTCUTS:  # the reference: CP-SAT on every problem
            from planner.search.cpsat import SplitModel

            out.append(SplitModel(SplitProblem(layers, time[p], memory[p], fits[p]),
                                  config).solve())
        elif not feasible[p]:
            out.append(Split())  # no split fits: CP-SAT says INFEASIBLE (or its model is empty)
        elif ways[p] == 1:
            out.append(Split(_counts_of(choice[p], layers), int(slowest[p]), int(peak[p])))
        else:
            from planner.search.cpsat import SplitModel

            problem = SplitProblem(layers, time[p], memory[p], fits[p])
            out.append(SplitModel(problem, config).solve())
    return out


def solve_split(problem: SplitProblem, config: SolverConfig | None = None) -> Split:
    """CP-SAT's answer to one split problem, through solve_splits' exact fast path."""
    return solve_splits(problem.layers, problem.time[None], problem.memory[None],
                        problem.fits[None], config)[0]


def _pruned_fits(layers: int, time: np.ndarray, fits: np.ndarray, bound: np.ndarray,
                 bounded: np.ndarray) -> np.ndarray:
    """SplitProblem.pruned over a batch of one shape ((P, stages, width)): `bound` the slowest
    stage of a known split where `bounded`; the same fits, problem by problem."""
    fits = fits & (~bounded[:, None, None] | (time <= bound[:, None, None]))
    n = np.arange(1, fits.shape[2] + 1)
    active = np.ones(len(fits), dtype=bool)
    for _ in range(2):
        most = np.where(fits, n, 0).max(axis=2)  # (P, stages)
        active &= ~(most == 0).any(axis=1)  # a stage that fits nowhere: pruning stops
        least = np.where(active[:, None], np.where(fits, n, BIG).min(axis=2), 0)  # no overflow
        most = np.where(active[:, None], most, 0)
        lo = layers - (most.sum(axis=1, keepdims=True) - most)
        hi = layers - (least.sum(axis=1, keepdims=True) - least)
        trim = (n >= lo[:, :, None]) & (n <= hi[:, :, None])
        fits = np.where(active[:, None, None], fits & trim, fits)
    return fits


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
        best = _lowest_holding(cand, fixed, a, layers)
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


def _lowest_holding(cand: np.ndarray, fixed: np.ndarray, a: np.ndarray, layers: int
                    ) -> np.ndarray:
    """Per row, the smallest candidate slowest-stage time cand[:, j] at which the stages hold
    the layers (sum_i floor((cand_j - fixed_i) / a + 1e-9) >= layers), inf where none does.
    Stages with the same `fixed` column (every inner stage) have the same candidate and the
    same count, so the sum is taken over the distinct columns times their multiplicity: exact,
    the counts being integers far below 2**52 (checked; else every stage pair, (rows, pp, pp),
    0.17 s of the bound on Mixtral's 50k pipelined rows on 65536 H100)."""
    keep: list[int] = []
    mult: list[int] = []
    for j in range(fixed.shape[1]):
        for g, c in enumerate(keep):
            if np.array_equal(fixed[:, j], fixed[:, c]):
                mult[g] += 1
                break
        else:
            keep.append(j)
            mult.append(1)
    cd, fx = cand[:, keep], fixed[:, keep]
    held = np.floor((cd[:, :, None] - fx[:, None, :]) / a[:, :, None] + 1e-9)
    if np.isfinite(held).all() and np.abs(held).max(initial=0.0) * fixed.shape[1] < 2.0**52:
        ok = (held * np.asarray(mult, dtype=float)).sum(axis=2) >= layers - 1e-9
        return np.where(ok, cd, np.inf).min(axis=1)
    held = np.floor((cand[:, :, None] - fixed[:, None, :]) / a[:, :, None] + 1e-9)
    ok = held.sum(axis=2) >= layers - 1e-9
    return np.where(ok, cand, np.inf).min(axis=1)


SPLIT_CHUNK = 32  # candidate layouts whose splits are solved between two updates of the bound
SPLIT_WINDOW = 16  # chunks solved and re-evaluated ahead of the bound's updates (replayed)


def improve_splits(space: Space, pins: Mapping[str, Any], top_k: int,
                   config: SolverConfig | None = None) -> tuple[Space, int, np.ndarray]:
    """The space with each eligible layout's best split where it beats the even rule (module
    docstring); returns the new space, how many layouts the split search solved, and per row
    a lower bound on the step time (seconds) of the layouts the search left unsolved because
    they cannot reach the top K, although a split might lower their time (inf elsewhere: the
    row's time is its best). The tie with the fastest (planner.search.ties) reads it: such a
    row may belong to the tie, whose count is then a lower bound."""
    model = space.model
    uniform = pipeline.uniform_layers(model)
    floor = np.full(len(space), np.inf)
    if not len(space) or (not uniform and pipeline.dense_prefix(model) is None):
        return space, 0, floor
    k = space.knobs
    pinned = space.pin_mask(pins)
    mask = pinned & (k["pp"] > 1)
    if "stage_layers" in k:
        mask &= np.array([not s for s in k["stage_layers"]], dtype=bool)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return space, 0, floor
    step = np.asarray(space.columns["step_time_s"])
    eligible = pinned & space.fits
    kth = np.inf
    if eligible.sum() >= top_k:
        kth = float(np.partition(step[eligible], top_k - 1)[top_k - 1])
    # the largest bound at which a row may still join the tie with the fastest (ties.join_cap):
    # such a row is solved whatever top_k, since the tie's robust order picks plan 1 among its
    # rows (an unsolved split there let plan 1 change with --top)
    cap = ties.join_cap(space, eligible)[rows]
    bound, gains, can_fit = (_balanced_bound(space, rows) if uniform
                             else _balanced_bound_kinds(space, rows, max(kth, cap.max())))
    # a row can gain only if its best whole-layer split beats the K-th best plan or may join
    # the tie, and lowers the slowest stage below its even split's (or the even one does not fit)
    slack = 1e-9 * np.maximum(step[rows], 1.0)
    may_gain = (gains | ~space.fits[rows]) & (space.fits[rows] | can_fit)
    joins = bound <= cap + slack
    keep = ((bound <= kth + slack) | joins) & may_gain
    floor[rows[may_gain]] = bound[may_gain]  # the rows solved below are set back to inf
    cand, bound, joins = rows[keep], bound[keep], joins[keep]
    if not len(cand):
        return space, 0, floor
    # branch and bound: the candidates by bound, SPLIT_CHUNK at a time; each chunk's better
    # splits lower the K-th best step time, and the rows whose bound no longer beats it are
    # left (their split cannot reach the top K). The work is done SPLIT_WINDOW chunks ahead:
    # the splits of every row of the window still live, and their re-evaluation, in one pass
    # (a row's split and its cost are its own: the numbers do not depend on which rows are
    # solved together); then the chunks are replayed in order with the bound's updates, so the
    # rows taken and the K-th best are exactly the chunk-by-chunk search's. Mixtral on 65536
    # H100 at 2**20 sequences: 1,709 splits, 54 chunks, 41 cost-model calls -> 4.
    order = np.argsort(bound, kind="stable")
    cand, bound, joins = cand[order], bound[order], joins[order]
    current, current_fits = step.copy(), space.fits.copy()
    best_k = _KthBest(current, pinned & current_fits, top_k)
    found: dict[int, tuple[int, ...]] = {}
    solved: dict[bytes, Split] = {}  # layouts that differ in knobs the split ignores
    costed: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []  # (rows, their columns)
    done, start, finished = 0, 0, False
    window = SPLIT_WINDOW if _problem.EXACT_SHORTCUTS else 1
    while start < len(cand) and not finished:
        stop = min(start + SPLIT_CHUNK * window, len(cand))
        ahead = cand[start:stop][(bound[start:stop] <= kth + 1e-9 * max(kth, 1.0))
                                 | joins[start:stop]]
        splits = _solve_rows(space, ahead, solved, config)
        position: dict[int, int] = {}
        if splits:
            idx = np.fromiter(splits, dtype=np.int64)
            trial = _trial(space, idx, splits)
            costed.append((idx, trial))
            position = {r: j for j, r in enumerate(idx.tolist())}
        for at in range(start, stop, SPLIT_CHUNK):
            chunk = cand[at:at + SPLIT_CHUNK]
            live = ((bound[at:at + SPLIT_CHUNK] <= kth + 1e-9 * max(kth, 1.0))
                    | joins[at:at + SPLIT_CHUNK])
            if not live.any() and not joins[at:].any():
                finished = True  # sorted by bound: every later row is out as well
                break
            chunk = chunk[live]
            done += len(chunk)
            floor[chunk] = np.inf
            new = {r: splits[r] for r in chunk.tolist() if r in splits}
            if not new:
                continue
            found.update(new)
            idx = np.fromiter(new, dtype=np.int64)
            at_rows = np.array([position[r] for r in new], dtype=np.int64)
            t_new = np.asarray(trial["step_time_s"])[at_rows]
            fits_new = _fits(trial)[at_rows]
            better = fits_new & (~current_fits[idx] | (t_new < current[idx]))
            current[idx[better]] = t_new[better]
            current_fits[idx[better]] = True
            kth = best_k.update(idx[better & pinned[idx]])
        start = stop
    if not found:
        return space, done, floor
    return _with_splits(space, found, costed), done, floor


class _KthBest:
    """The K-th smallest of `values` over the eligible rows (inf while fewer than K), kept as
    rows are lowered or become eligible: the K smallest before an update and the updated rows
    hold the K smallest after it (every other row is at or above the old K-th). Equal to
    np.partition over every eligible row (the K-th value, whichever rows tie), without its
    2 ms per update over Mixtral's 161k rows."""

    def __init__(self, values: np.ndarray, eligible: np.ndarray, k: int) -> None:
        self.values, self.k = values, k  # `values` is updated in place by the caller
        rows = np.flatnonzero(eligible)
        self.eligible = eligible.copy()
        self.count = len(rows)
        self.top = self._smallest(rows) if self.count >= k else None

    def _smallest(self, rows: np.ndarray) -> np.ndarray:
        return rows[np.argpartition(self.values[rows], self.k - 1)[: self.k]]

    @property
    def kth(self) -> float:
        return np.inf if self.top is None else float(self.values[self.top].max())

    def update(self, rows: np.ndarray) -> float:
        """`rows` (eligible now) were lowered or became eligible; the new K-th value."""
        fresh = rows[~self.eligible[rows]]
        self.eligible[fresh] = True
        self.count += len(np.unique(fresh))
        if not _problem.EXACT_SHORTCUTS:  # the reference: a partition over every eligible row
            if self.count >= self.k:
                self.top = self._smallest(np.flatnonzero(self.eligible))
            return self.kth
        if self.top is None:
            if self.count >= self.k:
                self.top = self._smallest(np.flatnonzero(self.eligible))
        elif len(rows):
            self.top = self._smallest(np.union1d(self.top, rows))
        return self.kth


def _solve_rows(space: Space, rows: np.ndarray, solved: dict[bytes, Split],
                config: SolverConfig | None) -> dict[int, tuple[int, ...]]:
    """The best split of each row where one fits and differs from the even rule's. Each
    problem is pruned to the counts that can beat the even split's slowest stage (or that fit,
    when the even split does not; SplitProblem.pruned) and solved once per distinct table
    (`solved`); the rows of one pp as one batch."""
    layers = space.model.num_hidden_layers
    out: dict[int, tuple[int, ...]] = {}
    if not len(rows):
        return out
    if not pipeline.uniform_layers(space.model):
        return _solve_kind_rows(space, rows, solved)
    problems = split_problems(space, rows)
    pps, vpps = space.knobs["pp"][rows], space.knobs["vpp"][rows]
    for pp, vpp in sorted(set(zip(pps.tolist(), vpps.tolist(), strict=True))):
        sel = np.flatnonzero((pps == pp) & (vpps == vpp))
        time = np.stack([problems[j].time for j in sel])
        memory = np.stack([problems[j].memory for j in sel])
        fits = np.stack([problems[j].fits for j in sel])
        even = even_totals(layers, pp, vpp)
        at = (slice(None), np.arange(pp), np.asarray(even) - 1)
        fits = _pruned_fits(layers, time, fits, time[at].max(axis=1), fits[at].all(axis=1))
        keys = [time[p].tobytes() + memory[p].tobytes() + fits[p].tobytes()
                for p in range(len(sel))]
        fresh: dict[bytes, int] = {}
        for p, key in enumerate(keys):
            if key not in solved:
                fresh.setdefault(key, p)
        if fresh:
            todo = np.fromiter(fresh.values(), dtype=np.int64)
            answers = solve_splits(layers, time[todo], memory[todo], fits[todo], config)
            solved.update(zip(fresh, answers, strict=True))
        for p, key in zip(sel.tolist(), keys, strict=True):
            split = solved[key]
            if split.counts and split.counts != even:
                out[int(rows[p])] = split.counts
    return _spread(space, out)


def _trial(space: Space, rows: np.ndarray, found: Mapping[int, tuple[int, ...]]
           ) -> dict[str, np.ndarray]:
    """The cost model's columns of the rows with the splits in `found` (no Space: the split
    search reads only their step time and fits)."""
    from planner.costmodel import estimate_batch

    knobs = {k: v[rows] for k, v in space.knobs.items()}
    knobs["stage_layers"] = np.empty(len(rows), dtype=object)
    knobs["stage_layers"][:] = [found[int(r)] for r in rows]
    return estimate_batch(space.model, space.cluster, space.job, knobs)


def _fits(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """The cost model's fits as the search reads it: Space.fits is exactly this column
    (problem.scale_memory keeps `memory <= capacity` in integers where the model says fits)."""
    return np.asarray(columns["fits"], dtype=bool)


def _with_splits(space: Space, found: Mapping[int, tuple[int, ...]],
                 costed: Sequence[tuple[np.ndarray, dict[str, np.ndarray]]]) -> Space:
    """A new space whose rows in `found` take those splits where the cost model says they are
    better (lower step time, or fitting where the even split does not); `costed` holds the
    rows' columns under their splits (_trial's, one entry per window)."""
    rows = np.fromiter(found, dtype=np.int64)
    every = np.concatenate([idx for idx, _ in costed])
    position = {r: j for j, r in enumerate(every.tolist())}
    take_rows = np.array([position[r] for r in rows.tolist()], dtype=np.int64)
    trial = {name: np.concatenate([np.asarray(cols[name]) for _, cols in costed])[take_rows]
             for name in costed[0][1]}
    trial_fits = _fits(trial)
    old_step = np.asarray(space.columns["step_time_s"])[rows]
    new_step = np.asarray(trial["step_time_s"])
    better = (trial_fits & ~space.fits[rows]) | (trial_fits & (new_step < old_step))
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
        col[take] = np.asarray(trial[name])[better]
        columns[name] = col
    return Space(space.model, space.cluster, space.job, all_knobs, columns,
                 crossing_given=space.crossing,  # the same degrees row by row
                 batch_cost=space.batch_cost)


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


# ---- mixed layer kinds: the first k layers dense, the rest MoE (pipeline.dense_prefix) -------
# A stage's cost then depends on how many of the dense layers it holds, which its position
# decides: with plain 1F1B the stages before it hold l layers, so it holds clamp(k - l, 0, n)
# dense ones; interleaved, the dense layers sit in the first round of chunks (chunk c on stage
# c mod pp; each stage's layers spread over its chunks by layout.stage_chunks, the spread the
# split search writes), stage i's first chunk after the first chunks of stages 0..i-1. The
# dynamic program below carries (layers placed, dense-round layers placed, capped at k) as its
# state, so it is exact for that problem: stage totals, the chunks spread by stage_chunks, and
# (vpp > 1) every dense layer in the first round of chunks (a split that leaves dense layers to
# the second round is not searched). It picks the smallest count first among equal values
# (stages in order); CP-SAT's split model reads one table per stage and is not run here.


@dataclass(frozen=True)
class KindSplitProblem:
    """Layers on stages when the first k layers are dense: stage i holding n layers (1..width)
    of which d dense (0..k) takes time[i, n-1, d] and memory[i, n-1, d], allowed where fits;
    first[i, n-1] is the layers of its first chunk (n with vpp 1)."""

    layers: int
    k: int
    time: np.ndarray  # (stages, width, k + 1) int64
    memory: np.ndarray
    fits: np.ndarray  # bool
    first: np.ndarray  # (stages, width) int64

    @property
    def stages(self) -> int:
        return self.time.shape[0]

    def objective(self, counts: Sequence[int]) -> tuple[int, int] | None:
        """(slowest stage time, highest stage memory) of a split, None where it is not allowed
        (a count that does not fit, or dense layers left beyond the first round)."""
        placed, t, m = 0, 0, 0
        for i, n in enumerate(counts):
            if not 1 <= n <= self.time.shape[1]:
                return None
            r = int(self.first[i, n - 1])
            d = min(max(self.k - placed, 0), r)
            placed += r
            if not self.fits[i, n - 1, d]:
                return None
            t, m = max(t, int(self.time[i, n - 1, d])), max(m, int(self.memory[i, n - 1, d]))
        return (t, m) if placed >= self.k and sum(counts) == self.layers else None


@lru_cache(maxsize=1024)
def first_chunks(pp: int, vpp: int, width: int) -> np.ndarray:
    """(pp, width): the layers of stage i's first chunk when it holds n = 1..width layers."""
    from planner.layout import stage_chunks

    n = np.arange(1, width + 1)
    if vpp == 1:
        out = np.broadcast_to(n, (pp, width)).copy()
    else:
        out = np.array([[stage_chunks(int(c), vpp, i == 0)[0] for c in n] for i in range(pp)],
                       dtype=np.int64)
    out.flags.writeable = False  # shared by every problem of the shape (lru_cache)
    return out


def kind_split_problems(space: Space, rows: Sequence[int], k: int) -> list[KindSplitProblem]:
    """The mixed-kind split problem of each given row (pp > 1): its tables from the cost
    model's own stage terms (costmodel.batch.stage_costs on pipeline.kind_features)."""
    from planner.costmodel.batch import stage_costs

    model, cluster, job = space.model, space.cluster, space.job
    layers, unit, cap = model.num_hidden_layers, space.time_unit_s, space.cap_units
    rows = np.asarray(rows, dtype=np.int64)
    out: dict[int, KindSplitProblem] = {}
    pps = space.knobs["pp"][rows]
    for pp in np.unique(pps).tolist():
        mine = rows[pps == pp]
        width = split_width(layers, pp)
        feats = pipeline.kind_features(model, pp, width, k)
        knobs = {key: v[mine] for key, v in space.knobs.items() if key != "stage_layers"}
        t, mem = stage_costs(model, cluster, job, knobs, feats)
        shape = (len(mine), pp, width, k + 1)
        t_units = np.rint(t / unit).astype(np.int64).reshape(shape)
        m_units = np.rint(mem / GIB / MEM_UNIT_GIB).astype(np.int64).reshape(shape)
        fits = (mem / GIB <= cluster.gpu.usable_memory_gib).reshape(shape)
        m_units = np.where(fits, np.minimum(m_units, cap), np.maximum(m_units, cap + 1))
        n = np.arange(1, width + 1)[:, None]
        d = np.arange(k + 1)[None, :]
        for j, r in enumerate(mine.tolist()):
            vpp = int(space.knobs["vpp"][r])
            least = np.asarray(least_layers(pp, vpp))[:, None, None]
            ok = fits[j] & (d <= n)[None] & (n[None] >= least)
            out[r] = KindSplitProblem(layers, k, t_units[j], m_units[j], ok,
                                      first_chunks(pp, vpp, width))
    return [out[int(r)] for r in rows]


def _kinds_dp(layers: int, k: int, cost: np.ndarray, allowed: np.ndarray, first: np.ndarray,
              track: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """min over splits of the highest cost[i, n_i - 1, d_i] over a batch of problems of one
    shape ((P, stages, width, k + 1) tables, first (stages, width)): dynamic programming over
    (layers placed, first-round layers placed capped at k), each stage's counts at once per
    previous state (_shifts). Returns (optimum per problem, BIG where none; the choices
    (P, stages, layers + 1, k + 1, 2): count and previous state, in a fixed tie order)."""
    batch, stages, width, _ = cost.shape
    idx, valid = _shifts(layers, width)
    best = np.full((batch, layers + 1, k + 1), BIG, dtype=np.int64)
    best[:, 0, 0] = 0
    choice = np.zeros((batch, stages, layers + 1, k + 1, 2) if track else (0,), dtype=np.int64)
    cols = np.arange(width)
    counts = cols + 1
    for i in range(stages):
        new = np.full_like(best, BIG)
        r = first[i]
        for p in range(k + 1):
            if (best[:, :, p] >= BIG).all():
                continue  # no split reaches this many first-round layers here
            d = np.minimum(k - p, r)
            p2 = np.minimum(k, p + r)
            prev = np.where(valid[None], best[:, idx, p], BIG)  # (P, width, layers + 1)
            c = cost[:, i, cols, d][:, :, None]
            ok = allowed[:, i, cols, d][:, :, None] & (prev < BIG)
            cand = np.where(ok, np.maximum(prev, c), BIG)
            groups: dict[int, list[int]] = {}
            for j, target in enumerate(p2.tolist()):
                groups.setdefault(target, []).append(j)
            for target, members in groups.items():
                sel = np.asarray(members)
                sub = cand[:, sel] if len(members) < width else cand
                if not track:
                    new[:, :, target] = np.minimum(new[:, :, target], sub.min(axis=1))
                    continue
                pick = np.argmin(sub, axis=1)
                val = np.take_along_axis(sub, pick[:, None, :], axis=1)[:, 0, :]
                better = val < new[:, :, target]
                new[:, :, target] = np.where(better, val, new[:, :, target])
                choice[:, i, :, target, 0] = np.where(better, counts[sel][pick],
                                                      choice[:, i, :, target, 0])
                choice[:, i, :, target, 1] = np.where(better, p, choice[:, i, :, target, 1])
        best = new
    return best[:, layers, k], choice


def _kinds_counts(choice: np.ndarray, layers: int, k: int) -> tuple[int, ...]:
    """The split a (stages, layers + 1, k + 1, 2) choice table leads to, from the last stage."""
    counts, left, p = [], layers, k
    for i in range(choice.shape[0] - 1, -1, -1):
        n, p = (int(x) for x in choice[i, left, p])
        counts.append(n)
        left -= n
    return tuple(counts[::-1])


def solve_kind_splits(problems: Sequence[KindSplitProblem]) -> list[Split]:
    """The best split of each problem (one shape), exact: the lowest slowest stage, then the
    lowest peak memory among those (where several splits tie, the dynamic program's own)."""
    if not problems:
        return []
    p0 = problems[0]
    layers, k = p0.layers, p0.k
    fits = np.stack([p.fits for p in problems])
    # the counts no problem allows are left out of the tables (the optimum is unchanged)
    width = int(np.flatnonzero(fits.any(axis=(0, 1, 3)))[-1]) + 1 if fits.any() else 1
    fits = fits[:, :, :width]
    time = np.stack([p.time[:, :width] for p in problems])
    memory = np.stack([p.memory[:, :width] for p in problems])
    first = p0.first[:, :width]
    slowest, _ = _kinds_dp(layers, k, time, fits, first, track=False)
    within = fits & (time <= slowest[:, None, None, None])
    peak, choice = _kinds_dp(layers, k, memory, within, first)
    return [Split() if slowest[j] >= BIG else
            Split(_kinds_counts(choice[j], layers, k), int(slowest[j]), int(peak[j]))
            for j in range(len(problems))]


def kind_split_brute(problem: KindSplitProblem) -> tuple[tuple[int, int] | None,
                                                         list[tuple[int, ...]]]:
    """The oracle: every split of the layers into the stages' counts, by enumeration; the best
    (slowest, peak) and every split that reaches it."""
    import itertools

    best, where = None, []
    width = problem.time.shape[1]
    for counts in itertools.product(range(1, width + 1), repeat=problem.stages):
        if sum(counts) != problem.layers:
            continue
        obj = problem.objective(counts)
        if obj is None:
            continue
        if best is None or obj < best:
            best, where = obj, [counts]
        elif obj == best:
            where.append(counts)
    return best, where


@lru_cache(maxsize=4096)
def _even_chunks(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The even rule's layers per stage (vpp 1) or per virtual stage."""
    return tuple(pipeline.stage_layer_counts(layers, pp * vpp))


def _spread(space: Space, found: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Each row's split as the layers it states: per stage with vpp 1; interleaved, per virtual
    stage, spread by layout.chunks_of_stages with or without the last chunk emptied, whichever
    has the shorter steady-state round (costmodel.batch.round_period; the default on a tie)."""
    from planner.costmodel.batch import _Knobs, layout_arrays, round_period

    out = {r: c for r, c in found.items() if int(space.knobs["vpp"][r]) == 1}
    inter = np.array([r for r in found if int(space.knobs["vpp"][r]) > 1], dtype=np.int64)
    if not len(inter):
        return out
    model, cluster, job = space.model, space.cluster, space.job
    knobs = {k: v[inter] for k, v in space.knobs.items() if k != "stage_layers"}
    options = []
    for empty in (False, True):
        chunks = [tuple(chunks_of_stages(found[int(r)], int(space.knobs["vpp"][r]), empty))
                  for r in inter]
        col = np.empty(len(inter), dtype=object)
        col[:] = chunks
        lo = layout_arrays({**knobs, "stage_layers": col})
        options.append((chunks, round_period(model, cluster, job, _Knobs.of(lo, job, model),
                                             lo)))
    (plain, p_plain), (emptied, p_empty) = options
    for j, r in enumerate(inter.tolist()):
        out[r] = emptied[j] if p_empty[j] < p_plain[j] else plain[j]
    return out


def _solve_kind_rows(space: Space, rows: np.ndarray, solved: dict[bytes, Split]
                     ) -> dict[int, tuple[int, ...]]:
    """_solve_rows for a model with dense first layers: each row's mixed-kind split problem
    solved once per distinct table; the split where one fits and its chunks differ from the
    even rule's (layers per stage with vpp 1, per virtual stage otherwise)."""

    model = space.model
    layers, k = model.num_hidden_layers, pipeline.dense_prefix(model)
    assert k is not None
    out: dict[int, tuple[int, ...]] = {}
    problems = kind_split_problems(space, rows, k)
    # a count whose stage is slower than the even split's slowest stage is in no split that
    # beats it (where the even split fits; SplitProblem.pruned's first rule)
    even_slowest = np.rint(np.asarray(space.columns["stage_mb_s"])[rows]
                           / space.time_unit_s).astype(np.int64)
    problems = [replace(pr, fits=pr.fits & (pr.time <= bound)) if fit else pr
                for pr, bound, fit in zip(problems, even_slowest.tolist(),
                                          space.fits[rows].tolist(), strict=True)]
    pps, vpps = space.knobs["pp"][rows], space.knobs["vpp"][rows]
    for pp, vpp in sorted(set(zip(pps.tolist(), vpps.tolist(), strict=True))):
        sel = np.flatnonzero((pps == pp) & (vpps == vpp)).tolist()
        keys = [b"kinds" + problems[j].time.tobytes() + problems[j].memory.tobytes()
                + problems[j].fits.tobytes() + problems[j].first.tobytes() for j in sel]
        fresh: dict[bytes, int] = {}
        for j, key in zip(sel, keys, strict=True):
            if key not in solved:
                fresh.setdefault(key, j)
        if fresh:
            answers = solve_kind_splits([problems[j] for j in fresh.values()])
            solved.update(zip(fresh, answers, strict=True))
        for j, key in zip(sel, keys, strict=True):
            split = solved[key]
            if split.counts:
                out[int(rows[j])] = split.counts
    spread = _spread(space, out)
    knobs = space.knobs
    return {r: c for r, c in spread.items()
            if c != _even_chunks(layers, int(knobs["pp"][r]), int(knobs["vpp"][r]))}


def _feature_rows(feats: pipeline.StageFeatures, at: list[int]) -> pipeline.StageFeatures:
    """The given rows of stage features."""
    return pipeline.StageFeatures(*(getattr(feats, f)[at]
                                    for f in pipeline.StageFeatures.__dataclass_fields__))


def _balanced_bound_kinds(space: Space, rows: np.ndarray, kth: float = np.inf
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_balanced_bound for a model with dense first layers: the same closed form, T* the
    smallest T at which the stages can hold the dearer kind's layers (each stage within T
    holds at most floor((T - b_i) / a_dearer) of them; the cheaper layers only add to a
    stage's count) and at least the stages' average (their sum is the same for every split:
    a_dense k + a_moe (L - k) + sum b_i) and each stage's least layers at the cheaper kind's
    time; gains against the even split's own slowest stage (the column stage_mb_s); may fit
    where the stages can hold the layers by the MoE-only memory line (below), read only for
    the rows whose bound reaches `kth` (the others are left whatever their memory). A stage's
    time per micro-batch does not read zero or dp (costmodel.batch._stage_times), so the
    stage terms are costed once per distinct row of the other knobs."""
    from planner.costmodel.batch import stage_costs

    model, cluster, job = space.model, space.cluster, space.job
    layers, k = model.num_hidden_layers, pipeline.dense_prefix(model)
    assert k is not None
    out = np.zeros(len(rows))
    gains = np.zeros(len(rows), dtype=bool)
    can_fit = np.zeros(len(rows), dtype=bool)
    pps = space.knobs["pp"][rows]
    for pp in np.unique(pps).tolist():
        mine = np.flatnonzero(pps == pp)
        # rows (i, n, d): (i, 1, 0) one MoE layer, (i, 1, 1) one dense, (i, 2, 0) two MoE, of
        # the first, an inner and the last stage (a stage's time does not depend on its index
        # beyond the embedding and the head: every inner stage is stage 1's)
        # and one and two MoE layers on every stage (memory depends on the stage's in-flight
        # micro-batches)
        feats = pipeline.kind_features(model, pp, 2, k)
        ends = [0, 1, pp - 1] if pp > 2 else [0, 1]
        pick = [(i * 2 + n) * (k + 1) + d for i in ends for n, d in ((0, 0), (0, 1), (1, 0))]
        moe_rows = [(i * 2 + n) * (k + 1) for i in range(pp) for n in (0, 1)]


        knobs = {key: v[rows[mine]] for key, v in space.knobs.items() if key != "stage_layers"}
        cols = [np.asarray(v, dtype=np.int64) for name, v in knobs.items()
                if name not in ("zero", "dp")]
        radix = [int(c.max()) + 1 for c in cols]
        if float(np.prod(radix, dtype=float)) < 2.0**62:  # packed into one key (mixed radix)
            key = np.zeros(len(mine), dtype=np.int64)
            for col, base in zip(cols, radix, strict=True):
                key = key * base + col
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        else:
            _, first, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_index=True,
                                          return_inverse=True)
        t, _ = stage_costs(model, cluster, job, {key: v[first] for key, v in knobs.items()},
                           _feature_rows(feats, pick), memory=False)
        t = t[inverse.reshape(-1)].reshape(len(mine), len(ends), 3)
        stage_of = [0] + [1] * (pp - 2) + [len(ends) - 1]  # each stage's representative
        t = t[:, stage_of]
        one_moe, one_dense, two_moe = t[:, :, 0], t[:, :, 1], t[:, :, 2]
        a_moe = (two_moe - one_moe).min(axis=1)
        fixed = one_moe - a_moe[:, None]
        a_dense = (one_dense - fixed).min(axis=1)
        a_lo = np.maximum(np.minimum(a_moe, a_dense), 1e-30)[:, None]
        vpp = space.knobs["vpp"][rows[mine]]
        least = np.array([least_layers(pp, v) for v in range(1, int(vpp.max()) + 1)],
                         dtype=float)[vpp - 1]
        floor_t = (a_lo * least + fixed).max(axis=1)
        whole = a_dense * k + a_moe * (layers - k) + fixed.sum(axis=1)
        lo = np.maximum(whole / pp, floor_t)[:, None]
        # whole layers: a stage within T holds at most floor((T - b_i) / a_hi) layers of the
        # dearer kind plus its layers of the cheaper kind, so the stages hold the L_hi dearer
        # layers only if sum_i floor((T - b_i) / a_hi) >= L_hi (the rows' dearer kind: MoE
        # unless a dense layer takes longer)
        moe_dearer = a_moe >= a_dense
        a_hi = np.maximum(np.where(moe_dearer, a_moe, a_dense), 1e-30)[:, None]
        best = np.zeros(len(mine))
        for dearer, n_hi in ((True, layers - k), (False, k)):
            sel = moe_dearer == dearer
            if sel.any():
                ah = a_hi[sel]
                cand = np.maximum(ah * np.ceil((lo[sel] - fixed[sel]) / ah - 1e-9) + fixed[sel],
                                  lo[sel])
                best[sel] = _lowest_holding(cand, fixed[sel], ah, n_hi)
        m = space.columns["grad_accum"][rows[mine]].astype(float)
        slots = pipeline.bubble_slots(pp, vpp, m)
        out[mine] = m * best + slots * (whole - best) / (pp - 1)
        even_slowest = np.asarray(space.columns["stage_mb_s"])[rows[mine]]
        gains[mine] = best < even_slowest * (1 - 1e-9)
        # memory: a stage's bytes grow with each layer of either kind, so a stage holding
        # d dense and m MoE layers within the capacity holds m MoE layers alone within it; the
        # MoE-only line through 1 and 2 layers bounds those from above (convex in the layers,
        # as _balanced_bound), so the stages hold at most sum_i most_i + k layers
        # (only the rows whose even split does not fit read it)
        short = np.flatnonzero(~space.fits[rows[mine]]
                               & (out[mine] <= kth + 1e-9 * max(kth, 1.0)))
        can_fit[mine] = True
        if len(short):
            _, mem = stage_costs(model, cluster, job, {key: v[short] for key, v in knobs.items()},
                                 _feature_rows(feats, moe_rows))
            cap = cluster.gpu.usable_memory_gib * GIB
            m1, m2 = mem[:, 0::2], mem[:, 1::2]
            slope = np.maximum(m2 - m1, 1e-30)
            most = np.where(m1 <= cap, np.floor((cap - m1) / slope + 1e-9) + 1, 0) + k
            can_fit[mine[short]] = ((most >= least[short]).all(axis=1)
                                    & (most.sum(axis=1) - k * (pp - 1) >= layers))
    return out, gains, can_fit

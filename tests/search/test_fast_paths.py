"""The search's exact shortcuts (planner.search.problem.EXACT_SHORTCUTS, docs/solve_speed.md)
against the reference they replace: CP-SAT on every split and every top-K selection, the split
search chunk by chunk with the K-th best re-partitioned over every row, the row-wise unique of
the crossing column and the per-row expansion of the structures. The shortcuts must give the
same spaces (every column, bit for bit), the same ranking and the same plans."""

from __future__ import annotations

import numpy as np
import pytest

from planner.layout import Layout
from planner.registry import load_model, parse_cluster
from planner.search import problem, search
from planner.search.cpsat import SplitModel
from planner.search.problem import (
    crossing_column,
    crossing_groups,
    expand_structures,
    inner_knobs,
)
from planner.search.stages import (
    SplitProblem,
    _KthBest,
    _pruned_fits,
    _ways_batch,
    solve_split,
)
from planner.specs import JobSpec
from tests.search.test_stage_split import random_split_problem


def _run(model: str, cluster: str, seq: int | None, batch: int | None, shortcuts: bool,
         monkeypatch: pytest.MonkeyPatch, **pins):
    monkeypatch.setattr(problem, "EXACT_SHORTCUTS", shortcuts)
    spec = load_model(model)
    job = JobSpec(seq_len=seq or spec.seq_len, global_batch=batch or spec.global_batch)
    return search(spec, parse_cluster(cluster), job, pins, top_k=10)


@pytest.mark.parametrize("model,cluster,seq,batch,pins", [
    ("llama70b", "128xA100", None, None, {}),  # the README's quick start
    ("mixtral-8x7b", "64xH100", None, None, {}),  # MoE, uneven stages searched
    ("mixtral-8x7b", "512xH100", 32768, 1024, {"tp": 2}),  # MoE with cp, a pin
    ("deepseek-v3", "4096xH100", 4096, 4096, {}),  # MLA, dense first layers: even stages only
])
def test_shortcuts_give_the_reference_space_and_plans(model, cluster, seq, batch, pins,
                                                      monkeypatch) -> None:
    fast = _run(model, cluster, seq, batch, True, monkeypatch, **pins)
    ref = _run(model, cluster, seq, batch, False, monkeypatch, **pins)
    assert (fast.indices, fast.tied, fast.tied_total) == (ref.indices, ref.tied, ref.tied_total)
    assert fast.timings["stage_splits_solved"] == ref.timings["stage_splits_solved"]
    if model != "deepseek-v3":  # its layers differ (dense first): no split is searched
        assert fast.timings["stage_splits_solved"] > 0
    a, b = fast.space, ref.space
    assert a.knobs.keys() == b.knobs.keys() and a.columns.keys() == b.columns.keys()
    for name in a.knobs:
        assert a.knobs[name].tolist() == b.knobs[name].tolist(), name
    for name in a.columns:
        assert np.array_equal(a.columns[name], b.columns[name]), name
    assert np.array_equal(a.keys, b.keys) and np.array_equal(a.crossing, b.crossing)
    from planner.report import plans_json

    assert plans_json(fast.plans()) == plans_json(ref.plans())  # what `solve --json` prints


def test_split_shortcut_is_cpsats_answer_ties_included() -> None:
    """solve_split equals CP-SAT's split exactly (counts included) on random problems, about
    half of them with several optimal splits (CP-SAT chooses, as before) and pruned like the
    search prunes them."""
    rng = np.random.default_rng(20261125)
    kinds = {1: 0, 2: 0}  # problems with one optimal split, with several
    for i in range(120):
        base = random_split_problem(rng)
        if i % 3 == 0:  # stages alike and flat memory: many splits reach the optimum
            n = np.arange(1, base.time.shape[1] + 1)
            base = SplitProblem(base.layers, np.broadcast_to(n * 7, base.time.shape).copy(),
                                np.full(base.time.shape, 5, dtype=np.int64),
                                np.ones(base.time.shape, dtype=bool))
        bound = int(rng.integers(base.time.min(), base.time.max() + 1))
        for prob in (base, base.pruned(bound), base.pruned()):
            want = SplitModel(prob).solve()
            assert solve_split(prob) == want
            if want.counts:
                within = prob.fits & (prob.time <= want.slowest) & (prob.memory <= want.peak)
                kinds[int(_ways_batch(prob.layers, within[None])[0])] += 1
    assert kinds[1] > 50 and kinds[2] > 20  # both paths exercised


def test_batched_pruning_is_split_problem_pruned() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        prob = random_split_problem(rng)
        bounded = bool(rng.random() < 0.7)
        bound = int(rng.integers(prob.time.min(), prob.time.max() + 1))
        got = _pruned_fits(prob.layers, prob.time[None], prob.fits[None], np.array([bound]),
                           np.array([bounded]))[0]
        want = prob.pruned(bound if bounded else None).fits
        assert np.array_equal(got, want)


def test_kth_best_follows_the_partition() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 50, 400).astype(float)  # many ties
    eligible = rng.random(400) < 0.02
    best = _KthBest(values, eligible, 10)
    for _ in range(60):
        rows = rng.choice(400, size=int(rng.integers(0, 12)), replace=False)
        values[rows] -= rng.integers(0, 20, len(rows))
        eligible[rows] = True
        got = best.update(rows)
        want = (float(np.partition(values[eligible], 9)[9]) if eligible.sum() >= 10
                else np.inf)
        assert got == want


def test_structures_and_crossing_match_the_row_by_row_forms() -> None:
    rng = np.random.default_rng(11)
    structs = {(int(2 ** rng.integers(0, 4)), int(rng.integers(1, 9)), int(2 ** rng.integers(0, 6)),
                int(2 ** rng.integers(0, 3)), 1, 1, int(rng.integers(1, 3)),
                int(rng.integers(1, 5))) for _ in range(300)}
    for pins, offload, moe in (({}, False, False), ({"zero": 2}, True, True)):
        got = expand_structures(list(structs), pins, offload, moe)
        want = [(*st, z, r, s) for st in sorted(structs)
                for z, r, s in inner_knobs(st[0], st[2], st[3], pins, offload, moe)]
        assert np.array_equal(np.stack(list(got.values()), axis=1), np.array(want))
        crossing = crossing_column(got, 8)
        for i in range(0, len(want), 37):
            lay = Layout(tp=int(got["tp"][i]), cp=int(got["cp"][i]), dp=int(got["dp"][i]),
                         pp=int(got["pp"][i]))
            assert crossing[i] == crossing_groups(lay, 8)


class _TiedSpace:
    """What SelectionModel reads of a space, with objective values tied in bunches."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self.n = n
        spread = int(rng.integers(2, 40))
        self.keys = (rng.integers(0, spread, n) * 1000 + rng.integers(0, 2, n)).astype(np.int64)
        self.mem_units = rng.integers(0, 100, n)
        self.cap_units = 90
        self.knobs = {k: rng.integers(1, 5, n) for k in problem.KNOBS}

    def __len__(self) -> int:
        return self.n


def test_selection_with_ties_is_the_references(monkeypatch) -> None:
    """Where several rows tie at the K-th value, CP-SAT still chooses, on a model of the free
    rows alone: the same plans as the reference model over every row."""
    from planner.search.cpsat import SelectionModel

    rng = np.random.default_rng(5)
    tied = 0
    for _ in range(150):
        space = _TiedSpace(rng, int(rng.integers(20, 3000)))
        k = int(rng.integers(1, 25))
        allowed = rng.random(space.n) < 0.8
        got = []
        for shortcuts in (True, False):
            monkeypatch.setattr(problem, "EXACT_SHORTCUTS", shortcuts)
            model = SelectionModel(space, {}, k, keys=space.keys, allowed=allowed)
            tied += shortcuts and not model.forced
            got.append(model.solve().indices)
        assert got[0] == got[1]
    assert tied > 100

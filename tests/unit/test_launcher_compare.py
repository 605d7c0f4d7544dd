"""`solve --config`'s comparison (planner.search.compare) against a brute force over the
exhaustive enumerator's space: the rank counts the fitting layouts strictly faster, and no layout
with fewer changed knobs reaches within the tolerance of the best."""

from __future__ import annotations

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.search.compare import CHANGE_KNOBS, REACH_TOLERANCE, compare, describe
from planner.search.exhaustive import exhaustive_space


def test_rank_gap_and_fewest_changes_agree_with_brute_force():
    model, cluster = load_model("llama3-8b"), parse_cluster("8xH100")
    job = JobSpec(seq_len=4096, global_batch=64)
    space = exhaustive_space(model, cluster, job)
    current = Layout(tp=8, pp=1, dp=1, mbs=1, zero=1, recompute="full", sp=True)
    est = estimate(model, cluster, job, current)
    result = compare(space, current, est.step_time_s, est.fits)
    rows = [(space.layout(i), float(space.columns["step_time_s"][i]))
            for i in range(len(space.columns["step_time_s"])) if space.columns["fits"][i]]
    best = min(t for _, t in rows)
    assert result.best_step_time_s == best
    assert result.rank == 1 + sum(t < est.step_time_s for _, t in rows)
    assert result.gap == est.step_time_s / best - 1 > REACH_TOLERANCE  # tp 8 + full recompute
    reach = [(lay, t) for lay, t in rows if t <= best * (1 + REACH_TOLERANCE)]

    def changed(lay: Layout) -> int:
        return sum(getattr(lay, k) != getattr(current, k) for k in CHANGE_KNOBS)

    fewest = min(changed(lay) for lay, _ in reach)
    assert len(result.changes) == fewest
    assert result.target_step_time_s <= best * (1 + REACH_TOLERANCE)
    assert {k for k, _, _ in result.changes} == {k for k in CHANGE_KNOBS if getattr(
        result.target, k) != getattr(current, k)}
    text = "\n".join(describe(result))
    assert f"rank {result.rank} of {len(rows)}" in text


def test_a_layout_at_the_best_needs_no_change():
    model, cluster = load_model("llama3-8b"), parse_cluster("8xH100")
    job = JobSpec(seq_len=4096, global_batch=64)
    space = exhaustive_space(model, cluster, job)
    fits = space.columns["fits"]
    times = space.columns["step_time_s"]
    i = min((j for j in range(len(times)) if fits[j]), key=lambda j: times[j])
    best = space.layout(i)
    result = compare(space, best, float(times[i]), True)
    assert result.rank == 1 and result.changes == []
    assert "no change needed" in "\n".join(describe(result))

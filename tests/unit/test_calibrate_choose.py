"""choose_calibration_plans: the runs that best separate a tie, not blindly the top N."""

from __future__ import annotations

import numpy as np
import pytest

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.calibrate.choose import choose_calibration_plans
from planner.errors import PlannerError
from planner.plan import TIME_COLUMNS, Plan

MODEL, CLUSTER = load_model("llama2-7b"), parse_cluster("8xH100")
JOB = JobSpec(seq_len=4096, global_batch=64)


def _plan(rank: int, tied: bool, **knobs) -> Plan:
    layout = Layout(**knobs)
    return Plan(layout, estimate(MODEL, CLUSTER, JOB, layout), rank=rank, tied_with_best=tied)


def _shares(plan: Plan) -> np.ndarray:
    e = plan.estimate
    return np.array([getattr(e, c) for c in TIME_COLUMNS]) / e.step_time_s


@pytest.fixture(scope="module")
def plans() -> list[Plan]:
    # a (first), b = a with ZeRO-2 (the same terms, a near twin), c = a 4-stage pipeline
    # (bubble and sends), all tied; d (tensor parallel 8) untied
    return [
        _plan(1, True, dp=8, zero=1, recompute="selective"),
        _plan(2, True, dp=8, zero=2, recompute="selective"),
        _plan(3, True, pp=4, dp=2, zero=1, recompute="selective"),
        _plan(4, False, tp=8, sp=True, recompute="selective"),
    ]


def test_the_twin_is_skipped_for_the_plan_that_differs(plans) -> None:
    a, b, c, d = plans
    # the premise, measured: b's term shares are a's to 3.2% (more DP time exposed), c's
    # differ by a pipeline's bubble and sends, several times more (16.4%)
    twin, other = (float(np.abs(_shares(p) - _shares(a)).sum()) for p in (b, c))
    assert twin < 0.04 and other > 3 * twin
    assert choose_calibration_plans(plans, 2) == [a, c]  # the top 2 would be a and its twin
    assert choose_calibration_plans(plans, 3) == [a, b, c]  # the tie first, the untied d last
    assert choose_calibration_plans(plans, 4) == plans
    assert choose_calibration_plans(plans, 9) == plans


def test_without_a_tie_the_farthest_plans_follow_the_first(plans) -> None:
    a, b, c, d = (Plan(p.layout, p.estimate, p.rank, tied_with_best=p.rank == 1) for p in plans)
    far = max((b, c, d), key=lambda p: np.abs(_shares(p) - _shares(a)).sum())
    assert choose_calibration_plans([a, b, c, d], 2) == [a, far]


def test_n_below_one_is_an_error(plans) -> None:
    with pytest.raises(PlannerError, match="N >= 1"):
        choose_calibration_plans(plans, 0)

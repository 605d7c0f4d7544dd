"""planner.report: plan columns in contract order, CSV/JSON round trips, rich output."""

from __future__ import annotations

import io
import json

import pandas as pd
from costmodel_fixtures import a100, cluster, job, llama_like
from rich.console import Console

from planner import report
from planner.costmodel import estimate
from planner.layout import Layout
from planner.plan import PLAN_COLUMNS, Plan

MODEL = llama_like()
CLUSTER = cluster(a100(), 128)


def _plans() -> list[Plan]:
    fits = Layout(tp=8, pp=4, dp=4, mbs=1, zero=1, recompute="selective", sp=True)
    too_big = Layout(tp=8, pp=1, dp=16, mbs=1, zero=0, recompute="none", sp=True)
    return [Plan(lo, estimate(MODEL, CLUSTER, job(MODEL), lo), rank=i + 1)
            for i, lo in enumerate([fits, too_big])]


def test_frame_has_contract_columns_first():
    frame = report.plans_frame(_plans())
    assert list(frame.columns[: len(PLAN_COLUMNS)]) == list(PLAN_COLUMNS)
    assert list(frame["rank"]) == [1, 2]
    assert list(frame["fits"]) == [True, False]
    assert "step_time_low_s" in frame.columns  # the band rides along as an extra column


def test_csv_round_trip(tmp_path):
    path = tmp_path / "out" / "plans.csv"
    plans = _plans()
    report.write_plans_csv(plans, path)
    back = pd.read_csv(path)
    assert list(back.columns[: len(PLAN_COLUMNS)]) == list(PLAN_COLUMNS)
    assert back["step_time_s"].tolist() == [p.estimate.step_time_s for p in plans]
    assert back["recompute"].tolist() == ["selective", "none"]


def test_json_is_a_list_of_plain_objects():
    rows = json.loads(report.plans_json(_plans()))
    assert [r["tp"] for r in rows] == [8, 8]
    assert rows[1]["fits"] is False and isinstance(rows[0]["sp"], bool)
    one = json.loads(report.plan_json(_plans()[0]))
    assert one == rows[0]


def test_rich_table_and_breakdown_show_terms_and_overflow():
    plans = _plans()
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    report.print_plans_table(plans, console, title="ranked")
    report.print_estimate(plans[1], console)
    text = buf.getvalue()
    assert "ranked" in text and str(plans[0].layout) in text
    assert "PP bubble" in text and "optimizer state" in text
    assert "does not fit" in text and "overflow:" in text


def test_empty_plans_give_an_empty_frame_with_the_header():
    assert list(report.plans_frame([]).columns) == list(PLAN_COLUMNS)
    assert report.plans_csv([]).strip() == ",".join(PLAN_COLUMNS)

"""The nanotron sweep's allocations with a latency per collective (benchmarks/nanotron_floor.py,
docs/ranking.md "A latency per collective"): found from each run's own logged intra-node
bandwidth, and the ranking benchmark can leave them out."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from bench_fixtures import load_bench, nanotron_sweep

rk, fl = load_bench("ranking"), load_bench("nanotron_floor")
SWEEP = nanotron_sweep()


def test_window_excess_is_hand_computed() -> None:
    # ten 1 GiB all-reduces on 8 ranks move 10 x 2 x 7/8 x 1.073741824 GB = 18.79048 GB of bus
    # traffic: 44.3486 ms at 423.7 GB/s (job 14113488, a lo run), 40.8844 ms at 459.6
    assert fl.window_excess_ms(423.7, 459.6) == pytest.approx(44.3486 - 40.8844, abs=2e-3)
    assert fl.window_excess_ms(459.6, 459.6) == pytest.approx(0.0)


def test_collectives_on_the_slowest_stage() -> None:
    # 1.34B (16 layers) on pp 2 under nanotron's split (11, 5): 8 x 11 + 2 (embedding) = 90
    # against 8 x 5 + 5 (head) = 45; pp 1 holds both ends: 8 x 16 + 2 + 5 = 135
    assert fl.collectives_on_slowest_stage((11, 5), 16) == 90
    assert fl.collectives_on_slowest_stage((), 16) == 135
    assert fl.collectives_on_slowest_stage((3, 3, 2, 3, 2, 3, 0, 0), 16) == 26  # 8 x 3 + 2


def test_the_floor_is_a_max_with_the_prediction() -> None:
    # tp8-pp2 of the 1.34B at mbs 1 on 16 GPUs: 257 slots x 90 collectives x (0.70 + 7 x 0.24)
    # ms = 55.05 s (measured 54.4, predicted 10.2); with mbs 32 (8 + 1 slots) the floor is 1.93 s
    # and the prediction (2.9 s here) stands
    rows = pd.DataFrame({"slots": [257, 9], "collectives": [90, 90], "tp": [8, 8],
                         "predicted": [10.2, 2.9]})
    got = fl.with_floor(rows, 0.70e-3, 0.24e-3)
    assert got.iloc[0] == pytest.approx(257 * 90 * 2.38e-3)
    assert got.iloc[1] == pytest.approx(2.9)


def test_intra_node_mode_is_found_from_the_logs() -> None:
    """--healthy-intra G: runs whose logged intra-node all-reduce is below G x the best of their
    source leave; counted again here straight from the table's notes (a second reading)."""
    runs, _ = rk.load_all([SWEEP])
    frameworks = rk.frameworks_of([SWEEP])
    raw = pd.read_csv(SWEEP)
    intra = raw["notes"].map(lambda n: float(re.search(r"intra-node AR=([\d.]+)", n).group(1)))
    assert intra.max() == pytest.approx(461.0, abs=0.5)
    expected = int((intra < 0.95 * intra.max()).sum())
    # bimodal (docs/ranking.md): nothing between 432.2 and 439 GB/s; 0.95 x 461 = 438 splits
    assert not ((intra > 432.2) & (intra < 439.0)).any()
    assert int((intra < 400).sum()) == 11  # the allocations degraded on NVLink as well
    kept, dropped = rk.healthy_runs(runs, frameworks, 0.0, 0.95)
    assert dropped == expected and len(kept) == len(runs) - expected
    assert all(rk.logged_intra_busbw(r) >= 0.95 * intra.max() for r in kept)
    # every run the all-reduce test (--healthy 1/3) drops is in the low intra-node mode too
    _, both = rk.healthy_runs(runs, frameworks, 1 / 3, 0.95)
    assert both == dropped
    assert rk.healthy_runs(runs, frameworks, 0.0, 0.0)[1] == 0

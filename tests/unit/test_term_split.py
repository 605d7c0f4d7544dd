"""benchmarks/term_split.py: the TP factor read within jobs (one intercept per source, GPU and
model) recovers a factor built into synthetic rows, where the pooled share regression is fooled
by a source's own bias."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bench_fixtures import load_bench

ts = load_bench("term_split")


def test_tp_factor_within_jobs_ignores_a_source_bias() -> None:
    # two sources, each with one job at three TP shares: log ratio = bias_source + 1.5 x share,
    # so the TP term needs 1 + 1.5 = 2.5 whatever each source's own level (+0.3 and -0.2)
    rows = []
    for source, bias in (("a", 0.3), ("b", -0.2)):
        for share in (0.02, 0.05, 0.10):
            rows.append({"source": source, "gpu": "g", "model": "m", "tp_share": share,
                         "log_ratio": bias + 1.5 * share})
    assert ts.tp_within(pd.DataFrame(rows)) == pytest.approx(2.5)


def test_jobs_with_one_tp_share_say_nothing() -> None:
    frame = pd.DataFrame({"source": ["a", "b"], "gpu": ["g", "g"], "model": ["m", "m"],
                          "tp_share": [0.0, 0.1], "log_ratio": [np.log(1.2), np.log(0.9)]})
    assert ts.tp_within(frame) is None


def _rows(source: str, bias: float, bubble: float, extra: float) -> dict:
    """One timed row whose predicted 100 s is compute plus a bubble of `bubble` x 100 s; its
    measured time is exp(bias + extra x bubble) x the prediction."""
    predicted = 100.0
    return {"source": source, "oom": False, "rel_error": 0.0, "predicted_s": predicted,
            "measured_s": predicted * float(np.exp(bias + extra * bubble)),
            "time_compute_s": predicted * (1 - bubble), "time_pp_bubble_s": predicted * bubble}


def test_term_diagnosis_within_sources_is_not_fooled_by_where_a_term_lives() -> None:
    """The bubble's share lives in one source (b: 5-20%, a: none) that runs 20% slower than
    predicted across the board (its software), while its bubble is exactly right. Pooled, the
    regression charges b's bias to the bubble (exp(-0.223 / share) style: a factor far below 1
    here, far above when b is fast); with one level per source the bubble reads 1.000 and b's
    level exp(-0.2). A real within-source excess (log ratio + 1.5 x share) reads 2.5."""
    ac = load_bench("accuracy")
    for extra, factor in ((0.0, 1.0), (1.5, 2.5)):
        rows = [_rows("a", 0.0, 0.0, 0.0) for _ in range(3)]
        rows += [_rows("b", -0.2, share, extra) for share in (0.05, 0.10, 0.20)]
        frame = pd.DataFrame(rows)
        pooled = ac.term_diagnosis(frame).set_index("term")["factor_needed"]
        within = ac.term_diagnosis_within(frame).set_index("term")["factor_needed"]
        assert within["time_pp_bubble_s"] == pytest.approx(factor, rel=1e-9)
        assert within["source b"] == pytest.approx(np.exp(-0.2), rel=1e-9)
        assert within["source a"] == pytest.approx(1.0, rel=1e-9)
        assert abs(np.log(pooled["time_pp_bubble_s"] / factor)) > 0.5  # pooled is fooled


def test_source_factors_read_each_term_of_one_source() -> None:
    """One source, rows of a 100 s prediction with TP inside the node and a bubble at varied
    shares; measured = exp(-0.1 + 0.5 x TP share - 0.4 x bubble share) x predicted: the TP term
    reads 1.5, the bubble 0.6, exactly (no noise: standard errors 0)."""
    rows = []
    for tp, bubble in ((0.02, 0.05), (0.08, 0.01), (0.05, 0.10), (0.10, 0.03)):
        rows.append({"predicted_s": 100.0, "tp_in_domain": 100.0 * tp,
                     "time_pp_bubble_s": 100.0 * bubble,
                     "log_ratio": -0.1 + 0.5 * tp - 0.4 * bubble})
    got = ts.source_factors(pd.DataFrame(rows))
    assert set(got) == {"tp_in_domain", "time_pp_bubble_s"}
    assert got["tp_in_domain"][0] == pytest.approx(1.5)
    assert got["time_pp_bubble_s"][0] == pytest.approx(0.6)
    assert got["tp_in_domain"][1] == pytest.approx(0.0, abs=1e-6)


def test_the_weight_is_the_rms_error_where_the_data_pin_it() -> None:
    """By hand: exposed DP off by 0.02, -0.25, 2.56 in three sources and 1.6 in a fourth whose
    standard error (1.2) says nothing -> RMS sqrt((0.0004 + 0.0625 + 6.5536) / 3) = 1.4851; with
    one left out sqrt((0.0625 + 6.5536) / 2) = 1.8188, sqrt((0.0004 + 6.5536) / 2) = 1.8102,
    sqrt((0.0004 + 0.0625) / 2) = 0.1774; median |f - 1| 0.25: on both sides of 1, so the weight
    stays 1. The bubble off by -0.2, 0.3, 0.4: RMS sqrt((0.04 + 0.09 + 0.16) / 3) = 0.31091,
    one left out 0.35355, 0.31623, 0.25495, median 0.3: all below 1, the weight is 0.31091. A
    term one source identifies keeps 1; TP overlapped from 0.97 and 3.0: RMS
    sqrt((0.0009 + 4) / 2) = 1.41437, one left out 1 (one source): weight 1."""
    per = {"a": {"time_dp_comm_exposed_s": (1.02, 0.1), "tp_overlapped": (0.97, 0.2),
                 "time_pp_bubble_s": (0.8, 0.3)},
           "b": {"time_dp_comm_exposed_s": (0.75, 0.1), "tp_overlapped": (3.0, 0.5),
                 "time_pp_bubble_s": (1.3, 0.3)},
           "c": {"time_dp_comm_exposed_s": (3.56, 0.3), "time_pp_comm_s": (0.23, 0.5),
                 "time_pp_bubble_s": (1.4, 0.3)},
           "d": {"time_dp_comm_exposed_s": (2.6, 1.2)}}
    table = ts.error_weights(per).set_index("term")
    dp = table.loc["time_dp_comm_exposed_s"]
    assert dp["rms"] == pytest.approx(1.4851, abs=1e-4) and dp["identified"] == 3
    assert dp["one_left_out"] == "0.18-1.82" and dp["median_error"] == pytest.approx(0.25)
    assert dp["weight"] == 1.0
    bubble = table.loc["time_pp_bubble_s"]
    assert bubble["weight"] == pytest.approx(0.31091, abs=1e-5)
    assert bubble["one_left_out"] == "0.25-0.35"
    assert table.loc["tp_overlapped", "rms"] == pytest.approx(1.41437, abs=1e-5)
    assert table.loc["tp_overlapped", "weight"] == 1.0
    assert table.loc["time_pp_comm_s", "weight"] == 1.0
    assert table.loc["tp_across_domains", "weight"] == 1.0

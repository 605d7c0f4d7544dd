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

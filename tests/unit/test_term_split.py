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

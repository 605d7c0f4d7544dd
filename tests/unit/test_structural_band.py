"""planner.specs.hardware.structural_band, planner.data.bands.fit_structural_tau: the calibrated
band of a layout grows with how unlike the calibration runs its time-term shares are; tau by
maximum likelihood."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.data.bands import fit_structural_tau
from planner.specs.hardware import structural_band


def test_structural_band_of_two_hand_made_share_vectors():
    # terms: compute, TP, PP bubble, DP; the calibration runs' mean shares
    ref = np.array([0.70, 0.15, 0.10, 0.05])
    tau = np.array([0.5, 1.0, 2.0, 3.0])
    like = np.array([0.70, 0.15, 0.10, 0.05])  # a layout like the runs: the floor alone
    unlike = np.array([0.50, 0.15, 0.30, 0.05])  # 20 points of compute moved to the bubble
    band = structural_band(np.vstack([like, unlike]), ref, tau, 0.06)
    # by hand: sqrt(0.06^2 + (0.5 * 0.2)^2 + (2 * 0.2)^2) = sqrt(0.0036 + 0.01 + 0.16)
    assert band[0] == pytest.approx(0.06)
    assert band[1] == pytest.approx(math.sqrt(0.1736))


def test_tau_is_recovered_by_maximum_likelihood_and_unseen_terms_get_the_widest():
    rng = np.random.default_rng(0)
    n, floor = 4000, 0.05
    delta = np.column_stack([rng.uniform(-0.3, 0.3, n), rng.uniform(-0.2, 0.2, n),
                             np.zeros(n)])  # the third term is never moved
    true = np.array([0.4, 1.5])
    sd = np.sqrt(floor ** 2 + delta[:, :2] ** 2 @ true ** 2)
    resid = rng.normal(0.0, sd)
    tau = fit_structural_tau(resid, delta, floor)
    assert tau[:2] == pytest.approx(true, rel=0.15)
    assert tau[2] == pytest.approx(tau[:2].max())
    # residuals no wider than the floor: no structural term
    flat = fit_structural_tau(rng.normal(0.0, floor, n), delta, floor)
    assert flat[:2].max() < 0.15


def test_a_calibrated_profile_gives_each_plan_its_own_band():
    """A profile carrying step_time_band_terms: each plan's step_time_high_s is its step time x
    (1 + structural_band of its own term shares), recomputed here from the Estimate's columns;
    a plan whose shares equal the reference gets the flat band."""
    from calib_fixtures import a100_like

    from planner.costmodel import estimate_many
    from planner.layout import Layout
    from planner.plan import TIME_COLUMNS
    from planner.specs import ClusterSpec, JobSpec, ModelSpec
    from planner.specs.hardware import TermBand

    model = ModelSpec(name="m", num_hidden_layers=8, hidden_size=2048, num_attention_heads=16,
                      intermediate_size=8192, vocab_size=32000, activation="gelu")
    job = JobSpec(seq_len=2048, global_batch=64)
    layouts = [Layout(tp=1, dp=16, zero=1), Layout(tp=8, pp=2, dp=1, mbs=1)]
    gpu = a100_like().model_copy(update={"step_time_rel_error": 0.05})
    cluster = ClusterSpec(gpu=gpu, num_nodes=2, gpus_per_node=8)
    plain = estimate_many(model, cluster, job, layouts)
    first = plain[0]
    ref = {c: float(getattr(first, c)) / first.step_time_s for c in TIME_COLUMNS}
    tau = {c: 2.0 for c in TIME_COLUMNS}
    terms = TermBand(shares=ref, tau=tau)
    banded = cluster.model_copy(update={"gpu": gpu.model_copy(update={
        "step_time_band_terms": terms})})
    ests = estimate_many(model, banded, job, layouts)
    assert [e.step_time_s for e in ests] == [e.step_time_s for e in plain]
    assert ests[0].step_time_high_s / ests[0].step_time_s - 1 == pytest.approx(0.05, rel=1e-6)
    e = ests[1]
    d2 = sum((float(getattr(e, c)) / e.step_time_s - ref[c]) ** 2 for c in TIME_COLUMNS)
    assert d2 > 0.001  # TP 8 and a pipeline: unlike the first plan
    assert e.step_time_high_s / e.step_time_s - 1 == pytest.approx(math.sqrt(0.05 ** 2 + 4 * d2))
    assert e.step_time_low_s / e.step_time_s - 1 == pytest.approx(-math.sqrt(0.05 ** 2 + 4 * d2))
    assert e.ranking_band == plain[1].ranking_band  # the tie rule's band is not this one


def test_term_band_names_known_terms_only():
    from pydantic import ValidationError

    from planner.specs.hardware import TermBand

    with pytest.raises(ValidationError, match="unknown time term"):
        TermBand(shares={"time_gemm_s": 0.5}, tau={"time_gemm_s": 1.0})
    with pytest.raises(ValidationError, match="same time terms"):
        TermBand(shares={"time_compute_s": 0.5}, tau={"time_tp_comm_s": 1.0})
    with pytest.raises(ValidationError):
        TermBand(shares={"time_compute_s": 1.5}, tau={"time_compute_s": 1.0})

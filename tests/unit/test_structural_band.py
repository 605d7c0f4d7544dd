"""planner.data.bands.structural_band / fit_structural_tau: the calibrated band of a layout grows
with how unlike the calibration runs its time-term shares are; tau by maximum likelihood."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.data.bands import fit_structural_tau, structural_band


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

"""The MoE router's load on the most loaded EP rank (planner.costmodel.moe.load_factor), by
hand and by simulation.

The trained-router numbers are Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy
for Mixture-of-Experts" (arXiv 2408.15664), Table 2 (validation perplexity / MaxVio_global):
1B aux-loss 9.56 / 0.72, Loss-Free 9.50 / 0.04; 3B aux-loss 7.97 / 0.52, Loss-Free 7.92 / 0.04
(MaxVio_global, Eq. 4: (max_i Load_i - mean Load) / mean Load on the validation set). The
planner used to cite them as Table 1; the values are right, the table is 2."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.costmodel import moe
from planner.specs import ModelSpec

# Qwen3-30B-A3B's routing: 128 experts, top 8
QWEN = ModelSpec(name="q", num_hidden_layers=2, hidden_size=2048, num_attention_heads=32,
                 num_key_value_heads=4, intermediate_size=6144, vocab_size=1000,
                 activation="swiglu", num_experts=128, num_experts_per_tok=8,
                 moe_intermediate_size=768, seq_len=4096, global_batch=16)


def test_trained_router_values_are_the_papers():
    assert moe.EXPERT_MAX_VIOLATION["aux_loss"] == 0.52  # 3B, Table 2
    assert moe.EXPERT_MAX_VIOLATION_HIGH["aux_loss"] == 0.72  # 1B, Table 2
    assert moe.EXPERT_MAX_VIOLATION["loss_free"] == 0.04  # both sizes, Table 2
    # one expert per rank: the rank's load is the expert's, 1 + MaxVio
    assert float(moe.load_factor(QWEN, 128, None)) == pytest.approx(1.52)
    # 16 experts per rank (ep 8): 1 + 0.52 / 4 (the independence assumption)
    assert float(moe.load_factor(QWEN, 8, None)) == pytest.approx(1.13)
    assert float(moe.load_factor(QWEN, 8, None, "loss_free")) == pytest.approx(1.01)


def test_force_balanced_load_by_hand():
    """Random logits: ep 8, 32768 copies per rank (T 4096 x k 8): relative spread
    sqrt((7/8)(120/127)/32768) = 0.0050231, max of 8 about sqrt(2 ln 8) = 2.039334 spreads."""
    got = float(moe.load_factor(QWEN, 8, None, "force_balanced", copies=4096 * 8))
    assert got == pytest.approx(1 + 2.039334 * 0.0050231, rel=1e-5)
    assert float(moe.load_factor(QWEN, 1, None, "force_balanced", copies=4096 * 8)) == 1.0
    assert float(moe.load_factor(QWEN, 8, None, "force_balanced")) == 1.0  # no token count
    with pytest.raises(ValueError, match="unknown MoE routing"):
        moe.load_factor(QWEN, 8, None, "sinkhorn")


def test_force_balanced_bound_against_simulation():
    """Second method: route 8 x 512 tokens of top-8 over 128 experts uniformly at random (as
    Megatron-Core's apply_random_logits does), count each of 8 ranks' copies; the mean of the
    largest rank's load over the mean lies above 1 and below the Gaussian-maximum bound."""
    rng = np.random.default_rng(0)
    ep, tokens, k, e = 8, 8 * 512, 8, 128
    maxima = []
    for _ in range(200):
        experts = np.argsort(rng.random((tokens, e)), axis=1)[:, :k]
        per_rank = np.bincount((experts // (e // ep)).ravel(), minlength=ep)
        maxima.append(per_rank.max() / per_rank.mean())
    bound = float(moe.load_factor(QWEN, ep, None, "force_balanced", copies=tokens * k / ep))
    assert 1.0 < np.mean(maxima) < bound
    assert np.mean(maxima) - 1 > 0.5 * (bound - 1)  # the bound is within 2x of the mean


def test_miss_probability_is_the_hypergeometric():
    """prod_{i<k} (E - m - i) / (E - i) = C(E - m, k) / C(E, k)."""
    assert float(moe.miss_probability(128, 16, 8)) == pytest.approx(
        math.comb(112, 8) / math.comb(128, 8), rel=1e-12)
    assert float(moe.miss_probability(8, 7, 2)) == 0.0  # 2 experts cannot both miss 7 of 8


def test_ep_overlap_hides_the_all_to_all_behind_compute():
    """moe_ep_overlap: a micro-batch's dispatch and combine run under another micro-batch's
    compute, so only max(0, EP - compute) stays exposed, per micro-batch (pp 1: the step's
    EP and compute terms are both grad_accum x the per-micro-batch times)."""
    from costmodel_fixtures import cluster, flat_gpu, job
    from test_costmodel_moe_folding import MOE

    from planner.costmodel import estimate
    from planner.layout import Layout

    assert float(moe.overlapped_ep_time(3.0, 2.0)) == 1.0
    assert float(moe.overlapped_ep_time(1.0, 2.0)) == 0.0
    lo = Layout(tp=1, pp=1, dp=8, ep=8, mbs=1, zero=1, recompute="none")
    for intra_gb in (100.0, 1.0):  # EP under compute; EP beyond it
        gpu = flat_gpu(intra_gb=intra_gb, inter_gb=10.0, memory_gib=1000)
        plain = estimate(MOE, cluster(gpu, 8), job(MOE), lo)
        over = estimate(MOE, cluster(gpu, 8), job(MOE, moe_ep_overlap=True), lo)
        left = max(0.0, plain.time_ep_comm_s - plain.time_compute_s)
        assert over.time_ep_comm_s == pytest.approx(left, rel=1e-9, abs=1e-15)
        assert over.time_compute_s == pytest.approx(plain.time_compute_s, rel=1e-12)
        assert over.step_time_s == pytest.approx(
            plain.step_time_s - plain.time_ep_comm_s + left, rel=1e-9)
    assert left > 0  # the slow link leaves some exposed


def test_band_widens_by_the_load_range():
    """A trained router's rank load lies in [1, 1 + 0.72] (module doc); the EP time is linear
    in it. ep 8 on 8 experts (one per rank): central 1.52, so the band reaches 1/1.52 of the
    EP time below and 1.72/1.52 above; force-balanced routing and dense models add nothing;
    a capacity factor of 1.25 caps the high end below the central dropless value."""
    from costmodel_fixtures import cluster, flat_gpu, job
    from test_costmodel_moe_folding import MOE

    from planner.costmodel import estimate
    from planner.layout import Layout

    lo = Layout(tp=1, pp=1, dp=8, ep=8, mbs=1, zero=1, recompute="none")
    gpu = flat_gpu(intra_gb=100.0, inter_gb=10.0, memory_gib=1000)
    est = estimate(MOE, cluster(gpu, 8), job(MOE), lo)
    rel = gpu.step_time_band
    ep = est.time_ep_comm_s
    assert est.step_time_high_s == pytest.approx(
        est.step_time_s * (1 + rel) + ep * (1.72 / 1.52 - 1), rel=1e-9)
    assert est.step_time_low_s == pytest.approx(
        est.step_time_s * (1 - rel) - ep * (1 - 1 / 1.52), rel=1e-9)
    forced = estimate(MOE, cluster(gpu, 8), job(MOE, moe_routing="force_balanced"), lo)
    assert forced.step_time_high_s == pytest.approx(forced.step_time_s * (1 + rel), rel=1e-12)
    minus, plus = moe.load_band_seconds(MOE, "aux_loss", 1.25, np.array([1.25]),
                                        np.array([2.0]))
    assert float(plus[0]) == 0.0 and float(minus[0]) == pytest.approx(2.0 * (1 - 1 / 1.25))

"""Megatron-Core's MoE parallel folding, the token dispatchers, the router's load imbalance and
the capacity factor, by hand on flat profiles (costmodel_fixtures: every link at its plateau,
no latency)."""

from __future__ import annotations

import math

import pytest
from costmodel_fixtures import cluster, flat_gpu, job

from planner.costmodel import estimate, layout_violations, moe
from planner.layout import Layout
from planner.specs import ModelSpec

GIB = 2**30
# 8 experts of ffn 2048, top 2, 2 layers, h 1024; seq 1024, global batch 16
MOE = ModelSpec(name="moe", num_hidden_layers=2, hidden_size=1024, num_attention_heads=8,
                num_key_value_heads=8, intermediate_size=4096, vocab_size=1000,
                activation="swiglu", num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=2048, seq_len=1024, global_batch=16)
EXPERTS = 2 * 8 * MOE.mlp_params(2048)  # routed-expert parameters of both layers
REST = MOE.num_params - EXPERTS
GPU = flat_gpu(intra_gb=100.0, inter_gb=10.0, memory_gib=1000)


def test_ep_beyond_dp_borrows_tp_ranks():
    """tp 4 x dp 2 on 8 GPUs with ep 8 and etp 1: ep exceeds dp*cp = 2 (the old rule refused
    it); etp*ep = 8 divides tp*cp*dp = 8. Each rank holds 1 expert per layer, whole (etp 1),
    replicated on no other rank (expert-DP = 8 / 8 = 1)."""
    lo = Layout(tp=4, pp=1, dp=2, ep=8, etp=1, mbs=1, zero=1, recompute="none", sp=True)
    assert layout_violations(MOE, cluster(GPU, 8), job(MOE), lo) == []
    assert lo.expert_dp == 1 and str(lo).count("etp1") == 1
    est = estimate(MOE, cluster(GPU, 8), job(MOE, moe_capacity_factor=1.0), lo)
    # weights: the rest over tp 4, the experts over ep 8 x etp 1
    assert est.mem_weights_gb * GIB == pytest.approx(2 * (REST / 4 + EXPERTS / 8))
    # distributed optimizer: the rest's 12 B over dp 2, the experts' over expert-DP 1
    assert est.mem_optimizer_gb * GIB == pytest.approx(12 * (REST / 4 / 2 + EXPERTS / 8))
    # all-to-all over 8 ranks (stride etp 1: one node): each sends its 1024 / 4 tokens' 2
    # copies of 2 KiB, 7/8 leave it; etp 1: no expert-TP all-gather. 4 per MoE layer, 2 layers,
    # grad_accum = 16 / (1 x 2) = 8 micro-batches
    send = 1024 / 4 * 2 * 1024 * 2
    assert est.time_ep_comm_s == pytest.approx(8 * 2 * 4 * send * 7 / 8 / 100e9, rel=1e-6)


def test_fold_that_does_not_divide_is_refused_with_megatrons_rule():
    lo = Layout(tp=2, pp=1, dp=2, ep=8, etp=1, mbs=1)  # etp*ep = 8 > tp*cp*dp = 4
    problems = layout_violations(MOE, cluster(GPU, 4), job(MOE), lo)
    assert any("etp*ep = 1*8 = 8 does not divide the tp*cp*dp = 4" in p for p in problems)
    dense = MOE.model_copy(update={"num_experts": 0, "num_experts_per_tok": 0})
    assert any("etp=1 needs a mixture-of-experts" in p for p in
               layout_violations(dense, cluster(GPU, 4), job(dense), Layout(tp=2, dp=2, etp=1)))


def test_expert_tp_gathers_the_routed_copies():
    """tp 2, dp 4, ep 4, etp 2 on 8 GPUs: the all-to-all runs over 4 ranks spaced etp = 2
    apart, then each rank all-gathers the received copies over its 2 expert-TP ranks."""
    lo = Layout(tp=2, pp=1, dp=4, ep=4, etp=2, mbs=1, zero=1, recompute="none", sp=True)
    assert lo.etp == 0  # etp = tp is Megatron's default, one spelling
    est = estimate(MOE, cluster(GPU, 8), job(MOE, moe_capacity_factor=1.0), lo)
    send = 1024 / 2 * 2 * 1024 * 2  # T / tp tokens x k copies x h x 2 B
    a2a = send * 3 / 4 / 100e9
    gather = send * 2 * 1 / 2 / 100e9  # full buffer 2 x send, (n-1)/n = 1/2
    micro = 16 // 4
    assert est.time_ep_comm_s == pytest.approx(micro * 2 * 4 * (a2a + gather), rel=1e-6)
    assert est.mem_weights_gb * GIB == pytest.approx(2 * (REST / 2 + EXPERTS / 8))


def test_allgather_and_deepep_dispatchers():
    """The same layout (tp 1, dp 8, ep 8) under the two other dispatchers. allgather: each of
    8 ranks all-gathers every token (1024 x 2 KiB each) over the 8 ranks; deepep: the routed
    copies at DeepEP's measured fraction of the NVLink plateau (153 and 158 of 160 GB/s)."""
    lo = Layout(tp=1, pp=1, dp=8, ep=8, mbs=1, zero=1, recompute="none")
    base = job(MOE, moe_capacity_factor=1.0)
    ag = estimate(MOE, cluster(GPU, 8), base.model_copy(update={"moe_dispatcher": "allgather"}),
                  lo)
    tokens = 1024 * 1024 * 2
    micro = 2
    assert ag.time_ep_comm_s == pytest.approx(micro * 2 * 4 * tokens * 8 * 7 / 8 / 100e9,
                                              rel=1e-6)
    deep = estimate(MOE, cluster(GPU, 8), base.model_copy(update={"moe_dispatcher": "deepep"}),
                    lo)
    # DeepEP counts one row per (token, receiving rank), the sender's own included: with one
    # expert per rank a token's 2 experts sit on 2 ranks, so 1024 x 2 rows of 2 KiB
    rows = 1024 * 2
    fraction = (153 + 158) / 2 / 160
    assert deep.time_ep_comm_s == pytest.approx(
        micro * 2 * 4 * rows * 1024 * 2 / (fraction * 100e9), rel=1e-6)


def test_deepep_across_nodes_uses_the_rdma_fraction():
    """ep 16 on two nodes of 8, 32 experts top 4 (2 per rank, 16 per node): a token reaches
    16 (1 - C(30,4)/C(32,4)) ranks over NVLink and 2 (1 - C(16,4)/C(32,4)) nodes over RDMA
    (DeepEP's counts, the sender's own rank and node included), the NIC leg at DeepEP's
    internode fraction (43..58 GB/s of ~50) of 10 GB/s flat: the slower leg."""
    group = moe_group(16)
    wide = MOE.model_copy(update={"num_experts": 32, "num_experts_per_tok": 4})
    tokens, h = 1024, 1024
    ranks = 16 * (1 - math.comb(30, 4) / math.comb(32, 4))
    nodes = 2 * (1 - math.comb(16, 4) / math.comb(32, 4))
    assert ranks == pytest.approx(3.80645, rel=1e-5) and nodes == pytest.approx(1.89878, rel=1e-5)
    nvl = tokens * ranks * h * 2 / ((153 + 158) / 2 / 160 * 100e9)
    rdma = tokens * nodes * h * 2 / ((43 + 58 + 51 + 43 + 57 + 50) / 6 / 50 * 10e9)
    assert rdma > nvl
    got = moe.deepep_time(group, wide, tokens, 1, 16, 1, 1.0)
    assert float(got) == pytest.approx(rdma, rel=1e-9)
    # the most loaded rank's load scales both legs
    assert float(moe.deepep_time(group, wide, tokens, 1, 16, 1, 1.25)) == \
        pytest.approx(1.25 * rdma, rel=1e-9)


def moe_group(n: int):
    from planner.costmodel.comm import Group

    return Group(cluster(GPU, n), n, 1)


def test_load_imbalance_and_capacity_factor():
    """Dropless: the most loaded rank holds 1 + 0.52 / sqrt(E/ep) x the mean (Wang et al. 2024's
    MaxVio, averaged over the E/ep experts of a rank); a capacity factor caps it."""
    assert float(moe.load_factor(MOE, 8, None)) == pytest.approx(1.52)
    assert float(moe.load_factor(MOE, 2, None)) == pytest.approx(1 + 0.52 / 2)
    assert float(moe.load_factor(MOE, 8, 1.25)) == pytest.approx(1.25)
    assert float(moe.load_factor(MOE, 2, 0.5)) == pytest.approx(0.5)  # drops below the mean
    lo = Layout(tp=1, pp=1, dp=8, ep=8, mbs=1, zero=1, recompute="none")
    capped = estimate(MOE, cluster(GPU, 8), job(MOE, moe_capacity_factor=1.0), lo)
    free = estimate(MOE, cluster(GPU, 8), job(MOE), lo)
    # the all-to-all carries 1.52 x the copies to the most loaded rank
    assert free.time_ep_comm_s == pytest.approx(1.52 * capped.time_ep_comm_s, rel=1e-9)
    # the routed copies' stored tensors grow by 0.52 x (k (3 x ffn + 2 ffn) + k 2 h) bytes per
    # token (SwiGLU gate, up, product and the FC2 input; the copies' inputs) per MoE layer,
    # for the in-flight micro-batches (pp 1: one), 1024 tokens, 2 layers
    k, ffn, h = 2, 2048, 1024
    extra = 0.52 * (k * (4 * ffn + 2 * ffn) + k * 2 * h) * 1024 * 2
    grown = (free.mem_activations_gb - capped.mem_activations_gb) * GIB
    assert grown == pytest.approx(extra, rel=1e-9)
    assert free.time_compute_s > capped.time_compute_s  # the expert GEMMs on 1.52 x the tokens
    assert math.isclose(free.mem_weights_gb, capped.mem_weights_gb)

"""Expert and context parallelism by hand on flat profiles."""

from __future__ import annotations

import pytest
from costmodel_fixtures import cluster, flat_gpu, job

from planner.costmodel import estimate, estimate_batch
from planner.layout import Layout
from planner.specs import ModelSpec

GIB = 2**30
MOE = ModelSpec(name="moe", num_hidden_layers=2, hidden_size=1024, num_attention_heads=8,
                num_key_value_heads=8, intermediate_size=4096, vocab_size=1000,
                activation="swiglu", num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=2048, seq_len=1024, global_batch=16)


def test_experts_are_sharded_over_ep_and_exchanged_by_all_to_all():
    gpu = flat_gpu(intra_gb=100.0, memory_gib=1000)
    lo = Layout(tp=1, pp=1, dp=8, ep=8, mbs=1, zero=1, recompute="none")
    # capacity factor 1: every rank at the mean load (the router's imbalance capped; see
    # test_costmodel_moe_folding for the dropless load)
    est = estimate(MOE, cluster(gpu, 8), job(MOE, moe_capacity_factor=1.0), lo)
    experts = 2 * 8 * MOE.mlp_params(2048)  # routed experts of both layers
    rest = MOE.num_params - experts
    # weights: everything but the experts replicated, each rank holds 1 of 8 experts per layer
    assert est.mem_weights_gb * GIB == pytest.approx(2 * (rest + experts / 8))
    # distributed optimizer: dense params over dp = 8, experts over dp / ep = 1 rank
    assert est.mem_optimizer_gb * GIB == pytest.approx(12 * (rest / 8 + experts / 8))
    # all-to-all: each rank sends its 1024 tokens x top-2 copies x h x 2 bytes, 7/8 leaves it;
    # dispatch + combine, forward and backward: 4 per MoE layer, 2 micro-batches
    send = 1024 * 2 * 1024 * 2
    t_a2a = send * 7 / 8 / 100e9
    assert est.time_ep_comm_s == pytest.approx(2 * 2 * 4 * t_a2a, rel=1e-6)


def test_context_parallel_ring_exposes_what_attention_cannot_hide():
    model = ModelSpec(name="cp", num_hidden_layers=2, hidden_size=1024, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=4096, vocab_size=1000,
                      activation="swiglu", seq_len=8192, global_batch=2)
    gpu = flat_gpu(tflops=100.0, eff=0.5, intra_gb=1.0)  # a slow link: the ring is exposed
    lo = Layout(tp=1, pp=1, dp=1, cp=2, mbs=1, zero=1, recompute="none")
    cols = estimate_batch(model, cluster(gpu, 2), job(model), [lo])
    tokens = 8192 / 2
    kv = tokens * 2 * 2 * 128 * 2  # K and V of 2 heads of 128, 2 bytes
    send = kv / 1e9  # one ring step at the plateau (latency negligible), cp - 1 = 1 step
    attn = model.attention_flops_per_token(8192, causal=True) / 2 * tokens / (100e12 * 0.5)
    per_layer = max(send - attn, 0) + max(2 * send - 2.5 * attn, 0)  # flash bwd = 2.5 x fwd
    assert per_layer > 0
    assert cols["time_cp_comm_s"][0] == pytest.approx(2 * 2 * per_layer, rel=1e-6)
    # context parallelism halves each rank's tokens: activation memory per rank halves too
    one = estimate_batch(model, cluster(gpu, 2), job(model), [Layout(dp=2, mbs=1, zero=1)])
    assert cols["mem_activations_gb"][0] < 0.6 * one["mem_activations_gb"][0]

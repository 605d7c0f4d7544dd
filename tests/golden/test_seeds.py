"""The seeds' worked numbers (the project's teaching texts; their numbers are typed here, never
read at run time), where they are right (the seeds' errata), reproduced through the cost model's
own functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.costmodel import comm, estimate, estimate_batch, memory, pipeline
from planner.layout import Layout
from planner.specs import ClusterSpec, Curve, GpuProfile, JobSpec, LinkProfile, ModelSpec

MIB = 2**20


def _flat_gpu(intra_gb: float = 100.0, inter_gb: float = 50.0) -> GpuProfile:
    flat = lambda y: Curve(points=[(1.0, y), (1e18, y)])  # noqa: E731
    return GpuProfile(
        name="flat", peak_bf16_tflops=100, peak_fp16_tflops=100, memory_gib=80, hbm_tb_per_s=1,
        reserve_gib=0, gemm_efficiency=flat(0.5), gpus_per_node=8, intra_node_fabric="nvswitch",
        intra_node=LinkProfile(fabric="x", link_gb_per_s=intra_gb, busbw_gb_per_s=flat(intra_gb),
                               latency_us=1e-9),
        inter_node=LinkProfile(fabric="y", link_gb_per_s=inter_gb, busbw_gb_per_s=flat(inter_gb),
                               latency_us=1e-9),
        nic_gbit_per_s=400, dp_overlap=0.0,
    )


def _cluster(gpu: GpuProfile, n: int) -> ClusterSpec:
    return ClusterSpec(gpu=gpu, num_nodes=max(n // 8, 1), gpus_per_node=min(n, 8))


# ---- seed 000 exercise 1, seed 001: 16 bytes per parameter --------------------------------
def test_sixteen_bytes_per_param_mixed_precision_adam():
    # bf16 weight 2 + bf16 grad 2 + fp32 master 4 + m 4 + v 4 (seed 000; errata: not 12)
    assert sum(memory.param_state_bytes(0, 1, grad_bytes=2)) == 16


# ---- seed 000 exercise 2: ZeRO 1/2/3 for 13B on 32 GPUs -----------------------------------
@pytest.mark.parametrize("zero,expected_gb", [(0, 208.0), (1, 57.0), (2, 32.0), (3, 6.5)])
def test_zero_stages_13b_on_32_gpus(zero, expected_gb):
    per_param = sum(memory.param_state_bytes(zero, 32, grad_bytes=2))
    assert 13e9 * per_param / 1e9 == pytest.approx(expected_gb, rel=0.02)


def test_megatron_recipe_bytes_per_param():
    # Megatron's distributed-optimizer table [S13]: 18 without, 6 + 12/d with (fp32 grads)
    assert sum(memory.param_state_bytes(0, 64)) == 18
    assert sum(memory.param_state_bytes(1, 64)) == pytest.approx(6 + 12 / 64)


# ---- seed 000 exercise 3, seed 001 Ex 6.2 (errata: 112 MB) ---------------------------------
def test_ring_all_reduce_volume_and_time_64mb_on_8():
    gpu = _flat_gpu(intra_gb=100.0)
    group = comm.Group(_cluster(gpu, 8), np.array([8]), np.array([1]))
    t = comm.all_reduce_time(group, 64 * MIB)[0]
    volume = t * 100e9  # bytes each GPU sends at the flat busbw (latency negligible)
    assert volume == pytest.approx(112 * MIB, rel=1e-6)  # 2 x 64 x 7/8


# ---- seed 001 Ex 9.7: DP all-reduce of 7.38 GB over 128 ranks at 50 GB/s -------------------
def test_ring_all_reduce_405b_dp128_over_the_nics():
    gpu = _flat_gpu(intra_gb=400.0, inter_gb=50.0)
    # a DP group of a tp=8 layout: 128 ranks spaced 8 apart, one per node, one NIC each
    group = comm.Group(_cluster(gpu, 1024), np.array([128]), np.array([8]))
    t = comm.all_reduce_time(group, 7.38e9)[0]
    assert t * 50e9 == pytest.approx(2 * 7.38e9 * 127 / 128, rel=1e-6)  # 14.63 GB per GPU
    assert t == pytest.approx(0.293, abs=0.001)


# ---- seed 001 Ex 6.2 / 6.5: TP message = b x s x h activations, 4 all-reduces per layer ----
def test_tp_message_is_bsh_activations_not_weights():
    gpu = _flat_gpu(intra_gb=100.0)
    model = ModelSpec(name="t", num_hidden_layers=4, hidden_size=8192, num_attention_heads=64,
                      intermediate_size=28672, vocab_size=32000, activation="swiglu")
    job = JobSpec(seq_len=4096, global_batch=2)
    cols = estimate_batch(model, _cluster(gpu, 8), job,
                          [Layout(tp=8, dp=1, mbs=1, zero=1, recompute="none", sp=False)])
    msg = 1 * 4096 * 8192 * 2  # b x s x h x 2 bytes = 64 MiB (errata: not d^2)
    assert msg == 64 * MIB
    t_ar = 2 * msg * 7 / 8 / 100e9
    # 2 in forward + 2 in backward per layer, plus one for the vocab-parallel embedding
    # (forward) and one for the LM head (backward), for each of the 2 micro-batches
    expected = 2 * (4 * 4 + 2) * t_ar
    assert cols["time_tp_comm_s"][0] == pytest.approx(expected, rel=1e-6)


# ---- seeds 000 ex 5, 001 ch. 5 and Ex 9.6: bubble fractions --------------------------------
@pytest.mark.parametrize("p,v,m,expected", [(4, 1, 12, 0.25), (4, 4, 12, 0.0625),
                                            (16, 1, 4, 3.75), (16, 2, 4, 1.875),
                                            (4, 1, 32, 3 / 32), (4, 4, 32, 3 / 128)])
def test_bubble_relative_to_compute(p, v, m, expected):
    assert pipeline.bubble_fraction(p, v, m) == pytest.approx(expected)


@pytest.mark.parametrize("p,m,idle", [(8, 8, 7 / 15), (8, 64, 7 / 71)])
def test_bubble_as_fraction_of_step(p, m, idle):
    b = pipeline.bubble_fraction(p, 1, m, schedule="gpipe")
    assert b / (1 + b) == pytest.approx(idle)


@pytest.mark.parametrize("vpp", [1, 4])
def test_bubble_time_in_a_step(vpp):
    """End to end: with no communication the bubble is (p-1)/(v m) of the compute time. The
    seed's stages are equal; here the last one also holds the LM head (vocab 1024), so the idle
    slots are charged at the other stages' mean time (pipeline.bubble_time): exactly (p-1)/(v m)
    of m x that mean (the per-stage times from stage_costs), and the seed's fraction of the
    slowest stage's compute to within the head's share (< 2%)."""
    from planner.costmodel.batch import stage_costs

    gpu = _flat_gpu()
    model = ModelSpec(name="t", num_hidden_layers=32, hidden_size=1024, num_attention_heads=16,
                      intermediate_size=4096, vocab_size=1024, activation="gelu")
    job = JobSpec(seq_len=1024, global_batch=12)
    lo = Layout(tp=1, pp=4, dp=1, vpp=vpp, mbs=1, zero=1, recompute="none")
    cols = estimate_batch(model, _cluster(gpu, 4), job, [lo])
    stages, _ = stage_costs(model, _cluster(gpu, 4), job, [lo],
                            pipeline.stage_features(model, 4, vpp, prune=False))
    others = (stages[0].sum() - stages[0].max()) / 3
    assert cols["time_pp_bubble_s"][0] == pytest.approx(3 / (vpp * 12) * 12 * others, rel=1e-9)
    assert cols["time_pp_bubble_s"][0] / cols["time_compute_s"][0] == pytest.approx(
        3 / (vpp * 12), rel=0.02)


# ---- seed 001 Ex 7.1: checkpoint = 14 bytes per parameter ----------------------------------
def test_checkpoint_size_70b():
    llama2_70b = ModelSpec(name="l", num_hidden_layers=80, hidden_size=8192,
                           num_attention_heads=64, num_key_value_heads=8,
                           intermediate_size=28672, vocab_size=32000, activation="swiglu")
    # published size 68.98B (Touvron et al. 2023 / HF); 70B x 14 B = 980 GB in the seed
    assert llama2_70b.num_params == pytest.approx(68.98e9, rel=1e-3)
    assert memory.checkpoint_bytes(llama2_70b) / 1e9 == pytest.approx(980 * 68.98 / 70, rel=1e-3)


# ---- seed 001 chapter 9: Llama 3.1 405B on TP=8 / PP=16 -------------------------------------
def _seed_405b() -> ModelSpec:
    # the seed counts attention as 4 d^2 (full-size K, V) and a 3-matrix SwiGLU MLP
    return ModelSpec(name="405b-seed", num_hidden_layers=126, hidden_size=16384,
                     num_attention_heads=128, intermediate_size=53248, vocab_size=128256,
                     activation="swiglu", seq_len=8192, global_batch=2048)


def test_405b_layer_params_and_stage_split():
    model = _seed_405b()
    assert model.layer_params(0) == pytest.approx(3.69e9, rel=2e-3)
    assert max(pipeline.stage_layer_counts(126, 16)) == 8
    assert sum(pipeline.stage_layer_counts(126, 16)) == 126


def test_405b_weight_memory_tp8_pp16():
    model = _seed_405b()
    gpu = _flat_gpu()
    lo = Layout(tp=8, pp=16, dp=128, mbs=1, zero=1, recompute="full", sp=True)
    est = estimate(model, _cluster(gpu, 16384), JobSpec(seq_len=8192, global_batch=2048), lo)
    assert est.peak_stage != 0  # an 8-layer stage, not the 7-layer first stage
    weights_gb = est.mem_weights_gb * 2**30 / 1e9
    assert weights_gb == pytest.approx(7.38, rel=2e-3)  # 8 x 3.69B / 8 x 2 B
    # ZeRO-1 over DP = 128: 12/128 bytes/param x 3.69B = 0.35 GB of optimizer state
    assert est.mem_optimizer_gb * 2**30 / 1e9 == pytest.approx(0.346, rel=0.01)
    assert math.isfinite(est.step_time_s)

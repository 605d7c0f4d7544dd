"""Compute time and FLOP counts against independent formulas (Narayanan 2021, Korthikanti 2022)."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_fixtures import cluster, flat_gpu, gpt3_175b, job, llama_like

from planner.costmodel import compute, estimate, estimate_batch
from planner.layout import Layout

B, S, L, H, V = 1536, 2048, 96, 12288, 51200  # GPT-3 175B (Narayanan 2021 Table 1)


def test_model_flops_are_narayanan_eq3():
    """Megatron paper convention: 72 B s L h^2 (1 + s/(6h) + V/(12 h L)) (no biases)."""
    model = gpt3_175b(linear_bias=False)
    expected = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * H * L))
    assert compute.model_flops_per_step(model, S, B) == pytest.approx(expected, rel=1e-12)


def test_full_recompute_hardware_flops_are_narayanan_appendix():
    """96 B s L h^2 (1 + s/(6h) + V/(16 h L)): one more forward of the layers, not the head."""
    model = gpt3_175b(linear_bias=False)
    hw = compute.model_flops_per_step(model, S, B) + compute.recompute_flops_per_step(
        model, S, B, np.array([2]))[0]
    expected = 96 * B * S * L * H**2 * (1 + S / (6 * H) + V / (16 * H * L))
    assert hw == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_adds_one_attention_forward():
    model = gpt3_175b(linear_bias=False)
    extra = compute.recompute_flops_per_step(model, S, B, np.array([1]))[0]
    assert extra == pytest.approx(4 * B * S**2 * H * L)  # QK^T and PV: 2 x 2 b s^2 h per layer


def _no_hbm_gpu(**kw):
    # element-wise work becomes free: an unphysical test device on purpose (model_copy skips the
    # schema's bound of limits.MAX_HBM_TB_PER_S, which a user's profile must keep)
    return flat_gpu(**kw).model_copy(update={"hbm_tb_per_s": 1e12})


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_compute_time_is_flops_over_achieved_peak(tp):
    """Flat efficiency 0.5 of 100 TFLOP/s, free memory traffic: compute = 3 x forward GEMM FLOP
    + 3.5 x attention FLOP (counted causally, as flash runs it; its backward is 2.5 x) over
    (peak x 0.5) / tp."""
    model = llama_like(num_hidden_layers=4)
    gpu = _no_hbm_gpu()
    jb = job(model, seq_len=2048, global_batch=8)
    lo = Layout(tp=tp, pp=1, dp=1, mbs=2, zero=1, recompute="none", sp=tp > 1)
    cols = estimate_batch(model, cluster(gpu, tp), jb, [lo])
    tokens = 8 * 2048
    attn = model.attention_flops_per_token(2048, causal=True) * tokens
    gemm = model.forward_flops_per_token(2048, causal=True) * tokens - attn
    expected = (3 * gemm + 3.5 * attn) / (100e12 * 0.5) / tp
    assert cols["time_compute_s"][0] == pytest.approx(expected, rel=1e-9)


def test_triton_attention_runs_at_the_fa2_papers_ratios_by_hand():
    """attention="triton" (FlashAttention in Triton): Dao 2023 (FlashAttention-2, sec. 4.1)
    measures FlashAttention-2 1.3-1.5x faster than it in the forward pass (1.4) and 2x in the
    backward. By hand, flat 0.5 of 100 TFLOP/s, free memory traffic, llama-like 4 layers, seq
    4096, 2 sequences: the causal attention FLOP is 2 x (s/2) keys x 64 heads x (128 + 128) per
    token and layer; forward at 50/1.4 TFLOP/s, backward 2.5 x the FLOP at 50/2 TFLOP/s. The
    step differs from the flash one only by the attention core."""
    model = llama_like(num_hidden_layers=4)
    gpu = _no_hbm_gpu()
    lo = Layout(tp=1, pp=1, dp=1, mbs=1, zero=1, recompute="none")
    t = {}
    for kind in ("flash", "triton"):
        jb = job(model, seq_len=4096, global_batch=2, attention=kind)
        t[kind] = estimate_batch(model, cluster(gpu, 1), jb, [lo])["time_compute_s"][0]
    attn_fwd = 2 * 2048 * 64 * (128 + 128) * 4 * (2 * 4096)  # FLOP, all layers, one step
    flash = attn_fwd / 50e12 + 2.5 * attn_fwd / 50e12
    triton = attn_fwd / (50e12 / 1.4) + 2.5 * attn_fwd / (50e12 / 2.0)
    assert t["triton"] - t["flash"] == pytest.approx(triton - flash, rel=1e-9)
    # fwd + bwd: (1.4 + 2.5 x 2) / 3.5 = 1.829 x the flash attention time
    assert triton / flash == pytest.approx(6.4 / 3.5, rel=1e-12)
    assert compute.attention_backward_factor("triton") == pytest.approx(2.5 * 2.0 / 1.4)


def test_recompute_adds_forward_time():
    model = llama_like(num_hidden_layers=4)
    gpu = _no_hbm_gpu()
    jb = job(model, seq_len=2048, global_batch=8)
    times = {}
    for rc in ("none", "selective", "full"):
        lo = Layout(tp=1, pp=1, dp=1, mbs=1, zero=1, recompute=rc)
        times[rc] = estimate_batch(model, cluster(gpu, 1), jb, [lo])["time_compute_s"][0]
    tokens = 8 * 2048
    attn = model.attention_flops_per_token(2048, causal=True) * tokens / 50e12
    layers_fwd = (model.forward_flops_per_token(2048, causal=True) * tokens
                  - 2 * model.vocab_size * model.hidden_size * tokens) / 50e12
    assert times["selective"] - times["none"] == pytest.approx(attn, rel=1e-9)
    assert times["full"] - times["none"] == pytest.approx(layers_fwd, rel=1e-9)


def test_fp8_doubles_gemm_throughput_not_attention_nor_the_head():
    """The layers' GEMMs run at the fp8 peak; flash attention and the LM head stay 16-bit
    (Megatron-Core's output layer is not a Transformer Engine module)."""
    model = llama_like(num_hidden_layers=2)
    gpu = _no_hbm_gpu()  # fp8 peak = 2 x bf16 in the fixture
    lo = Layout(tp=1, pp=1, dp=1, mbs=1, zero=1, recompute="none")
    t16 = estimate_batch(model, cluster(gpu, 1), job(model, global_batch=1), [lo])
    t8 = estimate_batch(model, cluster(gpu, 1), job(model, global_batch=1, precision="fp8"), [lo])
    tokens = 4096
    attn = 3.5 * model.attention_flops_per_token(4096, causal=True) * tokens / 50e12
    head = 3 * 2 * model.vocab_size * model.hidden_size * tokens / 50e12
    gemm = t16["time_compute_s"][0] - attn - head
    assert t8["time_compute_s"][0] == pytest.approx(attn + head + gemm / 2, rel=1e-9)
    assert t8["mfu"][0] < t16["mfu"][0]  # MFU against the fp8 peak


def test_gemm_efficiency_curve_is_read_at_the_gemm_size():
    """Smaller GEMMs (more TP) run at lower efficiency on a rising curve."""
    from planner.specs import Curve

    curve = Curve(points=[(1e9, 0.2), (1e12, 0.8)])
    gpu = _no_hbm_gpu(gemm_efficiency=curve, attention_efficiency=0.8)
    model = llama_like(num_hidden_layers=1)
    jb = job(model, global_batch=1)
    t1 = estimate_batch(model, cluster(gpu, 1), jb, [Layout(tp=1, mbs=1, zero=1)])
    t8 = estimate_batch(model, cluster(gpu, 8), jb, [Layout(tp=8, mbs=1, zero=1, sp=True)])
    assert t8["time_compute_s"][0] * 8 > t1["time_compute_s"][0] * 1.05


def test_throughput_and_utilisation_columns():
    model = gpt3_175b()
    gpu = flat_gpu()
    lo = Layout(tp=8, pp=8, dp=2, mbs=1, zero=1, recompute="full", sp=True)
    est = estimate(model, cluster(gpu, 128), job(model, global_batch=64), lo)
    tokens = 64 * 2048
    assert est.tokens_per_s == pytest.approx(tokens / est.step_time_s)
    assert est.tokens_per_s_per_gpu == pytest.approx(tokens / est.step_time_s / 128)
    mflops = compute.model_flops_per_step(model, 2048, 64)
    assert est.mfu == pytest.approx(mflops / (est.step_time_s * 100e12 * 128))
    assert est.model_tflops_per_gpu == pytest.approx(est.mfu * 100)
    assert est.hfu > est.mfu
    assert est.grad_accum == 64 // (1 * 2)


def test_tile_and_wave_quantization_by_hand():
    """NVIDIA's Matrix Multiplication Background guide (sec. 3.1-3.2): 256 x 128 output tiles
    over 108 A100 SMs. BLOOM's tp = 8 QKV GEMM at one micro-batch: m = 2048 tokens,
    n = 3 x 14336 / 8 = 5376, k = 14336. Outputs: forward 8 x 42 = 336 tiles in 4 waves of 108
    (336/432 useful), dgrad 2048 x 14336 = 896 tiles in 9 waves (896/972), wgrad 14336 x 5376 =
    2352 tiles in 22 waves (2352/2376). The curve's reference: its 4096^3 point (512 tiles,
    5 waves: 512/540) and 8192^3 point (2048 tiles, 19 waves: 2048/2052), interpolated in log
    FLOP at 2 x 2048 x 5376 x 14336."""
    import math

    from planner.costmodel.compute import quantization_factor
    from planner.specs import Curve

    curve = Curve(points=[(2 * 4096**3, 0.8), (2 * 8192**3, 0.8)])
    gpu = flat_gpu(sm_count=108, gemm_efficiency=curve)
    t = math.log(2 * 2048 * 5376 * 14336 / (2 * 4096**3)) / math.log(8)
    ref = 512 / 540 + t * (2048 / 2052 - 512 / 540)
    expected = ref * (432 / 336 + 972 / 896 + 2376 / 2352) / 3
    got = float(quantization_factor(gpu, curve, 2048, 5376, 14336))
    assert got == pytest.approx(expected, rel=1e-9)
    assert got == pytest.approx(1.091, abs=1e-3)
    # four micro-batches fill the waves: the factor falls back towards 1
    assert float(quantization_factor(gpu, curve, 4 * 2048, 5376, 14336)) < got - 0.05
    # no SM count in the profile: not modelled
    assert quantization_factor(flat_gpu(), curve, 2048, 5376, 14336) == 1.0


@pytest.mark.parametrize("recompute,passes", [("none", 3), ("selective", 3), ("full", 4)])
def test_layer_overhead_per_pass(recompute, passes):
    """profile.layer_overhead_us adds a fixed time per layer and micro-batch pass: forward 1,
    backward 2, full recompute's forward 1 more. 2 layers, 4 micro-batches, 250 us."""
    model = llama_like(num_hidden_layers=2)
    lo = Layout(tp=1, pp=1, dp=1, mbs=1, zero=1, recompute=recompute)
    jb = job(model, global_batch=4)
    base = estimate_batch(model, cluster(_no_hbm_gpu(), 1), jb, [lo])["time_compute_s"][0]
    slow = _no_hbm_gpu().model_copy(update={"layer_overhead_us": 250.0})
    got = estimate_batch(model, cluster(slow, 1), jb, [lo])["time_compute_s"][0]
    assert got - base == pytest.approx(4 * 2 * passes * 250e-6, rel=1e-9)

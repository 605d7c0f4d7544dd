"""FP8 casts (costmodel.compute.fp8_cast_bytes / fp8_cast_times): one layer's bytes counted by
hand from Transformer Engine's rules (NVIDIA/TransformerEngine @d0067d0, module/linear.py,
layernorm_linear.py, base.py grad_output_preprocess, normalization ln_api.cpp), the time at the
profile's achieved HBM bandwidth, and the term in estimate_batch; none in BF16."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_fixtures import cluster, flat_gpu, job, llama_like

from planner.costmodel import compute, estimate_batch
from planner.layout import Layout

# Llama 2 70B's layer (llama_like): h 8192, 64 query heads and 8 KV heads of 128, ffn 28672
H, A, KV, D, FFN = 8192, 64, 8, 128, 28672
QKV = (A + 2 * KV) * D  # 10240 q, k, v output features


def _hand_bytes(tokens: int, tp: int, sp: bool) -> tuple[float, float, float]:
    """(forward, backward per micro-batch; weights per step) bytes of one dense layer, by hand.

    Forward, each GEMM input quantized row-wise and column-wise:
      qkv and fc1 inputs, the norm's output: the norm writes 1 B of FP8 where BF16 wrote 2 B,
        then nvte_transpose reads and writes 1 B per element of the gathered (tokens x h) input;
      proj input (tokens x A D / tp) and fc2 input (tokens x FFN / tp): one cast-transpose,
        read 2 B + write 1 + 1 B.
    Backward, each GEMM's output gradient row-wise and column-wise:
      proj and fc2 (row-parallel, tokens x h): with SP quantized row-wise locally (read 2,
        write 1 on tokens / tp), all-gathered, transposed (1 + 1 B on tokens); without SP a
        cast-transpose (4 B);
      qkv (tokens x QKV / tp) and fc1 (tokens x 2 FFN / tp, gate and up): cast-transpose, 4 B.
    Weights: q, k, v, o and the three MLP matrices, local, cast-transposed once a step (4 B)."""
    local = tokens / tp if sp else tokens  # tokens a replicated/SP tensor holds on one rank
    norm = (1 + 1) * tokens * H - 1 * local * H  # transpose of the gathered, 1 B less written
    fwd = 2 * norm + 4 * tokens * A * D / tp + 4 * tokens * FFN / tp
    row = (3 * tokens / tp + 2 * tokens) * H if sp else 4 * tokens * H
    bwd = 2 * row + 4 * tokens * QKV / tp + 4 * tokens * 2 * FFN / tp
    weights = 4 * (H * QKV + A * D * H + 3 * H * FFN) / tp
    return fwd, bwd, weights


@pytest.mark.parametrize(("tokens", "tp", "sp"), [(4096, 4, True), (8192, 2, False),
                                                  (2048, 1, False)])
def test_one_layer_cast_bytes_by_hand(tokens, tp, sp):
    b = compute.fp8_cast_bytes(llama_like(), False, np.array([tokens]), np.array([tp]),
                               np.array([sp]))
    fwd, bwd, weights = _hand_bytes(tokens, tp, sp)
    assert b.forward[0] == pytest.approx(fwd, rel=1e-12)
    assert b.backward[0] == pytest.approx(bwd, rel=1e-12)
    assert b.weights[0] == pytest.approx(weights, rel=1e-12)


def test_cast_time_is_bytes_over_achieved_hbm_bandwidth():
    """tp 4 with SP, 4096 tokens: forward 65536 B and backward 112640 B per token (by hand:
    2 x 1.75 h + 4 h + 4 x 28672 / 4; 2 x 2.75 h + 4 x 10240 / 4 + 4 x 2 x 28672 / 4) at
    3.35 TB/s x 0.91."""
    assert _hand_bytes(1, 4, True)[:2] == (65536, 112640)
    gpu = flat_gpu(hbm_tb_per_s=3.35, hbm_efficiency=0.91)
    f, b, w = compute.fp8_cast_times(llama_like(), gpu, "fp8", False, np.array([4096.0]),
                                     np.array([4.0]), np.array([True]))
    bw = 3.35e12 * 0.91
    assert f[0] == pytest.approx(65536 * 4096 / bw, rel=1e-12)
    assert b[0] == pytest.approx(112640 * 4096 / bw, rel=1e-12)
    assert w[0] == pytest.approx(_hand_bytes(4096, 4, True)[2] / bw, rel=1e-12)


def test_bf16_has_no_cast_term():
    gpu = flat_gpu()
    for precision in ("bf16", "fp16"):
        times = compute.fp8_cast_times(llama_like(), gpu, precision, False, np.array([4096.0]),
                                       np.array([4.0]), np.array([True]))
        assert all(float(t[0]) == 0.0 for t in times)
    model = llama_like(num_hidden_layers=8)
    cols = estimate_batch(model, cluster(gpu, 8), job(model, global_batch=16),
                          [Layout(tp=4, dp=2, mbs=1, sp=True)])
    assert cols["fp8_cast_mb_s"][0] == 0.0 and cols["fp8_weight_cast_s"][0] == 0.0


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_step_carries_the_casts(monkeypatch, recompute):
    """time_compute_s of an FP8 plan less the same plan with the casts zeroed: m micro-batches
    x L layers x (forward + backward casts; forward again under full recompute), plus the L
    layers' weights once a step (pp 1: the one stage holds every layer)."""
    model = llama_like(num_hidden_layers=8)
    gpu = flat_gpu(hbm_tb_per_s=3.35, hbm_efficiency=0.91)
    lay = Layout(tp=4, dp=2, mbs=1, sp=True, recompute=recompute)
    jb = job(model, global_batch=16, precision="fp8")  # m = 16 / (1 x 2) = 8 micro-batches
    with_casts = estimate_batch(model, cluster(gpu, 8), jb, [lay])
    real = compute.fp8_cast_times
    monkeypatch.setattr(compute, "fp8_cast_times",
                        lambda *a, **k: tuple(np.zeros_like(t) for t in real(*a, **k)))
    without = estimate_batch(model, cluster(gpu, 8), jb, [lay])
    fwd, bwd, weights = _hand_bytes(model.seq_len, 4, True)
    bw = 3.35e12 * 0.91
    passes = fwd * (2 if recompute == "full" else 1) + bwd
    expected = (8 * 8 * passes + 8 * weights) / bw
    delta = with_casts["time_compute_s"][0] - without["time_compute_s"][0]
    assert delta == pytest.approx(expected, rel=1e-9)
    assert with_casts["fp8_cast_mb_s"][0] == pytest.approx(8 * passes / bw, rel=1e-9)
    assert with_casts["fp8_weight_cast_s"][0] == pytest.approx(8 * weights / bw, rel=1e-9)
    assert without["fp8_cast_mb_s"][0] == 0.0

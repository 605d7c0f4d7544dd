"""Memory terms: Korthikanti 2022 Table 2 from the derived per-layer tensors, recipes, buffers."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_fixtures import a100, cluster, flat_gpu, gpt3_175b, job, llama_like

from planner.costmodel import estimate, estimate_batch, memory
from planner.layout import Layout

S, H, A, T = 2048, 12288, 96, 8  # GPT-3 175B, s = 2048, t = 8 (Korthikanti 2022 sec. 5)
GIB = 2**30


def _per_token(tp, sp, recompute, flash=False):
    act = memory.layer_activation(gpt3_175b(), moe=False, dropout=True)
    return float(memory.activation_per_token(act, np.array([tp]), np.array([sp]),
                                             np.array([recompute]), S, flash=flash)[0])


# Korthikanti Table 2, bytes per layer divided by s*b*h (b = 1)
@pytest.mark.parametrize("tp,sp,recompute,expected", [
    (1, False, 0, 34 + 5 * A * S / H),                  # no parallelism
    (T, False, 0, 10 + 24 / T + 5 * A * S / (H * T)),   # tensor parallel
    (T, True, 0, (34 + 5 * A * S / H) / T),             # tensor + sequence parallel
    (T, False, 1, 10 + 24 / T),                         # TP + selective recompute
    (T, True, 1, 34 / T),                               # TP + SP + selective recompute
    (1, False, 2, 2),                                   # full recompute: the layer input
])
def test_korthikanti_table2(tp, sp, recompute, expected):
    assert _per_token(tp, sp, recompute) / H == pytest.approx(expected, rel=1e-12)


def test_flash_attention_drops_the_score_term():
    with_flash = _per_token(T, True, 0, flash=True)
    # only the fp32 softmax statistics (4 bytes per head per token) remain of the score tensors
    assert with_flash == pytest.approx(34 * H / T + 4 * A / T)
    assert _per_token(T, True, 1, flash=True) == pytest.approx(34 * H / T)


def test_gqa_and_swiglu_change_the_tensors():
    m = llama_like()  # h 8192, 64 heads of 128, 8 KV heads, ffn 28672, no dropout
    act = memory.layer_activation(m, moe=False)
    h, ffn = 8192, 28672
    assert act.replicated == 8 * h  # two norm inputs, QKV input, MLP input (no dropout masks)
    assert act.kv_sharded == 2 * 2 * 8 * 128  # K and V of 8 heads, 2 bytes
    assert act.sharded == 2 * h + 2 * h + 6 * ffn  # Q, context, gate+up outputs and product
    # tp = 16 > 8 KV heads: K and V are replicated pairwise, divided by 8 only
    per = memory.activation_per_token(act, np.array([16]), np.array([True]), np.array([1]), 4096)
    assert per[0] == pytest.approx(8 * h / 16 + (4 * h + 6 * ffn) / 16 + 2 * 2 * 8 * 128 / 8)


def test_first_stage_holds_pp_micro_batches_of_its_layers():
    """GPT-3 175B, TP 8, PP 8, SP + selective: stage 0 holds 8 micro-batches x 12 layers, i.e.
    34 s b h L / t bytes (Korthikanti sec. 4.2.3) less the two 1-byte dropout masks per layer
    (dropout off by default: 32 s b h L / t), plus token ids (8 B per token)."""
    model = gpt3_175b()
    lo = Layout(tp=8, pp=8, dp=1, mbs=1, zero=1, recompute="selective", sp=True)
    est = estimate(model, cluster(a100(), 64), job(model, global_batch=64), lo)
    layers = 32 * S * H * 96 / 8
    extras = 8 * S * 8  # token ids of 8 micro-batches
    assert est.peak_stage == 0 and est.in_flight == 8
    assert est.mem_activations_gb * GIB == pytest.approx(layers + extras, rel=1e-9)


def test_weights_grads_optimizer_follow_the_recipe():
    model = llama_like()
    gpu = flat_gpu(memory_gib=1000)
    rows = {}
    for zero in range(4):
        lo = Layout(tp=8, pp=1, dp=8, mbs=1, zero=zero, recompute="full", sp=True)
        rows[zero] = estimate(model, cluster(gpu, 64), job(model), lo)
    p = model.num_params / 8 / GIB  # GiB per byte-per-param on one GPU (everything / tp)
    assert rows[0].mem_weights_gb == pytest.approx(2 * p)
    assert rows[0].mem_grads_gb == pytest.approx(4 * p)  # fp32 main grads (Megatron)
    assert rows[0].mem_optimizer_gb == pytest.approx(12 * p)
    assert rows[1].mem_optimizer_gb == pytest.approx(12 * p / 8)
    assert rows[2].mem_grads_gb == pytest.approx(2 * p / 8)
    assert rows[3].mem_weights_gb == pytest.approx(2 * p / 8)
    # ZeRO-3 keeps three unsharded layers alive (gathered, prefetched, unreduced grads)
    unit = model.layer_params(0) / 8 * 2
    assert rows[3].mem_other_gb * GIB == pytest.approx(3 * unit + 4096 * 8192 * 2)


def test_last_stage_carries_logits():
    model = llama_like()
    gpu = flat_gpu(memory_gib=1000)
    # selective: the logits coexist with the stored layers (under full recompute the rebuilt
    # layer comes after the head's backward has freed them, memory.stage_activation_bytes)
    lo = Layout(tp=8, pp=4, dp=1, mbs=2, zero=1, recompute="selective", sp=True)
    cols = estimate_batch(model, cluster(gpu, 32), job(model, global_batch=2), [lo])
    # m = 1 micro-batch: every stage holds one; the last adds fp32 logits (4 bytes / t)
    assert cols["peak_stage"][0] == 3
    logits = 2 * 4096 * 32000 * memory.LOGIT_BYTES / 8
    assert cols["mem_activations_gb"][0] * GIB > logits


def test_not_fitting_is_estimated_with_reasons():
    model = llama_like()
    lo = Layout(tp=8, pp=1, dp=16, mbs=1, zero=0, recompute="none", sp=True)
    est = estimate(model, cluster(a100(), 128), job(model), lo)
    assert not est.fits
    assert est.peak_mem_gb > est.mem_capacity_gb
    over = est.peak_mem_gb - est.mem_capacity_gb
    assert f"by {over:.1f} GiB" in est.overflow[0]
    assert any("model state alone" in line for line in est.overflow)


def test_memory_columns_add_up():
    model = llama_like()
    lo = Layout(tp=4, pp=2, dp=16, mbs=1, zero=1, recompute="selective", sp=True)
    est = estimate(model, cluster(a100(), 128), job(model), lo)
    parts = (est.mem_weights_gb + est.mem_grads_gb + est.mem_optimizer_gb
             + est.mem_activations_gb + est.mem_other_gb)
    assert parts == pytest.approx(est.peak_mem_gb)
    assert est.mem_capacity_gb == pytest.approx(80 - 4.0)  # usable = HBM - reserve

"""Attention FLOPs of sliding-window, sink and MLA layers, counted by hand, and the model FLOPs
per token against the ones NVIDIA publishes beside its measured throughput."""

from __future__ import annotations

import pytest

from planner.costmodel.compute import layer_forward_times
from planner.costmodel.memory import layer_activation
from planner.registry import builtin_models, load_gpu
from planner.specs import ModelSpec


def test_gpt_oss_window_flops_by_hand():
    """gpt-oss-120b at s = 4096: 18 full layers attend to s/2 keys on average (causal), 18
    window layers to the band w - w^2/(2s) = 128 - 2 = 126; 2 x 64 heads x (64 + 64) FLOP
    per key. Non-causal (the Megatron papers' model FLOPs) doubles both."""
    spec = builtin_models()["gpt-oss-120b"]
    s, w = 4096, 128
    per_key = 2 * 64 * (64 + 64)
    causal = 18 * per_key * s / 2 + 18 * per_key * (w - w * w / (2 * s))
    assert spec.attention_flops_per_token(s, causal=True) == pytest.approx(causal, rel=1e-12)
    assert spec.attention_flops_per_token(s, causal=False) == pytest.approx(2 * causal)
    # a window as long as the sequence is full attention
    wide = ModelSpec(**(spec.model_dump() | {"sliding_window": s}))
    assert wide.attention_flops_per_token(s) == pytest.approx(36 * per_key * s)


def test_window_and_sinks_leave_the_dense_count_unchanged():
    """Without windows the count is the plain 2 s a (qk + v) per layer (Narayanan 2021)."""
    spec = builtin_models()["qwen3-8b"]
    assert spec.attention_flops_per_token(4096) == 2 * 4096 * 32 * 256 * 36


def test_window_shortens_the_attention_time():
    """The flash-attention core of a layer scales with its attended keys: gpt-oss-120b at
    s = 32768 with its windows against the same model with full attention everywhere."""
    spec = builtin_models()["gpt-oss-120b"]
    full = ModelSpec(**(spec.model_dump() | {"sliding_window": None, "layer_types": None}))
    gpu = load_gpu("H100-SXM")
    s = 32768

    def core(model):
        return layer_forward_times(model, gpu, "bf16", True, s, 1, 1, False, s).attention

    w = 128
    ratio = (18 * s / 2 + 18 * (w - w * w / (2 * s))) / (36 * s / 2)
    assert float(core(spec) / core(full)) == pytest.approx(ratio, rel=1e-9)
    # flash attention stores O(s) tensors either way: no activation memory change
    assert layer_activation(spec, True) == layer_activation(full, True)


def test_mla_flops_match_megatron_bridge_formula():
    """DeepSeek-V3 per token per layer, Megatron-Bridge flop_utils.py transformer_flops (MLA
    branch, 067f987): projections q_lora (h + a (qk + rope)) + kv_lora (h + a (qk + v)) + h
    rope + a v h, core attention s/2 x a (qk + rope) + s/2 x a v, each x 2 (multiply-add);
    their norm terms (+1 per rank) are not matmuls and are left out here."""
    spec = builtin_models()["deepseek-v3"]
    h, a, s = 7168, 128, 4096
    proj = 1536 * (h + a * (128 + 64)) + 512 * (h + a * (128 + 128)) + h * 64 + a * 128 * h
    core = s / 2 * a * (128 + 64) + s / 2 * a * 128
    assert spec.attention_matmul_params == proj
    assert spec.attention_flops_per_token(s, causal=True) / 61 == pytest.approx(2 * core, rel=1e-12)


# Measured tokens/s/GPU and "Model TFLOP/sec/GPU" of the same row (Megatron-Bridge
# docs/performance-summary-archive.md, 067f987, 26.04.01 container, DGX-H100 / DGX-GB300):
# TFLOP/s / tokens/s is NVIDIA's model FLOPs per token (causal attention, no router).
NVIDIA_FLOPS_ROWS = [
    ("qwen3-235b-a22b", 1712, 253),
    ("qwen3-30b-a3b", 8960, 206),
    ("kimi-k2", 5328, 1088),
]


@pytest.mark.parametrize(("name", "tokens_s", "tflops"), NVIDIA_FLOPS_ROWS)
def test_model_flops_match_nvidia_published(name, tokens_s, tflops):
    """Within 1%: the published TFLOP/s are printed to 3-4 digits and this count adds the
    router GEMM (0.3% of Qwen3-235B's) that NVIDIA's leaves out."""
    spec = builtin_models()[name]
    ours = spec.train_flops_per_token(4096, causal=True) * tokens_s / 1e12
    assert ours == pytest.approx(tflops, rel=0.01)


def test_mla_activation_bytes_by_hand():
    """DeepSeek-V3 dense layer, bf16, bytes per token as Megatron-Core's MLA keeps them
    (multi_latent_attention.py): Q and K of 128 heads x (128 + 64), V and the context of 128 x
    128, the two latents entering the up-projections (q 1536, kv 512); no GQA sharing, so all of
    it divides by t. MLP: SwiGLU gate, up (2 x 2 B x ffn) and their product (2 B x ffn)."""
    spec = builtin_models()["deepseek-v3"]
    act = layer_activation(spec, False)
    a, h, ffn = 128, 7168, 18432
    attention = 2 * (a * 192 + a * 192 + a * 128 + a * 128) + 2 * (1536 + 512)
    assert act.sharded == attention + 6 * ffn
    assert act.kv_sharded == 0
    assert act.replicated == 2 * 2 * h + 2 * h + 2 * h  # norm inputs, QKV-down and MLP inputs
    assert act.softmax_stats == 4 * a


def test_deepseek_v3_mtp_module():
    """One MTP module (DeepSeek-V3 report sec. 2.2): two RMSNorms, a 2h -> h projection and one
    MoE layer, plus a final norm; with its checkpoint copies of the embedding and head (2 V h)
    it is the 685B - 671B of the released weights (13.5B; the report says 14B). Its training
    FLOPs added to the model's reproduce NVIDIA's published DeepSeek-V3 TFLOP/s (26.04.01,
    GB300: 4992 tokens/s/GPU, 1298 TFLOP/s/GPU), which count the MTP layer; without it the
    count is 3.7% short."""
    spec = builtin_models()["deepseek-v3"]
    h, vocab = 7168, 129280
    moe_layer = spec.layer_params(60)
    assert spec.mtp_params == 2 * h + 2 * h * h + moe_layer + h
    assert (spec.mtp_params + 2 * vocab * h) / 1e9 == pytest.approx(13.5, abs=0.05)
    assert spec.num_params / 1e9 == pytest.approx(671.03, abs=0.01)  # MTP not in the total
    per_token = spec.train_flops_per_token(4096, causal=True)
    mtp = spec.mtp_flops_per_token(4096, causal=True)
    assert (per_token + mtp) * 4992 / 1e12 == pytest.approx(1298, rel=0.01)
    assert per_token * 4992 / 1e12 == pytest.approx(1298 * 0.963, rel=0.01)
    assert builtin_models()["kimi-k2"].mtp_flops_per_token(4096) == 0

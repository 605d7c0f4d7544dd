"""Job-level recipes: gradient dtype (JobSpec.grad_dtype) and attention kernel
(JobSpec.attention), checked against hand computations on flat profiles."""

from __future__ import annotations

import pytest
from costmodel_fixtures import cluster, flat_gpu, gpt3_175b, job, llama_like

from planner import limits
from planner.costmodel import estimate, pipeline
from planner.layout import Layout
from planner.specs import GIB


@pytest.mark.parametrize("grad_dtype,zero,bytes_per_param", [
    ("auto", 1, 4.0),  # Megatron distributed optimizer: fp32 main grads
    # DeepSpeed fp16 ZeRO-1: 16-bit grads, not sharded (ZeRO paper: 2 + 2); the fp32 gradient
    # of the optimizer's partition exists at the step only (test_memory_published)
    ("half", 1, 2.0),
    ("half+fp32", 1, 6.0),  # BF16_Optimizer: + 4 B/param unsharded fp32 accumulator
    ("fp32", 2, 4.0 / 8),  # ZeRO-2 shards 4-byte grads over dp = 8
    ("half+fp32", 2, 2.0 / 8 + 4.0),  # the accumulator stays whole
])
def test_grad_bytes_per_param(grad_dtype, zero, bytes_per_param):
    model = llama_like()
    gpu = flat_gpu(memory_gib=1000)
    lo = Layout(tp=8, pp=1, dp=8, mbs=1, zero=zero, recompute="full", sp=True)
    est = estimate(model, cluster(gpu, 64), job(model, grad_dtype=grad_dtype), lo)
    p = model.num_params / 8 / GIB  # GiB per byte-per-param on one GPU
    assert est.mem_grads_gb == pytest.approx(bytes_per_param * p)
    assert est.mem_optimizer_gb == pytest.approx(12 * p / 8)


def test_unfused_attention_keeps_the_score_tensors():
    """GPT-3 175B, t = 8, pp = 1, one micro-batch, no recompute: unfused attention stores the
    softmax output, 2 bytes x a heads x s keys per token (Korthikanti Table 2's 5as/h less the
    dropout mask and dropout output: dropout is off), instead of flash's fp32 log-sum-exp (4a)."""
    model = gpt3_175b()
    gpu = flat_gpu(memory_gib=10_000)
    s, a, L, t = 2048, 96, 96, 8
    lo = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute="none", sp=True)
    cl = cluster(gpu, 8)
    flash = estimate(model, cl, job(model, global_batch=1), lo)
    unfused = estimate(model, cl, job(model, global_batch=1, attention="unfused"), lo)
    extra = s * L * (2 * a * s - 4 * a) / t
    assert (unfused.mem_activations_gb - flash.mem_activations_gb) * GIB == pytest.approx(extra)
    sel = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute="selective", sp=True)
    assert estimate(model, cl, job(model, global_batch=1, attention="unfused"),
                    sel).mem_activations_gb == pytest.approx(
        estimate(model, cl, job(model, global_batch=1), sel).mem_activations_gb)


def test_unfused_attention_time_by_hand():
    """Flat GPU (100 TFLOP/s x 0.5, HBM 1 TB/s): per layer and micro-batch, forward = QK^T + AV
    over the full s x s square (4 s^2 a d FLOP / t, not halved by causality) at the GEMM rate,
    + softmax traffic 4 B per score; backward 2x. Flash instead: causal half at the attention
    rate, backward 2.5x. The compute difference is the attention difference."""
    model = gpt3_175b()
    gpu = flat_gpu(tflops=100.0, eff=0.5)
    s, a, d, L, t = 2048, 96, 128, 96, 8
    lo = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute="none", sp=True)
    cl = cluster(gpu, 8)
    flash = estimate(model, cl, job(model, global_batch=1), lo)
    unfused = estimate(model, cl, job(model, global_batch=1, attention="unfused"), lo)
    rate, hbm = 100e12 * 0.5, 1e12
    scores = s * s * a / t
    bmm = max(4 * s * s * a * d / t / rate, 4 * scores / hbm)  # flat curve: 2 calls = 1 rate
    fwd_unfused = bmm + 4 * scores / hbm
    fwd_flash = 2 * s * s * a * d / t / rate  # causal half of 4 s^2 a d
    expected = L * (3 * fwd_unfused - 3.5 * fwd_flash)
    assert unfused.time_compute_s - flash.time_compute_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("pp,vpp,m,expected", [
    (4, 1, 8, 3.0),  # 1F1B: pp - 1 whatever m (Narayanan 2021)
    (4, 1, 2, 3.0),
    (4, 2, 8, 1.5),  # interleaved, m >= pp: (pp - 1) / vpp
    (4, 2, 4, 1.5),
    (4, 2, 1, 3.0),  # one micro-batch: interleaving cannot overlap anything
    # m = 2 < pp = 4, vpp = 2: chunk slots of t/2: each of the 2 rounds waits pp = 4 slots for
    # its first micro-batch, the last round ends m - 1 = 1 slot later: 9 slots = 4.5 t for 2 t
    # of work -> 2.5 t idle
    (4, 2, 2, 2.5),
])
def test_bubble_slots(pp, vpp, m, expected):
    assert float(pipeline.bubble_slots(pp, vpp, m)) == pytest.approx(expected)


def test_reduction_after_backward_is_fully_exposed():
    """grad_overlap=False: the whole DP traffic is on the step; flat GPU, dp = 8 in one node,
    ZeRO 0, fp32 gradients all-reduced: 2 (d-1)/d x bytes / busbw."""
    model = llama_like(num_hidden_layers=4, vocab_size=1024)
    gpu = flat_gpu(intra_gb=100.0, memory_gib=10_000, dp_overlap=1.0)
    lo = Layout(tp=1, pp=1, dp=8, mbs=1, zero=0, recompute="none")
    est = estimate(model, cluster(gpu, 8), job(model, global_batch=8, grad_overlap=False), lo)
    expected = 2 * 7 / 8 * model.num_params * 4 / 100e9
    assert est.time_dp_comm_exposed_s == pytest.approx(expected, rel=1e-3)
    hidden = estimate(model, cluster(gpu, 8), job(model, global_batch=8), lo)
    assert hidden.time_dp_comm_exposed_s < est.time_dp_comm_exposed_s


def test_cudnn_attention_runs_at_the_fused_efficiency():
    """attention="cudnn" reads profile.fused_attention_efficiency: on a flat GPU (100 TFLOP/s,
    flash at 0.5) with a fused efficiency of 0.8, the attention core (causal 2 s^2 a d / t FLOP
    per layer forward, 3.5x for forward + backward) takes 0.5/0.8 of the flash time; memory is
    the same (neither keeps s x s tensors). Without the field, cudnn falls back to flash."""
    model = gpt3_175b()
    s, a, d, L, t = 2048, 96, 128, 96, 8
    lo = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute="none", sp=True)
    gpu = flat_gpu(tflops=100.0, eff=0.5, fused_attention_efficiency=0.8)
    cl = cluster(gpu, 8)
    flash = estimate(model, cl, job(model, global_batch=1), lo)
    fused = estimate(model, cl, job(model, global_batch=1, attention="cudnn"), lo)
    attn_flash = L * 3.5 * 2 * s * s * a * d / t / (100e12 * 0.5)
    expected = attn_flash * (1 - 0.5 / 0.8)
    assert flash.time_compute_s - fused.time_compute_s == pytest.approx(expected, rel=1e-9)
    assert fused.mem_activations_gb == pytest.approx(flash.mem_activations_gb)
    plain = cluster(flat_gpu(tflops=100.0, eff=0.5), 8)
    assert estimate(model, plain, job(model, global_batch=1, attention="cudnn"),
                    lo).time_compute_s == pytest.approx(
        estimate(model, plain, job(model, global_batch=1), lo).time_compute_s)


def _offload_pair(link_gb_per_s: float):
    model = llama_like()
    gpu = flat_gpu(memory_gib=10_000, host_link_gb_per_s=link_gb_per_s)
    cl = cluster(gpu, 8)
    jb = job(model, global_batch=1)
    none = estimate(model, cl, jb, Layout(tp=8, pp=1, dp=1, mbs=1, recompute="none", sp=True))
    off = estimate(model, cl, jb, Layout(tp=8, pp=1, dp=1, mbs=1, recompute="offload", sp=True))
    return none, off


# llama_like (Llama 2 70B shape) at tp 8 with SP and flash attention, bytes per token of one
# layer: norm inputs + QKV and MLP inputs 8h / 8, Q + context 4h and SwiGLU 6 ffn / 8, K and V
# 2 x 2 x 8 x 128 / 8, fp32 softmax statistics 4 a / 8 (Korthikanti 2022 sec. 4.1 generalized)
LLAMA_TP8_BYTES_PER_TOKEN = (8 * 8192 + 4 * 8192 + 6 * 28672 + 4 * 8 * 128 + 4 * 64) / 8


def test_offload_keeps_two_layers_and_hides_its_copies_behind_compute():
    """recompute='offload' (Megatron-Core cpu_offloading): 80 layers of one 4096-token
    micro-batch go to host memory, two stay resident (the one being copied and the next); over
    a fast host link the copies hide behind each layer's forward and backward."""
    none, off = _offload_pair(limits.MAX_LINK_GB_PER_S)
    per_layer = 4096 * LLAMA_TP8_BYTES_PER_TOKEN
    saved = (80 - 2) * per_layer / GIB
    assert none.mem_activations_gb - off.mem_activations_gb == pytest.approx(saved, rel=1e-9)
    assert off.time_compute_s == pytest.approx(none.time_compute_s, rel=1e-12)
    assert off.hw_tflops_per_gpu == pytest.approx(none.hw_tflops_per_gpu)  # nothing recomputed


def test_offload_copies_are_exposed_beyond_the_layer_compute():
    """A 1 MB/s host link: each layer's 140.6 MB go out in forward and back in backward, far
    longer than its compute, so the step is the copies (2 x 80 x 140.6 s)."""
    _, off = _offload_pair(1e-3)
    copies = 2 * 80 * 4096 * LLAMA_TP8_BYTES_PER_TOKEN / 1e6
    assert off.time_compute_s == pytest.approx(copies, rel=1e-6)


def test_offload_needs_a_host_link():
    model = llama_like()
    lo = Layout(tp=8, pp=1, dp=1, mbs=1, recompute="offload", sp=True)
    from planner.costmodel.checks import layout_violations
    reasons = layout_violations(model, cluster(flat_gpu(), 8), job(model, global_batch=1), lo)
    assert any("host link" in r for r in reasons)


def test_default_stack_attention_is_te_choice_per_gpu():
    """The default stack (Megatron-Core with Transformer Engine) runs cuDNN fused attention where
    the profile has that class (TE prefers FusedAttention on Hopper+) and FlashAttention-2's rate
    where it has not (A100): on the stock A100 the default job costs what a flash job costs, on
    the stock H100 the attention core runs at fused_attention_efficiency instead of the flash
    rate (the difference computed by hand from the two efficiencies)."""
    from planner import load_model, parse_cluster
    from planner.stacks import DEFAULT_STACK, resolve_stack

    model = load_model("llama2-7b")
    preset = resolve_stack(DEFAULT_STACK)
    lo = Layout(tp=1, pp=1, dp=8, mbs=1, zero=1, recompute="none")
    base = job(model, global_batch=8)
    for name in ("8xA100", "8xH100"):
        cl = parse_cluster(name)
        gpu = cl.gpu
        default = estimate(model, cl, preset.job(base), lo)
        flash = estimate(model, cl, base.model_copy(update={"attention": "flash"}), lo)
        if gpu.fused_attention_efficiency is None:
            assert name == "8xA100"
            assert default.time_compute_s == pytest.approx(flash.time_compute_s, rel=1e-12)
            continue
        s, a, d, L = base.seq_len, model.num_attention_heads, model.head_size, 32
        # one sequence per GPU (global batch 8 on dp 8): causal 2 s^2 a d FLOP per layer
        # forward, 3.5x for forward + backward (as the test above)
        core = L * 3.5 * 2 * s * s * a * d
        peak = gpu.peak_flops("bf16")
        expected = core / peak * (1 / gpu.attention_efficiency - 1 / gpu.fused_attention_efficiency)
        assert flash.time_compute_s - default.time_compute_s == pytest.approx(expected, rel=1e-6)


def _small_gpt():
    """2 layers, h 1024, 16 heads, GeLU 4h, vocabulary 8192 tied, learned positions (2048),
    LayerNorm and biases: P = 12 l h^2 + 13 l h + (V + s) h + 2 h (the final LayerNorm)
    = 25,165,824 + 26,624 + 10,485,760 + 2,048 = 35,680,256, below one 40M-element bucket."""
    return gpt3_175b(num_hidden_layers=2, hidden_size=1024, num_attention_heads=16,
                     intermediate_size=4096, vocab_size=8192, tie_word_embeddings=True)


def test_megatron_2021_all_reduces_16_bit_gradients_by_hand():
    """Megatron-LM @ 8aa4619 (DLPerf's commit) local DDP flattens the fp16 .grad and all-reduces
    it after the backward, in fp32 only with --fp32-allreduce (off: megatron/model/
    distributed.py allreduce_params, megatron/arguments.py). On one node of 8 flat GPUs
    (100 GB/s, negligible latency), dp 8, ZeRO 0, the preset's recipe (no overlap): one ring
    all-reduce of 2 B x P = 71,360,512 bytes, 2 x 71,360,512 x 7/8 / 100e9 = 1.2488 ms, all of
    it exposed; the fp32 main grads (4 B, the memory's) would send twice that."""
    from planner.stacks import resolve_stack

    model = _small_gpt()
    p = 12 * 2 * 1024**2 + 13 * 2 * 1024 + (8192 + 2048) * 1024 + 2 * 1024
    assert p == 35_680_256 and model.num_params == p
    gpu = flat_gpu(memory_gib=1000)
    lo = Layout(tp=1, pp=1, dp=8, mbs=1, zero=0, recompute="full", sp=False)
    stack = resolve_stack("megatron-lm-2021")
    half = stack.job(job(model, global_batch=8, precision="fp16"))
    assert half.grad_reduce_dtype == "half" and not half.grad_overlap
    est = estimate(model, cluster(gpu, 8), half, lo)
    assert est.time_dp_comm_exposed_s == pytest.approx(2 * (2 * p) * 7 / 8 / 100e9, rel=1e-9)
    assert est.time_dp_comm_exposed_s == pytest.approx(1.2488e-3, rel=1e-4)
    fp32 = estimate(model, cluster(gpu, 8), half.model_copy(update={"grad_reduce_dtype": "fp32"}),
                    lo)
    assert fp32.time_dp_comm_exposed_s == pytest.approx(2 * (4 * p) * 7 / 8 / 100e9, rel=1e-9)
    # "auto" is the recipe's reduced buffer: Megatron's fp32 main grads at ZeRO 0, 4 B
    auto = estimate(model, cluster(gpu, 8), half.model_copy(update={"grad_reduce_dtype": "auto"}),
                    lo)
    assert auto.time_dp_comm_exposed_s == pytest.approx(fp32.time_dp_comm_exposed_s)
    # the payload only: the memory (fp32 main grads beside the 16-bit .grad) is the same
    for col in ("mem_weights_gb", "mem_grads_gb", "mem_optimizer_gb", "mem_activations_gb",
                "mem_other_gb", "peak_mem_gb"):
        assert getattr(est, col) == getattr(auto, col)
    assert est.mem_grads_gb == pytest.approx((4 + 2) * p / GIB)  # fp32 main + fp16 .grad


@pytest.mark.parametrize("grad_dtype,zero,width", [
    ("auto", 0, 4.0), ("auto", 2, 2.0), ("half", 0, 2.0), ("fp32", 3, 4.0),
    ("half+fp32", 1, 4.0),  # BF16_Optimizer reduces its fp32 accumulator
])
def test_grad_reduce_width_follows_the_recipe_unless_named(grad_dtype, zero, width):
    """JobSpec.grad_reduce_dtype auto: the recipe's reduced buffer; half / fp32 name it."""
    from planner.costmodel import memory

    assert memory.grad_reduce_bytes(zero, grad_dtype) == width
    assert memory.grad_reduce_bytes(zero, grad_dtype, "half") == 2.0
    assert memory.grad_reduce_bytes(zero, grad_dtype, "fp32") == 4.0

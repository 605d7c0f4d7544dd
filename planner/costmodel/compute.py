"""Compute time of one micro-batch on one stage, and FLOP counts.

GEMMs: every projection is its own GEMM whose FLOP (2 x tokens x weight elements / t after the
TP split) sets its achieved efficiency from the profile's curve (docs/hardware.md 2.1: efficiency
collapses below ~2048^3); time = FLOP / (peak x efficiency(FLOP)). Attention core (flash) runs
at profile.attention_efficiency of the 16-bit peak, counted causally (half the s x s square);
the older Triton kernel (attention="triton") at that rate / 1.4 forward and / 2.0 backward.
Backward = 2 x forward (dgrad + wgrad; Narayanan 2021 sec. 5.1, Megatron's expansion factor
3 = fwd + 2 bwd [S13]), except flash attention's backward, 2.5 x its forward
(FlashAttention-2). Element-wise work (norms, residual adds, rotary, activation function, MoE
permutation, cross-entropy) is memory-bound: bytes moved / achieved HBM bandwidth.
Model FLOPs follow the Megatron paper convention: ModelSpec.train_flops_per_token with
causal=False (Narayanan 2021 eq. 3, the full s x s attention square); hardware FLOPs add the
recomputed forward work (Korthikanti 2022 sec. 5: selective adds the attention core, full adds
the transformer layers' forward, not the LM head).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.specs import GpuProfile, ModelSpec

BACKWARD_FACTOR = 2.0  # backward / forward time of GEMMs (dgrad + wgrad) and element-wise work
# Flash attention's backward runs 5 matmuls (it recomputes QK^T, then dV, dP, dQ, dK) against 2
# in forward: 2.5x the forward time at equal efficiency (Dao 2023, FlashAttention-2, sec. 3.1.2).
ATTENTION_BACKWARD_FACTOR = 2.5
# FlashAttention in Triton (JobSpec.attention="triton": the FlashAttention-1-era Triton kernel,
# flash_attn_triton.py of Dao-AILab/flash-attention, which llm-foundry <= 0.6 ran as MPT's
# attn_impl: triton) against FlashAttention-2 at equal FLOP: "FlashAttention-2 is around 1.3-1.5x
# faster than FlashAttention in Triton in the forward pass and around 2x faster in the backward
# pass" (Dao 2023, FlashAttention-2, arXiv:2307.08691, sec. 4.1, A100): forward 1.4 (the middle),
# backward 2.0. Forward + backward (3.5 forward FLOP units): (1.4 + 2.5 x 2.0) / 3.5 = 1.83.
TRITON_FORWARD_SLOWDOWN = 1.4
TRITON_BACKWARD_SLOWDOWN = 2.0


def attention_backward_factor(attention_kind: str) -> float:
    """Backward / forward time of the attention core: fused (flash, cudnn) 2.5; triton 2.5 x
    2.0 / 1.4 (its backward lags FlashAttention-2 more than its forward); unfused 2 (its GEMMs'
    dgrad + wgrad, and the softmax backward reads two tensors and writes one)."""
    if attention_kind == "unfused":
        return BACKWARD_FACTOR
    if attention_kind == "triton":
        return ATTENTION_BACKWARD_FACTOR * TRITON_BACKWARD_SLOWDOWN / TRITON_FORWARD_SLOWDOWN
    return ATTENTION_BACKWARD_FACTOR


def backward_time(forward_s, attention_s, attention_kind: str, dropout_s=0.0):
    """Backward seconds of work whose forward takes forward_s, attention_s of it the attention
    core and dropout_s of that the score dropout: BACKWARD_FACTOR x the rest,
    attention_backward_factor x the core, DROPOUT_BACKWARD_FACTOR x the dropout."""
    return (BACKWARD_FACTOR * (forward_s - attention_s)
            + attention_backward_factor(attention_kind) * (attention_s - dropout_s)
            + DROPOUT_BACKWARD_FACTOR * dropout_s)

# Element-wise bytes per token per layer in forward, read + write at 2 bytes/element: each norm
# reads and writes h (2 x 2h x 2 B), each residual add reads 2h and writes h (2 x 3h x 2 B).
NORM_RESIDUAL_BYTES_PER_H = 2 * 2 * 2 + 2 * 3 * 2  # = 20 h bytes, divided by t with SP only
CE_BYTES_PER_LOGIT = 16.0  # softmax cross-entropy over fp32 logits: ~2 reads + 2 writes x 4 B


@dataclass(frozen=True)
class LayerTimes:
    """Forward seconds per micro-batch for one layer (or the head), per layout (arrays)."""

    gemm: np.ndarray  # projection GEMMs
    attention: np.ndarray  # attention core (flash, or unfused with its score dropout)
    elementwise: np.ndarray  # memory-bound work
    dropout: np.ndarray | float = 0.0  # the unfused score dropout, part of `attention`

    @property
    def total(self) -> np.ndarray:
        return self.gemm + self.attention + self.elementwise


def _gemm_time(flop, peak: float, curve, quant=1.0) -> np.ndarray:
    """Seconds of one GEMM of `flop` FLOP read off the square-GEMM efficiency curve, times the
    shape's quantization factor (quantization_factor)."""
    flop = np.asarray(flop, dtype=float)
    eff = np.maximum(curve.interp(np.maximum(flop, 1.0)), 1e-3)
    return np.where(flop > 0, flop / (peak * eff) * quant, 0.0)


# Output tile of cuBLAS's large tensor-core GEMM kernels, rows x columns: 256 x 128 (NVIDIA,
# "Matrix Multiplication Background User's Guide", DU-09799-001, 2023, sec. 2.3: the most
# efficient of the typical tiles).
GEMM_TILE_M, GEMM_TILE_N = 256.0, 128.0


def _tile_utilization(a, b, sms: int):
    """Useful fraction of the tile-waves an a x b output issues: partial edge tiles (tile
    quantization) and a partly filled last wave of tiles over the SMs (wave quantization),
    guide sec. 3.1-3.2. Outputs under one wave: 1 (cuBLAS splits them along K; the curve's own
    small-size fall-off covers them)."""
    tiles = np.ceil(a / GEMM_TILE_M) * np.ceil(b / GEMM_TILE_N)
    waves = np.ceil(tiles / sms)
    used = a * b / (GEMM_TILE_M * GEMM_TILE_N) / (waves * sms)
    return np.where(tiles >= sms, used, 1.0)


def quantization_factor(gpu: GpuProfile, curve, m, n, k):
    """Time factor of an (m x k) @ (k x n) GEMM, over its forward output (m x n) and its two
    backward outputs (dgrad m x k, wgrad k x n), against the square GEMMs `curve` was measured
    on (its points are N x N x N GEMMs at x = 2 N^3: their own quantization is in the curve, so
    the reference utilization is theirs, interpolated in log FLOP as the curve is).
    1 where the profile has no sm_count."""
    if gpu.sm_count is None:
        return 1.0
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    xs = np.array([x for x, _ in curve.points], dtype=float)
    sides = np.round(np.cbrt(xs / 2.0))
    ref_util = _tile_utilization(sides, sides, gpu.sm_count)
    ref = np.interp(np.log(np.maximum(2.0 * m * n * k, 1.0)), np.log(xs), ref_util)
    outputs = ((m, n), (m, k), (k, n))
    return sum(ref / _tile_utilization(a, b, gpu.sm_count) for a, b in outputs) / 3.0


def shaped_gemm_time(gpu: GpuProfile, peak: float, curve, m, n, k):
    """Seconds of an (m x k) @ (k x n) GEMM: its FLOP off the curve, times its quantization."""
    return _gemm_time(2 * m * n * k, peak, curve, quantization_factor(gpu, curve, m, n, k))


def matmul_peak_and_curve(gpu: GpuProfile, precision: str):
    """(peak FLOP/s, efficiency curve) for the matmul precision; fp8 as Transformer Engine runs
    it: fp8 peak with the fp8 curve when the profile has one, else the bf16 curve."""
    peak = gpu.peak_flops(precision)
    curve = (
        gpu.fp8_gemm_efficiency
        if precision == "fp8" and gpu.fp8_gemm_efficiency
        else gpu.gemm_efficiency
    )
    return peak, curve


def attention_peak(gpu: GpuProfile, precision: str) -> float:
    """Flash attention runs in 16-bit even in fp8 recipes (TE's fp8 attention is opt-in)."""
    return gpu.peak_flops("fp16" if precision == "fp16" else "bf16")


# Unfused attention (Megatron 2021-22, JobSpec.attention="unfused"): bytes moved per score
# element of the s x s tensors in forward, 16-bit: QK^T writes it (2 B) and AV reads it (2 B);
# the fused scale-mask-softmax kernel reads and writes it (2 + 2 B) (Korthikanti 2022 sec. 4.1:
# the score tensors are materialized; their element-wise work is memory-bound).
UNFUSED_BMM_BYTES_PER_SCORE = 4.0
UNFUSED_SOFTMAX_BYTES_PER_SCORE = 4.0
# Attention dropout on the unfused scores (dropout on, memory.uses_dropout: Megatron-LM 2021's
# --attention-dropout 0.1): torch.nn.Dropout over the [b, np, s, s] probabilities
# (NVIDIA/Megatron-LM @ 8aa4619 megatron/model/transformer.py ParallelSelfAttention.forward:
# `attention_probs = self.attention_dropout(attention_probs)`, between the fused softmax and the
# AV bmm), which PyTorch 1.x runs as _fused_dropout: read the 2-byte score, write the 2-byte
# output and a 1-byte mask (pytorch/pytorch aten/src/ATen/native/cuda/Dropout.cu
# fused_dropout_cuda: `mask = at::empty(self.sizes(), self.options().dtype(kByte))`); its
# backward, masked_scale_kernel, reads the 2-byte gradient and the mask and writes 2 B: the same
# 5 B, so DROPOUT_BACKWARD_FACTOR is 1. Full recompute runs the forward's again (the RNG state
# restored). Flash kernels apply dropout inside the kernel: no bytes of their own.
UNFUSED_DROPOUT_BYTES_PER_SCORE = 5.0
DROPOUT_BACKWARD_FACTOR = 1.0


def unfused_attention_time(
    model: ModelSpec, gpu: GpuProfile, precision: str, tokens, tp, seq_len: int
) -> np.ndarray:
    """Forward seconds of unfused attention for `tokens` local tokens: the QK^T and AV batched
    GEMMs over the full (non-causal) s x s square at the 16-bit GEMM curve (read at one batched
    call's FLOP), bounded below by their score-tensor traffic at HBM bandwidth, plus the
    memory-bound softmax."""
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    scores = tokens * seq_len * model.num_attention_heads / tp
    flop = model.attention_flops_per_token(seq_len, causal=False) / model.num_hidden_layers
    flop = flop * tokens / tp
    peak = attention_peak(gpu, precision)
    bmm = 2 * _gemm_time(flop / 2, peak, gpu.gemm_efficiency)
    bmm = np.maximum(bmm, UNFUSED_BMM_BYTES_PER_SCORE * scores / gpu.hbm_bytes_per_s)
    return bmm + UNFUSED_SOFTMAX_BYTES_PER_SCORE * scores / gpu.hbm_bytes_per_s


def unfused_dropout_time(model: ModelSpec, gpu: GpuProfile, tokens, tp, seq_len: int):
    """Forward seconds of the dropout over the unfused s x s probabilities of `tokens` local
    tokens: UNFUSED_DROPOUT_BYTES_PER_SCORE per score at the achieved HBM bandwidth."""
    tokens = np.asarray(tokens, dtype=float)
    scores = tokens * seq_len * model.num_attention_heads / np.asarray(tp, dtype=float)
    return UNFUSED_DROPOUT_BYTES_PER_SCORE * scores / gpu.hbm_bytes_per_s


def layer_forward_times(
    model: ModelSpec,
    gpu: GpuProfile,
    precision: str,
    moe: bool,
    tokens,
    tp,
    ep,
    sp,
    seq_len: int,
    attention_kind: str = "flash",
    etp=None,
    load=1.0,
    dropout: bool = False,
) -> LayerTimes:
    """Forward time of one transformer layer for `tokens` local tokens (mbs x s / cp) per rank;
    attention_kind is JobSpec.attention (flash, cudnn, triton or unfused). MoE: the experts split
    over etp ranks (None: tp), on the most loaded rank's `load` x the mean routed copies
    (planner.costmodel.moe). dropout (memory.uses_dropout): unfused attention adds its score
    dropout (unfused_dropout_time) to the attention core."""
    peak, curve = matmul_peak_and_curve(gpu, precision)
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    h, a = model.hidden_size, model.num_attention_heads
    v_dim = (model.v_head_dim or model.head_size) if model.is_mla else model.head_size
    out_w = a * v_dim * h
    qkv_w = model.attention_params - out_w
    mats = 3 if model.activation == "swiglu" else 2

    def proj(m, n_out, k_in):
        """One projection GEMM: m tokens, k_in -> n_out features (local after the TP split)."""
        return shaped_gemm_time(gpu, peak, curve, m, n_out, k_in)

    gemm = proj(tokens, qkv_w / h / tp, h) + proj(tokens, h, a * v_dim / tp)
    if moe:
        e, k = model.num_experts, model.num_experts_per_tok
        effn = model.expert_ffn
        etp = tp if etp is None else np.asarray(etp, dtype=float)
        # ep ranks x T k / tp copies over E/ep experts per rank, gathered over etp (moe.py)
        tok_per_expert = tokens * k * np.asarray(ep, dtype=float) * etp / tp / e * load
        local_experts = e / np.asarray(ep, dtype=float)
        gemm = gemm + local_experts * (
            proj(tok_per_expert, (mats - 1) * effn / etp, h) + proj(tok_per_expert, h, effn / etp)
        )
        if model.num_shared_experts:
            sh = model.num_shared_experts * effn
            gemm = gemm + proj(tokens, (mats - 1) * sh / tp, h) + proj(tokens, h, sh / tp)
        gemm = gemm + proj(tokens, e, h)  # router, not TP-split
        ffn_local = (k + model.num_shared_experts) * effn
        permute = 2 * 2 * 2 * tokens * k * h * load  # dispatch + combine, read + write, 2 B
    else:
        ffn = model.intermediate_size
        gemm = gemm + proj(tokens, (mats - 1) * ffn / tp, h) + proj(tokens, h, ffn / tp)
        ffn_local = ffn
        permute = 0.0
    drop = np.zeros_like(tokens * tp)
    if attention_kind == "unfused":
        attention = unfused_attention_time(model, gpu, precision, tokens, tp, seq_len)
        if dropout:
            drop = drop + unfused_dropout_time(model, gpu, tokens, tp, seq_len)
            attention = attention + drop
    else:
        attn_flop = model.attention_flops_per_token(seq_len, causal=True) / model.num_hidden_layers
        eff = gpu.attention_efficiency
        if attention_kind == "cudnn" and gpu.fused_attention_efficiency is not None:
            eff = gpu.fused_attention_efficiency
        elif attention_kind == "triton":
            eff = eff / TRITON_FORWARD_SLOWDOWN
        attention = attn_flop * tokens / tp / (attention_peak(gpu, precision) * eff)
    # element-wise: norms + residuals (replicated across TP unless SP), rotary on q and k,
    # the activation function (reads its inputs, writes ffn), all at 2 bytes/element
    rep_div = np.where(sp, tp, 1.0)
    kv = model.kv_heads
    rope = 2 * 2 * (a + kv) * model.head_size if model.position_embedding == "rope" else 0
    act_bytes = (mats * ffn_local) * 2
    per_token = NORM_RESIDUAL_BYTES_PER_H * h / rep_div + (rope + act_bytes) / tp
    elementwise = (per_token * tokens + permute / tp) / gpu.hbm_bytes_per_s
    return LayerTimes(
        gemm=gemm,
        attention=np.broadcast_to(attention, gemm.shape).astype(float),
        elementwise=np.asarray(elementwise, dtype=float),
        dropout=np.broadcast_to(drop, gemm.shape).astype(float),
    )


# ---- FP8 quantization (Transformer Engine) ---------------------------------------------------
# An FP8 GEMM's operands are FP8 copies that Transformer Engine writes before the GEMM: a
# memory-bound pass per tensor whose bytes do not shrink the way the GEMM's FLOP time does.
# Rules read in NVIDIA/TransformerEngine @d0067d0 (transformer_engine/pytorch/module/linear.py,
# layernorm_linear.py, base.py grad_output_preprocess, distributed.py _all_gather_fp8,
# csrc/extensions/normalization.cpp, common/normalization/layernorm/ln_api.cpp), per-tensor
# scaling (Megatron's default --fp8-recipe delayed) as Megatron-Core's TE layer spec runs it
# (NVIDIA/Megatron-LM @d98e8a6 megatron/core/models/gpt/gpt_layer_specs.py
# get_mlp_module_spec_for_backend: fc1 a TELayerNormColumnParallelLinear, Megatron's own
# activation, fc2 a TERowParallelLinear; qkv TELayerNormColumnParallelLinear, proj
# TERowParallelLinear):
# - a GEMM input X is quantized row-wise (forward GEMM) and column-wise (the transposed copy
#   the wgrad GEMM reads): linear.py input_quantizer.set_usage(rowwise=True,
#   columnwise=backward_needs_input), one cast-transpose kernel: read 2 B, write 1 + 1 B;
# - every GEMM's output gradient dY likewise (linear.py grad_output_quantizer.set_usage(
#   rowwise=True, columnwise=True): dgrad reads the row-wise copy, wgrad the column-wise one);
# - with sequence parallelism a tensor TE all-gathers is quantized row-wise only before the
#   gather (FP8 column-wise data cannot be gathered: distributed.py _all_gather_fp8) and
#   transposed after it (read 1 B, write 1 B on the gathered tensor; the wgrad input is
#   re-gathered in backward, linear.py backward_input_needs_gather);
# - the qkv and fc1 inputs are the norm's output: the norm kernel writes FP8 itself
#   (normalization.cpp FULLY_FUSED for Float8Quantizer) and then transposes it (ln_api.cpp
#   "Compute FP8 transpose if required"): its write shrinks from 2 B to 1 B, the transpose adds
#   1 + 1 B on the gathered tensor;
# - weights are quantized (2 B read, 1 + 1 B written) once per optimizer step: Megatron-Core
#   passes is_first_microbatch (megatron/core/extensions/transformer_engine.py forward;
#   pipeline_parallel/schedules.py set_is_first_microbatch) and TE keeps the FP8 workspace
#   for the step's other micro-batches (linear.py quantize_weight(update_workspace=...)).
# Not counted: the amax reductions (one small all-reduce per tensor: latency), current
# scaling's extra amax read (+2 B per standalone cast) and MXFP8's unfused norm (+3 B on the
# qkv and fc1 inputs): JobSpec does not name the recipe, and per-tensor delayed scaling is
# the default of the runs here (Megatron-LM --fp8-recipe delayed; NeMo 2.3's performance
# scripts --fp8_recipe default "ds", NVIDIA/NeMo v2.3.0 scripts/performance/
# argument_parser.py, which dgxc-benchmarking v25.05 runs with --compute_dtype fp8 only, H100
# and GB200 alike). TE >= 2.4 (c770230) skips the transposes on Blackwell (non-TN FP8 GEMMs,
# nvte_is_non_tn_fp8_gemm_supported); MXFP8 writes both copies there: the Hopper rule is
# kept for every GPU.
FP8_CAST_TRANSPOSE_BYTES = 4.0  # bytes per element: read 2 (bf16), write 1 row-wise + 1 column
FP8_GATHERED_CAST_BYTES = 3.0  # per local element before an FP8 all-gather: read 2, write 1
FP8_TRANSPOSE_BYTES = 2.0  # per gathered element: nvte_transpose reads 1 B and writes 1 B
FP8_NORM_WRITE_SAVED = 1.0  # per norm-output element: the norm writes 1 B of FP8, not 2 B


@dataclass(frozen=True)
class CastBytes:
    """Bytes one layer's FP8 quantization moves on one GPU (arrays over layouts): per
    micro-batch in forward (GEMM inputs) and backward (output gradients, and the column-wise
    copies of inputs gathered under sequence parallelism); per optimizer step its weights'."""

    forward: np.ndarray
    backward: np.ndarray
    weights: np.ndarray


def fp8_cast_bytes(model: ModelSpec, moe: bool, tokens, tp, sp, ep=1.0, etp=None,
                   load=1.0) -> CastBytes:
    """Bytes of the FP8 casts of one transformer layer (rules above) for `tokens` local
    tokens (mbs x s / cp) per rank. MoE layers: the experts' inputs and gradients on the most
    loaded rank (load x the mean routed copies, as layer_forward_times), standalone casts."""
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    sp = np.asarray(sp, dtype=bool)
    h, a = model.hidden_size, model.num_attention_heads
    v_dim = (model.v_head_dim or model.head_size) if model.is_mla else model.head_size
    out_w = a * v_dim * h
    qkv_out = (model.attention_matmul_params - out_w) / h  # qkv output features (all ranks)
    mats = 3 if model.activation == "swiglu" else 2
    cast, gathered = FP8_CAST_TRANSPOSE_BYTES, FP8_GATHERED_CAST_BYTES
    # a column-parallel input gathered under SP (the norm's output): the norm writes 1 B less
    # per local element; the column-wise copy is a transpose of the gathered tensor
    norm_in = FP8_TRANSPOSE_BYTES * h - FP8_NORM_WRITE_SAVED * h / np.where(sp, tp, 1.0)
    # a row-parallel output's gradient (h wide): gathered under SP, else one cast-transpose
    row_grad = np.where(sp, gathered / tp + FP8_TRANSPOSE_BYTES, cast) * h
    fwd = norm_in + cast * a * v_dim / tp  # qkv input (norm), proj input
    bwd = row_grad + cast * qkv_out / tp  # proj dY, qkv dY
    weights = model.attention_matmul_params  # the attention projections (all ranks)
    if moe:
        e, k, effn = model.num_experts, model.num_experts_per_tok, model.expert_ffn
        etp = tp if etp is None else np.asarray(etp, dtype=float)
        copies = k * etp / tp * load  # routed copies per local token on the loaded rank
        fwd = fwd + cast * copies * (h + effn / etp)  # expert fc1 and fc2 inputs
        bwd = bwd + cast * copies * (h + (mats - 1) * effn / etp)  # expert fc2 and fc1 dY
        local_w = e / np.asarray(ep, dtype=float) * mats * h * effn / etp
        if model.num_shared_experts:
            sh = model.num_shared_experts * effn
            fwd = fwd + cast * (h + sh / tp)
            bwd = bwd + cast * (h + (mats - 1) * sh / tp)
            local_w = local_w + mats * h * sh / tp
        weights_local = weights / tp + local_w
    else:
        ffn = model.intermediate_size
        fwd = fwd + norm_in + cast * ffn / tp  # fc1 input (norm), fc2 input (activation)
        bwd = bwd + row_grad + cast * (mats - 1) * ffn / tp  # fc2 dY, fc1 dY
        weights_local = (weights + mats * h * ffn) / tp
    shape = np.ones_like(fwd * tokens)
    return CastBytes(forward=fwd * tokens * shape, backward=bwd * tokens * shape,
                     weights=cast * weights_local * shape)


def fp8_cast_times(model: ModelSpec, gpu: GpuProfile, precision: str, moe: bool, tokens, tp,
                   sp, ep=1.0, etp=None, load=1.0):
    """(forward, backward) seconds per micro-batch and (weights) seconds per optimizer step
    of one layer's FP8 casts (fp8_cast_bytes) at the profile's achieved HBM bandwidth
    (hbm_tb_per_s x hbm_efficiency, the STREAM-like fraction the other memory-bound terms
    use); zeros unless precision is fp8."""
    zero = np.zeros(np.broadcast(np.asarray(tokens), np.asarray(tp)).shape)
    if precision != "fp8":
        return zero, zero, zero
    b = fp8_cast_bytes(model, moe, tokens, tp, sp, ep, etp, load)
    bw = gpu.hbm_bytes_per_s
    return zero + b.forward / bw, zero + b.backward / bw, zero + b.weights / bw


def head_forward_time(model: ModelSpec, gpu: GpuProfile, precision: str, tokens, tp):
    """Forward time of the LM head GEMM + cross-entropy on the last stage, per micro-batch.
    The head stays 16-bit in fp8 recipes: Megatron-Core's output_layer is a plain
    tensor_parallel.ColumnParallelLinear, not a Transformer Engine fp8 module."""
    peak, curve = matmul_peak_and_curve(gpu, "bf16" if precision == "fp8" else precision)
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    v, h = model.vocab_size, model.hidden_size
    gemm = shaped_gemm_time(gpu, peak, curve, tokens, v / tp, h)
    ce = CE_BYTES_PER_LOGIT * tokens * v / tp / gpu.hbm_bytes_per_s
    return gemm + ce


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int) -> float:
    """Model FLOP per optimizer step, no recompute, non-causal attention (Megatron paper)."""
    return model.train_flops_per_token(seq_len, causal=False) * seq_len * global_batch


def recompute_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int, recompute):
    """Extra (hardware) FLOP per step from recomputation: 0 none, 1 selective (attention core
    forward again), 2 full (the transformer layers' forward again, not the LM head)."""
    tokens = seq_len * global_batch
    attn = model.attention_flops_per_token(seq_len, causal=False) * tokens
    head = 2.0 * model.vocab_size * model.hidden_size * tokens
    full = model.forward_flops_per_token(seq_len, causal=False) * tokens - head
    recompute = np.asarray(recompute)
    return np.select([recompute == 1, recompute == 2], [attn, full], default=0.0)


# ---- per-stage terms (arrays of shape (layouts, candidate stages); see batch.py) -------------
ADAM_BYTES_PER_PARAM = (
    30.0  # read fp32 master, m, v, grad (16 B); write master, m, v (12) + bf16 param (2)
)
_COL = (slice(None), None)  # broadcast a per-layout (N,) array against (N, C) stage arrays


def embedding_forward_time(model: ModelSpec, gpu: GpuProfile, tokens):
    """Forward seconds of the embedding lookup per micro-batch: read + write 2-byte rows."""
    return tokens * model.hidden_size * 2 * 2 / gpu.hbm_bytes_per_s


@dataclass(frozen=True)
class StageCompute:
    """Per-micro-batch compute seconds of each candidate stage, (layouts, stages) arrays."""

    forward: np.ndarray  # its layers, embedding and LM head, forward
    backward: np.ndarray
    recompute: np.ndarray  # forward work re-run in backward (selective: attention; full: layers)
    attention: np.ndarray  # attention core forward of its layers
    total: np.ndarray  # forward + backward + recompute + launch overhead + exposed offload
    cast: np.ndarray  # FP8 casts (fp8_cast_times), inside forward, backward and recompute
    weight_cast: np.ndarray  # FP8 cast of its layers' weights, seconds per optimizer step


def offload_exposed_time(gpu: GpuProfile, t: LayerTimes, copy_bytes, attention_kind: str):
    """Seconds per layer and micro-batch that activation offload adds: the layer's activations
    go to host memory in forward and come back in backward over the host link, behind that
    layer's compute where they are shorter."""
    copy = copy_bytes / (gpu.host_link_gb_per_s * 1e9)
    layer_bwd = backward_time(t.total, t.attention, attention_kind, t.dropout)
    return np.maximum(copy - t.total, 0.0) + np.maximum(copy - layer_bwd, 0.0)


def stage_compute_time(
    gpu: GpuProfile,
    stages,
    dense: LayerTimes,
    moe: LayerTimes,
    head_s,
    emb_s,
    recompute,
    attention_kind: str,
    offload_bytes=None,
    casts=None,
) -> StageCompute:
    """Compute seconds per micro-batch of each stage from its layer counts: forward, backward
    (backward_time), recomputation and the per-layer host launch time (profile.
    layer_overhead_us, fitted by calibrate; 0 in the stock profiles: forward 1 pass, backward 2,
    full recompute 1 more); with offload (recompute code 3) the copies the layers cannot hide.
    casts: fp8_cast_times of a dense and of an MoE layer, (N,) arrays: the per-micro-batch
    casts are added to the forward and backward, the forward's again with full recompute; the
    weights' (per step) are kept apart in weight_cast (the assembly adds them once a step)."""
    col, st, rc = _COL, stages, recompute
    fwd = (
        st["n_dense"] * dense.total[col]
        + st["n_moe"] * moe.total[col]
        + (st["head"] + st["mtp"]) * head_s[col]  # an MTP module: one more head pass
        + st["emb"] * emb_s[col]
    )
    layers = st["n_dense"] + st["n_moe"]
    attn_core = st["n_dense"] * dense.attention[col] + st["n_moe"] * moe.attention[col]
    drop_core = (st["n_dense"] * np.broadcast_to(dense.dropout, dense.gemm.shape)[col]
                 + st["n_moe"] * np.broadcast_to(moe.dropout, moe.gemm.shape)[col])
    layer_fwd = st["n_dense"] * dense.total[col] + st["n_moe"] * moe.total[col]
    recomp = np.where((rc == 1)[col], attn_core, 0.0) + np.where((rc == 2)[col], layer_fwd, 0.0)
    bwd = backward_time(fwd, attn_core, attention_kind, drop_core)
    cast = weight_cast = np.zeros_like(fwd)
    if casts is not None:
        (d_f, d_b, d_w), (m_f, m_b, m_w) = casts
        cast_f = st["n_dense"] * d_f[col] + st["n_moe"] * m_f[col]
        cast_b = st["n_dense"] * d_b[col] + st["n_moe"] * m_b[col]
        cast_r = np.where((rc == 2)[col], cast_f, 0.0)
        fwd, bwd, recomp = fwd + cast_f, bwd + cast_b, recomp + cast_r
        cast = cast_f + cast_b + cast_r
        weight_cast = st["n_dense"] * d_w[col] + st["n_moe"] * m_w[col]
    passes = 3.0 + (rc == 2)
    total = fwd + bwd + recomp + layers * (gpu.layer_overhead_us * 1e-6 * passes)[col]
    if offload_bytes is not None and gpu.host_link_gb_per_s is not None and (rc == 3).any():
        off = (st["n_dense"] * offload_exposed_time(gpu, dense, offload_bytes[0],
                                                    attention_kind)[col]
               + st["n_moe"] * offload_exposed_time(gpu, moe, offload_bytes[1],
                                                    attention_kind)[col])
        total = total + np.where((rc == 3)[col], off, 0.0)
    return StageCompute(forward=fwd, backward=bwd, recompute=recomp, attention=attn_core,
                        total=total, cast=cast, weight_cast=weight_cast)


# Megatron-LM 2021's fp16 step (JobSpec.software "megatron-2021"), bytes per local parameter,
# as NVIDIA/Megatron-LM @ 8aa4619 runs it after every backward:
# - local DDP allreduce_params (megatron/model/distributed.py; training.py train_step calls it
#   with reduce_after=False on a DP group of one as well): flatten the 16-bit .grad (read 2,
#   write 2), `coalesced /= world_size` (read 2, write 2), copy back (read 2, write 2): 12;
# - FP16OptimizerWithFP16Params.step (megatron/optimizer/optimizer.py):
#   _copy_model_grads_to_main_grads, 16-bit .grad to fp32 main grad (read 2, write 4): 6;
#   _unscale_main_grads_and_check_for_nan, torch._amp_foreach_non_finite_check_and_unscale_
#   (read 4, write 4): 8; clip_grad_norm_fp32's amp_C.multi_tensor_l2norm (read 4): 4 (its
#   multi_tensor_scale runs only when the norm exceeds --clip-grad: not counted); apex FusedAdam
#   (megatron/optimizer/__init__.py; read param, grad, m, v, write param, m, v): 28;
#   _copy_main_params_to_model_params (read 4, write 2): 6.
MEGATRON_2021_STEP_BYTES_PER_PARAM = 12.0 + 6.0 + 8.0 + 4.0 + 28.0 + 6.0  # = 64


def step_bytes_per_param(software: str = "current") -> float:
    """Bytes the optimizer step moves per local parameter (JobSpec.software): the fused Adam
    pass, ADAM_BYTES_PER_PARAM, or Megatron-LM 2021's passes, MEGATRON_2021_STEP_BYTES_PER_PARAM."""
    return MEGATRON_2021_STEP_BYTES_PER_PARAM if software == "megatron-2021" \
        else ADAM_BYTES_PER_PARAM


def optimizer_time(gpu: GpuProfile, local_params, software: str = "current"):
    """Seconds of the optimizer step over `local_params` parameters at HBM bandwidth
    (step_bytes_per_param of the software), plus the profile's per-step overhead (folded here
    so the time_* columns add up to the step)."""
    return (local_params * step_bytes_per_param(software) / gpu.hbm_bytes_per_s
            + gpu.step_overhead_s)

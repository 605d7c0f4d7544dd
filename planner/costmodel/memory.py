"""Memory of one GPU: weights, gradients and optimizer state per precision recipe and ZeRO
stage, activations per layer derived from the architecture, and temporary buffers.

Sources:
- [S13] Megatron-LM `theoretical_memory_usage.py` and the distributed-optimizer doc table:
  18 bytes/param (bf16 params, fp32 grads, fp32 master + Adam m, v), 6 + 12/d with the
  distributed optimizer; stage 0 holds the embedding.
- [S16] ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054) section 5: (2 + 2 + K) Psi with
  K = 12; ZeRO-1 4 Psi + K Psi/Nd, ZeRO-2 2 Psi + (2 + K) Psi/Nd, ZeRO-3 (2 + 2 + K) Psi/Nd.
- [S14] Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1 / Table 2: per-layer activation
  tensors, sbh(34 + 5as/h) for GPT with dropout, and their TP / SP / recompute divisions.
All byte counts are bytes; activations are 16-bit except dropout masks (1 byte) and the fp32
softmax statistics / logits named below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.specs import ModelSpec

# Bytes per parameter of each recipe, by ZeRO stage: (weights, grads, optimizer) and which of
# them are sharded over the data-parallel group.
#  0: Megatron DDP: bf16 weights, fp32 main-grad buffer (bf16 runs accumulate and all-reduce
#     gradients in fp32, Megatron arguments.py), fp32 master + m + v = 2 + 4 + 12 = 18 [S13].
#  1: Megatron distributed optimizer: 2 + 4 + 12/d = 6 + 12/d [S13].
#  2: ZeRO-2 (DeepSpeed / FSDP SHARD_GRAD_OP, bf16 gradients): 2 + (2 + 12)/d [S16].
#  3: ZeRO-3 / FSDP FULL_SHARD mixed precision: (2 + 2 + 12)/d [S16].
WEIGHT_BYTES = 2.0  # bf16/fp16 working copy; fp8 (Transformer Engine) keeps it (casts per GEMM)
OPTIMIZER_BYTES = 12.0  # fp32 master weight + Adam m + v, K = 12 [S16]
GRAD_BYTES_BY_ZERO = np.array([4.0, 4.0, 2.0, 2.0])
GRADS_SHARDED_BY_ZERO = np.array([False, False, True, True])
WEIGHTS_SHARDED_BY_ZERO = np.array([False, False, False, True])
OPT_SHARDED_BY_ZERO = np.array([False, True, True, True])
CHECKPOINT_BYTES_PER_PARAM = 14.0  # bf16 weights 2 + fp32 master 4 + m 4 + v 4 (seed 001 ch. 7)
ZERO3_LIVE_UNITS = 3  # FSDP: the gathered unit in use, the prefetched next one, its full grads
INPUT_ID_BYTES = 8  # int64 token ids kept per micro-batch on stage 0 (Megatron "8sbp" [S13])
# Per logit on the last stage: the fp32 logits the loss keeps for its backward (Korthikanti's
# output-layer term 4sbh(1 + V/h) counts 4 bytes per logit; Megatron's vocab-parallel cross
# entropy upcasts the bf16 logits and saves exp(logits) in fp32). Fused losses keep less.
LOGIT_BYTES = 4.0
# Dropout masks (1 byte per element) are not stored by default: current pretraining recipes
# run without dropout (Llama 2/3, Mistral, MPT resid/attn/emb_pdrop 0, BLOOM 0, NeMo Llama
# configs hidden_dropout 0). layer_activation(dropout=True) gives Korthikanti's GPT counts.
DROPOUT = False
# 1-sigma relative error of the predicted peak memory: the robust spread (1.4826 x median
# absolute deviation of log(predicted peak + reserve) / measured) over the 91 published runs
# with a measured peak on their stated layout (BLOOM 77: 0.054, DLPerf 14: 0.153; nvidia-smi
# readings, docs/accuracy.md "Memory band"). A peak within this band of the usable capacity
# "may not fit" rather than being refused (planner.costmodel.memory_status).
MEM_REL_ERROR = 0.069


def near_capacity(peak_gib, capacity_gib):
    """True where the peak is within the memory band of the usable capacity or above it
    (peak + MEM_REL_ERROR x peak > capacity): such a plan "may not fit" (or does not), and it
    ranks after the plans with headroom within a tie (planner.search.ties)."""
    peak = np.asarray(peak_gib, dtype=float)
    return peak * (1 + MEM_REL_ERROR) > np.asarray(capacity_gib, dtype=float)


# Bytes per element of a GEMM input Transformer Engine saves for the backward under FP8 (the
# quantized copy, column-wise data only: TE module/linear.py; see layer_activation).
FP8_SAVED_INPUT_BYTES = 1


def param_state_bytes(
    zero: int, d: float, grad_bytes: float | None = None
) -> tuple[float, float, float]:
    """(weight, grad, optimizer) bytes per parameter at ZeRO stage `zero` on a DP group of d.
    grad_bytes overrides the recipe's gradient width (2 gives the ZeRO paper's table)."""
    g = GRAD_BYTES_BY_ZERO[zero] if grad_bytes is None else grad_bytes
    w = WEIGHT_BYTES / d if WEIGHTS_SHARDED_BY_ZERO[zero] else WEIGHT_BYTES
    g = g / d if GRADS_SHARDED_BY_ZERO[zero] else g
    o = OPTIMIZER_BYTES / d if OPT_SHARDED_BY_ZERO[zero] else OPTIMIZER_BYTES
    return float(w), float(g), float(o)


# Gradient recipes (JobSpec.grad_dtype): (bytes of the gradient that ZeRO shards by stage, bytes
# of an unsharded fp32 accumulator, fp32 bytes sharded over d that exist at the step only).
#  "half": DeepSpeed fp16/bf16 ZeRO-1/2 keeps 16-bit gradients (ZeRO paper [S16]: ZeRO-1 =
#    2 + 2 + K/Nd), and at the step casts its partition to an fp32 gradient for the fp32 master
#    (DeepSpeed stage_1_and_2.py: single_partition_of_fp32_groups[i].grad): + 4/d. Megatron-Core
#    with grad_reduce_in_fp32 off keeps a bf16 grad buffer and casts its shard the same way at
#    the step (distrib_optimizer.py _copy_model_grads_to_main_grads: shard_model_grad.float()).
#    The step runs after the backward has freed the activations (step_grad_bytes).
#  "half+fp32": DeepSpeed BF16_Optimizer accumulates gradients in fp32, "extra 4 B/param
#    unsharded" (BLOOM chronicles, published_runs rows 200-215); the partition is a view of it.
GRAD_RECIPES: dict[str, tuple[float | None, float, float]] = {
    "auto": (None, 0.0, 0.0),
    "half": (2.0, 0.0, 4.0),
    "fp32": (4.0, 0.0, 0.0),
    "half+fp32": (2.0, 4.0, 0.0),
}


# Bytes per element of the DP gradient reduction when JobSpec.grad_reduce_dtype names it (auto:
# the gradient recipe's reduced buffer, grad_reduce_bytes). Megatron-LM @ 8aa4619 (Mar 2021)
# megatron/model/distributed.py allreduce_params flattens each param dtype's .grad and casts
# to fp32 only `if fp32_allreduce`, which megatron/arguments.py leaves off (--fp32-allreduce,
# store_true): the fp16 model's gradients go as 2 B, while the fp32 main grads of
# FP16OptimizerWithFP16Params (the memory's 4 B) are filled after the reduction.
GRAD_REDUCE_WIDTH = {"half": 2.0, "fp32": 4.0}


def grad_reduce_bytes(zero, grad_dtype: str = "auto", reduce_dtype: str = "auto"):
    """Bytes per gradient element the DP reduction sends: `reduce_dtype`'s width
    (JobSpec.grad_reduce_dtype), or for "auto" the recipe's reduced buffer (fp32 when an fp32
    buffer exists, GRAD_RECIPES)."""
    if reduce_dtype != "auto":
        return np.full(np.shape(zero), GRAD_REDUCE_WIDTH[reduce_dtype])
    width, extra, _ = GRAD_RECIPES[grad_dtype]
    if extra:
        return np.full(np.shape(zero), extra)
    return GRAD_BYTES_BY_ZERO[np.asarray(zero, dtype=int)] if width is None else np.full(
        np.shape(zero), width
    )


def param_state_arrays(zero, d, grad_dtype: str = "auto"):
    """Vectorized param_state_bytes; grad_dtype a JobSpec recipe (GRAD_RECIPES)."""
    zero = np.asarray(zero, dtype=int)
    d = np.asarray(d, dtype=float)
    width, extra, _ = GRAD_RECIPES[grad_dtype]
    gb = GRAD_BYTES_BY_ZERO[zero] if width is None else np.full(zero.shape, width)
    w = np.where(WEIGHTS_SHARDED_BY_ZERO[zero], WEIGHT_BYTES / d, WEIGHT_BYTES)
    g = np.where(GRADS_SHARDED_BY_ZERO[zero], gb / d, gb) + extra
    o = np.where(OPT_SHARDED_BY_ZERO[zero], OPTIMIZER_BYTES / d, OPTIMIZER_BYTES)
    return w, g, o


def step_grad_bytes(d, grad_dtype: str = "auto", zero=1):
    """Bytes per parameter of the fp32 gradient shard a recipe creates at the optimizer step
    (after the backward, beside the persistent gradients; see GRAD_RECIPES). Sharded over d
    where the optimizer state is (ZeRO >= 1); at ZeRO 0 the optimizer steps every parameter and
    casts every gradient (Megatron-Core Float16OptimizerWithFloat16Params
    _copy_model_grads_to_main_grads: `main_param.grad = model_param.main_grad.float()`)."""
    d = np.where(OPT_SHARDED_BY_ZERO[np.asarray(zero, dtype=int)], np.asarray(d, dtype=float),
                 1.0)
    return GRAD_RECIPES[grad_dtype][2] / d


def checkpoint_bytes(model: ModelSpec) -> float:
    """Full training checkpoint (weights + fp32 master + Adam m, v), bytes."""
    return CHECKPOINT_BYTES_PER_PARAM * model.num_params


def uses_dropout(model: ModelSpec, software: str = "current") -> bool:
    """Whether the model's activations include dropout masks (see DROPOUT): the recipe-wide
    choice, or the software's defaults (MEGATRON_2021_DROPOUT for "megatron-2021")."""
    del model  # the spec has no dropout field: one recipe-wide choice
    return DROPOUT or (software == "megatron-2021" and MEGATRON_2021_DROPOUT)


@dataclass(frozen=True)
class LayerActivation:
    """Stored activation bytes per token of one transformer layer, split by how TP divides them.

    replicated: kept whole on every TP rank without SP, divided by t with SP (norm inputs, the
      norm outputs feeding QKV and MLP, dropout masks on the residual).
    sharded: divided by t (Q, attention context, MLP hidden tensors).
    kv_sharded: K and V, divided by min(t, kv_heads) (GQA heads are replicated once t > kv).
    score_per_key: bytes per token per attended key of the s x s score tensors (softmax output,
      and with attention dropout its mask and output: 5 a bytes per key, Korthikanti's 5as/h),
      stored only without flash attention and without recompute; divided by t.
    softmax_stats: flash attention's fp32 log-sum-exp per head (4 a bytes), divided by t;
      kept only without recompute (selective recompute re-runs the core attention).
    layer_input: the layer's input kept under full recompute (2h bytes), / t with SP.
    """

    replicated: float
    sharded: float
    kv_sharded: float
    kv_heads: int
    score_per_key: float
    softmax_stats: float
    layer_input: float


def layer_activation(
    model: ModelSpec, moe: bool, dropout: bool | None = None, precision: str = "bf16",
    software: str = "current",
) -> LayerActivation:
    """Activation bytes per token of one layer, derived from the spec (Korthikanti 2022 sec. 4.1
    generalized: GQA shrinks K and V to kv_heads, SwiGLU stores gate and up outputs (2 x ffn)
    plus their product, MoE stores each routed copy of the token and its expert hidden tensors).

    precision "fp8" (Transformer Engine): the Linear / LayerNormLinear / LayerNormMLP layers
    save their quantized 1-byte input for the weight-gradient GEMM instead of the 16-bit one
    (TE module/linear.py, layernorm_linear.py, layernorm_mlp.py: `saved_inputmat = inputmat`
    after `inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)`): the QKV and FC1
    inputs (the norm outputs), the FC2 input (activation output) and each routed copy entering
    the experts. The norm inputs, the FC1 output (for the activation's backward) and flash
    attention's Q, K, V, O stay 16-bit; the out-projection quantizes O into its own 1-byte copy,
    kept beside flash's 16-bit O (one tensor under bf16, where both hold the same O)."""
    drop = uses_dropout(model, software) if dropout is None else dropout
    lin = FP8_SAVED_INPUT_BYTES if precision == "fp8" else 2  # bytes of a saved GEMM input
    proj_copy = FP8_SAVED_INPUT_BYTES if precision == "fp8" else 0
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        qk = (model.qk_nope_head_dim or 0) + (model.qk_rope_head_dim or 0)
        v = model.v_head_dim or model.head_size
        # q, k (full heads after up-projection), v, context, plus the low-rank latents
        attn = 2 * (a * qk + a * qk + a * v + a * v) + proj_copy * a * v
        attn += lin * ((model.kv_lora_rank or 0) + (model.q_lora_rank or 0))
        kv_part = 0
    else:
        d, kv = model.head_size, model.kv_heads
        attn = 2 * (a * d + a * d) + proj_copy * a * d  # Q, context (out-proj input)
        kv_part = 2 * 2 * kv * d  # K and V

    def mlp_hidden(ffn: int) -> int:
        # gelu / squared relu: fc1 output (2 bytes) + activation output (the FC2 input)
        # (Korthikanti: 16sbh at ffn = 4h); swiglu: gate and up outputs + their product
        return (4 if model.activation == "swiglu" else 2) * ffn + lin * ffn

    if moe:
        k = model.num_experts_per_tok
        mlp = k * (mlp_hidden(model.expert_ffn) + lin * h)  # each routed copy: input + hidden
        mlp += model.num_shared_experts * mlp_hidden(model.expert_ffn)
        mlp += 4 * model.num_experts  # fp32 router logits/probabilities
    else:
        mlp = mlp_hidden(model.intermediate_size)
    replicated = (
        2 * 2 * h + lin * h + lin * h + (2 * h if drop else 0)
    )  # norm ins, QKV in, MLP in, masks
    return LayerActivation(
        replicated=float(replicated),
        sharded=float(attn + mlp),
        kv_sharded=float(kv_part),
        kv_heads=model.kv_heads,
        score_per_key=float((5 if drop else 2) * a),
        softmax_stats=float(4 * a),
        layer_input=float(2 * h),
    )


def activation_per_token(act: LayerActivation, tp, sp, recompute, keys, flash: bool = True):
    """Stored bytes per local token of one layer (vectorized over layouts).

    tp: TP degree; sp: bool array; recompute: 0 none, 1 selective, 2 full, 3 offload (nothing
    stays); keys: attended keys per
    query in the stored score tile (s / cp). Korthikanti Table 2 falls out: no flash, no
    recompute, t = 1 -> 34 + 5as/h (times h); SP + selective -> 34/t."""
    tp = np.asarray(tp, dtype=float)
    rep_div = np.where(sp, tp, 1.0)
    base = (
        act.replicated / rep_div + act.sharded / tp + act.kv_sharded / np.minimum(tp, act.kv_heads)
    )
    core = act.softmax_stats / tp if flash else act.score_per_key * np.asarray(keys) / tp
    full = act.layer_input / rep_div
    # 3 = offload: every layer's activations leave for host memory (the working set is counted
    # by the caller); 2 = full recompute: only the layer input stays
    return np.select([recompute == 0, recompute == 1, recompute == 3],
                     [base + core, base, np.zeros_like(base)], default=full)


def full_layer_activation_per_token(act: LayerActivation, tp, sp, keys, flash: bool = True):
    """One layer's activations without recompute: the working set full recompute rebuilds."""
    return activation_per_token(act, tp, sp, np.zeros_like(np.asarray(tp)), keys, flash)


# ---- JobSpec.software "deepspeed-2022": transient buffers and runtime memory -------------------
# DeepSpeed 0.5-0.6 as Megatron-DeepSpeed ran it (BLOOM, Feb-Mar 2022), by gradient recipe:
# "half" is the fp16/bf16 ZeRO-1 optimizer (zero/stage2.py), "half+fp32" the BF16_Optimizer.
# fp32 copy of one gradient tensor (bytes per element). fp16 ZeRO-1: the step's overflow check
# runs _has_inf_or_nan(p.grad) on every 16-bit gradient, `float(x.float().sum())`, a full fp32
# copy of the tensor (DeepSpeed 0.5-0.6 zero/stage2.py has_overflow_serial), after the backward.
# BF16_Optimizer.update_hp_grads adds `lp.grad.data.to(hp_grad.dtype)` into the fp32
# accumulator after each micro-batch's backward, while the other micro-batches' activations
# are alive (DeepSpeed runtime/bf16_optimizer.py).
GRAD_CAST_BYTES = 4.0
# DeepSpeed ZeRO-1 reduces the 16-bit gradients in buckets of reduce_bucket_size = 5e8
# elements (zero/constants.py ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT); at stage 1 the
# engine turns contiguous_gradients off (engine.py _configure_zero_optimizer: "Overlap and
# contiguous grads are meaningless in stage 1"), so each bucket is flattened into a new 16-bit
# tensor (allreduce_bucket: self.flatten(bucket)) for its reduction, after the backward.
# BF16_Optimizer reduces its flat fp32 buffer, one tensor per parameter group, through
# buffered_allreduce_fallback: flattening one tensor is a view, nothing is copied.
DS_REDUCE_BUCKET_ELEMENTS = 5e8
# CUDA context of a process that loads every kernel at start-up (CUDA before 11.7, no lazy
# module loading; ptrblck, pytorch #107667: ">1000MB"): BigScience measured 1573 MiB on an A100
# (`torch.ones(1).cuda()`, chronicles-prequel.md, Feb 2022). The GPU profiles' reserve counts
# a lazy-loading context of ~0.3 GiB, so the older software needs the difference on top.
EAGER_CUDA_CONTEXT_EXTRA_GIB = (1573 - 300) / 1024


# ---- JobSpec.software "megatron-2021": Megatron-LM before July 2021 ------------------------------
# As NVIDIA/Megatron-LM @ 8aa4619f (22 Mar 2021, the commit DLPerf's V100 runs name) runs fp16:
# - The model's 16-bit .grad beside the fp32 main grads: FP16OptimizerWithFP16Params keeps one
#   fp32 .grad per fp32 master copy (megatron/optimizer/optimizer.py
#   _copy_model_grads_to_main_grads: `main_param.grad = torch.empty_like(main_param)` once), and
#   zero_grad frees the 16-bit grads only ("We only need to zero the model related parameters,
#   i.e., fp16_groups & fp32_from_fp32_groups"), so during the backward a GPU holds 2 (weights)
#   + 2 (16-bit grads) + 4 (fp32 grads) + 12 (master, Adam m, v) = 20 B per parameter.
#   (4fd6432, 9 Jul 2021, "fixed zero_grad for fp32_from_float16_groups", frees them too.)
MEGATRON_2021_HALF_GRAD_BYTES = 2.0
# - Local DDP (--DDP-impl local, the default) reduces after the backward, every step and on a DP
#   group of one as well (training.py train_step: `model.allreduce_params(...)`), by flattening
#   all 16-bit .grad into one new tensor (megatron/model/distributed.py allreduce_params:
#   `coalesced = _flatten_dense_tensors(grads)`): 2 B per parameter after the backward.
MEGATRON_2021_FLAT_GRAD_BYTES = 2.0
# - Dropout on: --attention-dropout and --hidden-dropout default to 0.1 (megatron/arguments.py
#   @ 8aa4619) and embedding dropout follows hidden-dropout (language_model.py); DLPerf's
#   script (Megatron-LM/scripts/mutil_perf_pretrain_gpt_dp_mp_pp.sh) sets DROPOUT_RATE but
#   passes no dropout flag. Masks count as in Korthikanti's GPT (5as/h, 1-byte masks).
MEGATRON_2021_DROPOUT = True
# - Its containers (NGC PyTorch 20.12: CUDA 11.1, PyTorch 1.8) load every kernel at start-up
#   (CUDA before 11.7): the eager context, EAGER_CUDA_CONTEXT_EXTRA_GIB. A second measurement of
#   the same generation: 1687 MB with torch 1.8.2+cu111 (`torch.Tensor(1).cuda()`, RTX 3090,
#   pytorch #55277), 2.3% above BigScience's 1573 MiB.
# Its process groups beyond the profile's three (the world group of its barriers, the
# model-parallel group of the found-inf and norm all-reduces) are left out: DLPerf's 1-GPU and
# 8-GPU data-parallel rows differ by 0.56 GiB (14362 vs 14938 MiB), one communicator's worth.


def largest_grad_elements(model: ModelSpec, end_stage):
    """Elements of the largest gradient tensor on a stage, all TP ranks together: the
    vocab-parallel embedding / LM head (V x h) where the stage holds one (`end_stage` true),
    else the largest matrix of a layer (fused QKV, the MLP's first matrix: gate and up fused
    under SwiGLU, as Megatron stores them; one expert's for MoE). Divide by tp for one GPU."""
    h = model.hidden_size
    if model.is_mla:
        qkv = h * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0))
    else:
        qkv = h * (model.num_attention_heads + 2 * model.kv_heads) * model.head_size
    width = 2 if model.activation == "swiglu" else 1
    ffn = model.intermediate_size if not model.is_moe else max(
        model.intermediate_size if model.num_moe_layers < model.num_hidden_layers else 0,
        model.expert_ffn)
    layer = max(qkv, width * ffn * h)
    return np.where(np.asarray(end_stage) > 0, max(layer, model.vocab_size * h), layer)


def recipe_buffers(software: str, grad_dtype: str, grad_elements, stage_params):
    """(during_backward, after_backward) transient bytes of the software's gradient recipe on
    one GPU. grad_elements: elements of the GPU's largest gradient tensor; stage_params:
    parameters on the GPU. during_backward coexists with the activations; after_backward (the
    reduction, the step's overflow check) comes once they are freed. "megatron-2021": the flat
    16-bit copy of local DDP's all-reduce, after. Zero for current software (Megatron-Core
    reduces its contiguous buffer in place)."""
    grad_elements = np.asarray(grad_elements, dtype=float)
    zero = np.zeros_like(grad_elements)
    if software == "megatron-2021":  # local DDP's flat copy of the 16-bit grads
        return zero, MEGATRON_2021_FLAT_GRAD_BYTES * np.broadcast_to(
            np.asarray(stage_params, dtype=float), grad_elements.shape)
    if software != "deepspeed-2022":
        return zero, zero
    if grad_dtype == "half+fp32":
        return GRAD_CAST_BYTES * grad_elements, zero
    if grad_dtype == "half":
        bucket = np.minimum(DS_REDUCE_BUCKET_ELEMENTS, stage_params) * WEIGHT_BYTES
        return zero, np.maximum(GRAD_CAST_BYTES * grad_elements, bucket)
    return zero, zero

# NCCL memory per communicator: ~544 MB for a 2-rank group, ~688 MB for more ranks (measured on
# 4x A100, nccl #964; docs/hardware.md 3.5). The GPU profiles' reserve counts three (TP, PP, DP).
# DeepSpeed 0.5-0.6's pipeline engine also runs collectives on (runtime/pipe/engine.py,
# module.py, zero/stage2.py, bf16_optimizer.py): the pipe-parallel group (_aggregate_total_loss
# broadcasts the loss from the last stage every step), the tied-weight group of the first and
# last stage (allreduce_tied_weight_gradients of the shared word embedding; Megatron-DeepSpeed's
# GPTModelPipe ties it with TiedLayerSpec), and the model-parallel group, TP x PP ranks (gradient
# norm and overflow all-reduces, _model_parallel_all_reduce / get_global_norm_of_tensors).
NCCL_PAIR_COMM_BYTES = 544e6
NCCL_COMM_BYTES = 688e6


def _comm_bytes(ranks):
    return np.where(ranks > 2, NCCL_COMM_BYTES, np.where(ranks == 2, NCCL_PAIR_COMM_BYTES, 0.0))


def runtime_extra_bytes(software: str, tp, pp, end_stage):
    """Per-GPU runtime memory beyond the GPU profile's reserve, bytes (vectorized over layouts
    and stages): for "deepspeed-2022" the eager CUDA context (EAGER_CUDA_CONTEXT_EXTRA_GIB) and
    the NCCL communicators of the pipeline engine's extra groups; for "megatron-2021" the eager
    context; none for current software."""
    tp, pp, end_stage = (np.asarray(x, dtype=float) for x in (tp, pp, end_stage))
    if software == "megatron-2021":
        return np.full(np.broadcast(tp, pp, end_stage).shape,
                       EAGER_CUDA_CONTEXT_EXTRA_GIB * 2**30)
    if software != "deepspeed-2022":
        return np.zeros(np.broadcast(tp, pp, end_stage).shape)
    tied = np.where((pp > 1) & (end_stage > 0), NCCL_PAIR_COMM_BYTES, 0.0)
    comms = _comm_bytes(pp) + tied + _comm_bytes(tp * pp)
    return EAGER_CUDA_CONTEXT_EXTRA_GIB * 2**30 + comms


# ---- per-stage memory terms (arrays of shape (layouts, candidate stages); see batch.py) -------
# Activation offload keeps two layers' activations of one micro-batch on the GPU: the one being
# copied out (in) while the next computes (Transformer Engine's CPU offload context double-
# buffers one layer ahead; Megatron-Core cpu_offloading).
OFFLOAD_RESIDENT_LAYERS = 2
_COL = (slice(None), None)  # broadcast a per-layout (N,) array against (N, C) stage arrays


@dataclass(frozen=True)
class StageState:
    """Parameters and model-state bytes of one GPU of each stage, (layouts, stages) arrays."""

    p_dense: np.ndarray  # non-expert parameters on one GPU (after TP)
    p_expert: np.ndarray  # routed-expert parameters on one GPU (after EP x expert-TP)
    d_dense: np.ndarray  # (layouts,) ZeRO / distributed-optimizer group: dp x cp
    d_expert: np.ndarray  # (layouts,) expert-data-parallel group: tp x cp x dp / (etp x ep)
    weights: np.ndarray  # bytes
    grads: np.ndarray  # bytes
    optimizer: np.ndarray  # bytes
    unit: np.ndarray  # one layer's 16-bit params on one GPU, the FSDP / ZeRO-3 unit, bytes


def stage_state(stages, tp, dp, cp, ep, zero, grad_dtype: str = "auto", etp=None,
                software: str = "current") -> StageState:
    """Weights, gradients and optimizer state of each stage's GPU (param_state_arrays on its
    local parameters). Experts are split over ep x etp (etp None: tp) and their state sharded
    over the expert-DP replicas, tp x cp x dp / (etp x ep) (Megatron-Core's folding).
    "megatron-2021" keeps the 16-bit .grad beside the recipe's gradients
    (MEGATRON_2021_HALF_GRAD_BYTES)."""
    col, st = _COL, stages
    etp = tp if etp is None else etp
    p_dense = st["p_dense"] / tp[col]
    p_exp = st["p_expert"] / (ep * etp)[col]
    d_dense = dp * cp
    d_exp = np.maximum(tp * dp * cp / (ep * etp), 1.0)
    wd, gd, od = param_state_arrays(zero, d_dense, grad_dtype)
    we, ge, oe = param_state_arrays(zero, d_exp, grad_dtype)
    if software == "megatron-2021":
        gd, ge = gd + MEGATRON_2021_HALF_GRAD_BYTES, ge + MEGATRON_2021_HALF_GRAD_BYTES
    unit = (st["max_layer_params"] / tp[col] + st["max_layer_experts"] / (ep * etp)[col]) * 2.0
    return StageState(
        p_dense=p_dense, p_expert=p_exp, d_dense=d_dense, d_expert=d_exp,
        weights=p_dense * wd[col] + p_exp * we[col],
        grads=p_dense * gd[col] + p_exp * ge[col],
        optimizer=p_dense * od[col] + p_exp * oe[col],
        unit=unit,
    )


def stage_activation_bytes(model: ModelSpec, stages, tokens, tp, sp, recompute, flight,
                           per_token, full_per_token, software: str = "current"):
    """Activation bytes of one GPU of each stage at its peak: `flight` micro-batches of its
    layers (per_token = (dense, moe) activation_per_token), the embedding's input ids on the
    first stage, the LM head's input and fp32 logits on the last, and the working set full
    recompute (one layer of one micro-batch) or offload (OFFLOAD_RESIDENT_LAYERS) rebuilds
    (full_per_token = (dense, moe) full_layer_activation_per_token)."""
    col, st, rc = _COL, stages, recompute
    act_d, act_m = per_token
    full_d, full_m = full_per_token
    layers = st["n_dense"] + st["n_moe"]
    per_mb_layers = tokens[col] * (st["n_dense"] * act_d[col] + st["n_moe"] * act_m[col])
    rep_div = np.where(sp, tp, 1.0)
    h, voc = model.hidden_size, model.vocab_size
    emb_extra = tokens * (INPUT_ID_BYTES + (h if uses_dropout(model, software) else 0) / rep_div)
    head_extra = tokens * (2 * 2 * h / rep_div + LOGIT_BYTES * voc / tp)
    resident = np.select([rc == 2, rc == 3], [1.0, OFFLOAD_RESIDENT_LAYERS], default=0.0)
    working = resident * tokens * np.maximum(full_d, full_m)
    head = (st["head"] + st["mtp"]) * head_extra[col]  # an MTP module's logits as well
    rebuilt = np.where(layers > 0, working[col], 0.0)
    # Full recompute rebuilds a layer inside the backward, and the backward runs the loss and
    # the LM head first, whose saved logits are freed once their backward node has run (torch
    # autograd releases saved tensors after use; Megatron mpu/random.py CheckpointFunction.
    # backward re-runs the layer's forward only when autograd reaches it): the logits and the
    # rebuilt layer never coexist. Offload keeps its resident layers through the forward.
    transient = np.where((rc == 2)[col], np.maximum(head, rebuilt), head + rebuilt)
    return per_mb_layers * flight + st["emb"] * (emb_extra[col] * flight) + transient


def stage_other_bytes(model: ModelSpec, software: str, grad_dtype: str, stages, state: StageState,
                      tokens, tp, pp, zero, ep_buffer, activations):
    """Temporary buffers of one GPU of each stage: the largest collective's (the SP all-gather
    output, or the MoE dispatcher's buffers, ep_buffer: moe.dispatch_buffer_bytes), ZeRO-2/3
    unsharded units (nothing gathered on a DP group of one rank), the step's fp32 gradient
    shard (step_grad_bytes) and, for software "deepspeed-2022", the fp32 copy of the largest
    gradient and the reduce bucket (recipe_buffers), the eager CUDA context and extra NCCL
    communicators (runtime_extra_bytes). Buffers that exist only after the backward count beyond the
    activations they replace: peak = max(activations + backward buffers, after-backward)."""
    col, st = _COL, stages
    h = model.hidden_size
    tp_buf = np.where(tp > 1, tokens * h * 2, 0.0)  # SP all-gather output (one b s h tensor)
    coll = np.maximum(tp_buf, ep_buffer)
    unit_c = np.where((state.d_dense > 1)[col], state.unit, 0.0)
    z = zero[col]
    zero_units = np.select([z == 2, z == 3], [unit_c, ZERO3_LIVE_UNITS * unit_c], default=0.0)
    end_stage = st["emb"] + st["head"]
    grad_elems = largest_grad_elements(model, end_stage) / tp[col]
    during, after = recipe_buffers(software, grad_dtype, grad_elems,
                                   state.p_dense + state.p_expert)
    step_grads = (state.p_dense * step_grad_bytes(state.d_dense, grad_dtype, zero)[col]
                  + state.p_expert * step_grad_bytes(state.d_expert, grad_dtype, zero)[col])
    after = np.maximum(after, step_grads)  # the step's fp32 shard comes after the reduction
    backward_other = coll[col] + zero_units + during
    return np.maximum(backward_other, after - activations) + runtime_extra_bytes(
        software, tp[col], pp[col], end_stage)


# ---- what the device shows (nvidia-smi) beside what PyTorch allocates -------------------------
# peak_mem_gb predicts torch.cuda.max_memory_allocated(). nvidia-smi shows more: the caching
# allocator's reserve (blocks freed by PyTorch but kept by the allocator, and fragmentation),
# the CUDA context and NCCL's communicator buffers. device_memory_gib adds them.
# CUDA context with lazy module loading (CUDA >= 11.7, the default since PyTorch 1.13, which
# sets CUDA_MODULE_LOADING=LAZY): 287,047,680 B measured with one small tensor against
# 666,632,192 B eager (pytorch #86509); "~300MB" (ptrblck, pytorch #107667). The GPU
# profiles' reserve_gib counts the same 0.3 GiB.
CUDA_CONTEXT_GIB = 0.3
# Caching-allocator reserve, per GiB of predicted activations: torch.cuda.max_memory_reserved()
# minus the predicted allocated peak, over the predicted activations, median of the 755 runs of
# the nanotron sweep (calibration/sweeps/nanotron_sweep_dev.csv, notes "Mem Res (GB)" =
# max_memory_reserved() / 2^30 logged at iteration 3 by nanotron src/nanotron/logging.py
# log_memory @ 0e0a27ea; the reset there makes its "Mem Alloc" the optimizer phase only, so
# the reserve is fitted against the predicted peak, not that column). The activations are the
# blocks that come and go each micro-batch in many sizes; the model state is allocated once.
# Leave one model out: 0.973 (fit without 1.34B), 0.770 (without 8.86B), 0.890 (without 469B).
# Re-fitted whenever the predicted peak moves (it was 1.345 before the nanotron preset's fp32
# gradients and stage split; tests/unit/test_memory_device.py recomputes it).
# Checked (not fitted) on the published nvidia-smi readings: benchmarks/memory.py,
# docs/accuracy.md "Device memory".
RESERVE_PER_ACTIVATION_GIB = 0.889


def nccl_communicator_gib(tp, pp, dp, cp, ep):
    """GiB of NCCL communicator buffers on one GPU: one communicator per parallel group of more
    than one rank (TP, PP, DP x CP, CP, EP), 544 MB for a pair and 688 MB for more ranks
    (nccl #964, NCCL_COMM_BYTES)."""
    tp, pp, dp, cp, ep = (np.asarray(x, dtype=float) for x in (tp, pp, dp, cp, ep))
    groups = (_comm_bytes(tp) + _comm_bytes(pp) + _comm_bytes(dp * cp) + _comm_bytes(cp)
              + _comm_bytes(ep))
    return groups / 2**30


def device_memory_gib(peak_gib, activations_gib, memory_gib, tp, pp, dp, cp, ep):
    """What the device shows (nvidia-smi) at the step's peak, GiB: the allocated peak, the
    caching allocator's reserve (RESERVE_PER_ACTIVATION_GIB x activations), the CUDA context and
    the NCCL communicators, at most the GPU's HBM (the allocator releases cached blocks and
    retries before it reports out of memory, so the reserve never makes a plan fail)."""
    dev = (np.asarray(peak_gib, dtype=float)
           + RESERVE_PER_ACTIVATION_GIB * np.asarray(activations_gib, dtype=float)
           + CUDA_CONTEXT_GIB + nccl_communicator_gib(tp, pp, dp, cp, ep))
    return np.minimum(dev, np.asarray(memory_gib, dtype=float))

"""Structural checks of a layout against a model, cluster and job: readable reasons, empty when
the layout can run (memory is not checked here: a layout that does not fit is still estimated).
TP beyond the NVLink domain can run (over the scale-out network): layout_warnings says so, and
the search leaves it out unless asked (tp_allowed's across_domains)."""

from __future__ import annotations

from typing import Any

from planner.layout import RECOMPUTE_LEVELS, Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec


def tp_allowed(model: ModelSpec, cluster: ClusterSpec, tp: int,
               across_domains: bool = False) -> bool:
    """tp dividing the query heads, dividing or a multiple of the key/value heads (Megatron
    replicates KV heads when tp > kv), and within the scale-up domain unless `across_domains`
    (`solve --tp-across-nodes`)."""
    heads, kv = model.num_attention_heads, model.kv_heads
    inside = across_domains or tp <= cluster.domain_gpus
    return inside and heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def layout_warnings(cluster: ClusterSpec, layout: Layout) -> list[str]:
    """What a layout that can run does at a cost worth saying, one line each: a TP group larger
    than the scale-up (NVLink) domain runs its per-layer collectives over the scale-out network
    (the cost model charges them hierarchically on the NICs: planner.costmodel.comm)."""
    out: list[str] = []
    # a cluster of pools: its smallest NVLink domain (TP groups stay in their pool)
    pools = getattr(cluster, "pools", None) or (cluster,)
    domain = min(pool.domain_gpus for pool in pools)
    if layout.tp > domain:
        gpu = cluster.gpu
        out.append(
            f"tp={layout.tp} spans {-(-layout.tp // domain)} NVLink domains of {domain} GPUs: "
            f"its per-layer collectives cross the scale-out network ({gpu.inter_node.fabric}), "
            "estimated hierarchically; solve keeps tp inside a domain unless --tp-across-nodes"
        )
    return out


# bf16 arithmetic and tensor cores need compute capability 8.0 (Ampere): CUDA C++ Programming
# Guide, "Arithmetic Instructions" / cuda_bf16.h (__nv_bfloat16 math on sm_80+); the V100
# (7.0) has FP16 tensor cores only (NVIDIA Tesla V100 GPU Architecture whitepaper, 2017).
BF16_MIN_CAPABILITY = 8.0
# FlashAttention-2 and -3 run on Ampere, Ada and Hopper (8.0+): Dao-AILab/flash-attention
# README "Installation and features"; FlashAttention 1 needed Turing or Ampere (7.5+). Either
# way not the V100's 7.0.
FLASH_MIN_CAPABILITY = 8.0
# The global batch does not feed the cluster when the best plan spends half its step or more
# in the pipeline bubble (fewer micro-batches than stages: Narayanan et al. 2021 sec. 3.3, the
# bubble (p - 1) / m stays small only with m >> p), or two thirds of it idle in the bubble and
# exposed communication together (one micro-batch per rank hides nothing behind the backward).
# Conventions, not fits: they flag the 2-10% MFU plans of tiny batches, not Llama 3 405B's
# 2048 sequences on 16,384 GPUs (Meta's own run).
BUBBLE_SHARE_WARNING = 0.5
IDLE_SHARE_WARNING = 2 / 3


def plan_warnings(cluster: ClusterSpec, job: JobSpec, plan: Any) -> list[str]:
    """What a user should be told about a plan that runs, one line each (no "warning:" prefix):
    a precision or attention kernel the GPU lacks, a global batch too small to keep the GPUs
    busy, and (with --train-tokens) a step longer than the checkpoint interval it recommends."""
    out: list[str] = []
    gpu, e = cluster.gpu, plan.estimate
    cc = gpu.compute_capability
    if cc is not None and cc < BF16_MIN_CAPABILITY and job.precision == "bf16":
        out.append(f"{gpu.name} has no bf16 (compute capability {cc:.1f}; bf16 needs "
                   f"{BF16_MIN_CAPABILITY:.1f}): run --precision fp16 (the estimate uses the fp16 "
                   "tensor peak)")
    if cc is not None and cc < FLASH_MIN_CAPABILITY and job.attention != "unfused":
        out.append(f"{gpu.name} runs no FlashAttention (compute capability {cc:.1f}; it needs "
                   f"{FLASH_MIN_CAPABILITY:.1f}): run --attention unfused (s x s scores stored)")
    step = e.step_time_s
    idle = (e.time_pp_bubble_s + e.time_tp_comm_s + e.time_cp_comm_s + e.time_ep_comm_s
            + e.time_pp_comm_s + e.time_dp_comm_exposed_s)
    if step > 0 and (e.time_pp_bubble_s / step >= BUBBLE_SHARE_WARNING
                     or idle / step >= IDLE_SHARE_WARNING):
        n = plan.layout.tp * plan.layout.pp * plan.layout.dp * plan.layout.cp
        out.append(f"global batch {e.global_batch} is too small to feed {n} GPUs: "
                   f"{plan.layout} spends {e.time_pp_bubble_s / step:.0%} of its step in the "
                   f"pipeline bubble and {(idle - e.time_pp_bubble_s) / step:.0%} in exposed "
                   f"communication (MFU {e.mfu:.1%}); raise --global-batch or use fewer GPUs")
    run = getattr(plan, "run", None)
    if run is not None and step > run.checkpoint_interval_min * 60.0:
        out.append(f"one step ({step:,.0f} s) is longer than the checkpoint interval it "
                   f"recommends ({run.checkpoint_interval_min:.1f} min, Young): checkpoints "
                   "land only between steps, so checkpoint every step and expect each failure "
                   "to lose more than the run's figures say")
    return out


def offload_allowed(cluster: ClusterSpec) -> bool:
    """Activation offload needs the profile's GPU <-> host bandwidth (host_link_gb_per_s)."""
    return cluster.gpu.host_link_gb_per_s is not None


def cp_allowed(job: JobSpec, cp: int) -> bool:
    """cp divides the sequence with an even chunk per rank (causal load balancing)."""
    return job.seq_len % cp == 0 and (cp == 1 or (job.seq_len // cp) % 2 == 0)


def expert_fold_allowed(tp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """Megatron-Core's MoE parallel folding: expert-TP x EP divides the tp*cp*dp ranks of a
    pipeline stage (planner.layout's docstring cites the checks)."""
    return (tp * cp * dp) % (etp * ep) == 0


def moe_needs_sp(model: ModelSpec, tp: int, sp: bool) -> bool:
    """An MoE model with tp > 1 but sp off: Megatron-Core's MoELayer raises in training
    ("performance may degrade if MoE and tensor parallelism are enabled without also enabling
    sequence parallelism", megatron/core/transformer/moe/moe_layer.py at d98e8a6); torchtitan's
    TP plan always shards the sequence (SequenceParallel)."""
    return model.is_moe and tp > 1 and not sp


def vpp_allowed(num_layers: int, pp: int, vpp: int) -> bool:
    """Interleaving (vpp > 1) needs pp > 1 and pp*vpp chunks dividing the layers, or the layers
    + 2 (Megatron's account_for_embedding/loss_in_pipeline_split)."""
    if vpp == 1:
        return True
    chunks = pp * vpp
    return pp > 1 and (num_layers % chunks == 0 or (num_layers + 2) % chunks == 0)


# most virtual stages per GPU searched where only a layout string states the chunks (unless
# pinned): NVIDIA's published layout-string runs use 2..4 (DeepSeek-V3 vpp 4 on pp 8, 2 on pp
# 16: Megatron-Bridge scripts/performance deepseek_v3 configs @ 067f987df); every value adds a
# copy of the pipelined space: DeepSeek-V3 on 65536 H100 at seq 32768 and 2**20 sequences has
# 385k layouts with 4 (1.6 s CPU for solve), 635k with 8 (2.4 s), 0.95 s before any
VPP_LAYOUT_CAP = 4


def vpp_searchable(num_layers: int, pp: int, vpp: int, pinned: bool = False) -> bool:
    """The interleaving the search enumerates: vpp 1; the chunks Megatron's flags split evenly
    (vpp_allowed); and, for a pp the flags cannot interleave at all (no pp*v divides the layers
    or the layers + 2), or a pinned vpp, any pp*vpp up to the layers + 2. Megatron-Core builds
    any chunking a --pipeline-model-parallel-layout string states: validate_layer_layout checks
    only that the embedding opens and the loss closes the layout, once each, and the decoder /
    MTP layer counts (a chunk may hold no layer; megatron/core/transformer/
    pipeline_parallel_layer_layout.py @ d98e8a6), the string's length / pp being the vpp
    (transformer_config.py @ d98e8a6). So DeepSeek-V3's 61 layers interleave on pp 8 x vpp 4
    (NVIDIA's 'Et|(tt|)*30mL'); more chunks than layers + 2 (every chunk a layer but the
    embedding's and the loss's) would only add empty ones; vpp is capped at VPP_LAYOUT_CAP
    there. Where the flags already interleave
    the pp (Llama 3 405B: 126 + 2 on 16 x 8) the layout-string values are not added: each adds
    a copy of the pipelined space (solve speed), and a pin opens them. Such a layout carries its
    layers per virtual stage (Space.layout) and exports as a layout string
    (launchers.megatron.split_args)."""
    if vpp == 1 or vpp_allowed(num_layers, pp, vpp):
        return True
    if pp < 2 or pp * vpp > num_layers + 2 or (vpp > VPP_LAYOUT_CAP and not pinned):
        return False
    return pinned or not any(vpp_allowed(num_layers, pp, v)
                             for v in range(2, (num_layers + 2) // pp + 1))


def layout_string_chunks(num_layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The layers per virtual stage a searched layout carries: () where Megatron's flags state
    its chunks (vpp 1, or vpp_allowed), else the even chunk rule's counts (stage_layer_counts
    over pp*vpp: what the cost model costs), which only a layout string states."""
    if vpp == 1 or vpp_allowed(num_layers, pp, vpp):
        return ()
    from planner.layout import stage_layer_counts

    return tuple(stage_layer_counts(num_layers, pp * vpp))


def interleave_batch_allowed(pp: int, vpp: int, grad_accum: int) -> bool:
    """Megatron's interleaved schedule needs the micro-batches per step divisible by pp."""
    return vpp == 1 or grad_accum % pp == 0


def stage_layers_violations(num_layers: int, layout: Layout) -> list[str]:
    """Problems of explicit layer counts: one count per stage (uneven counts only with plain
    1F1B; the first stage holds at least one layer, a later one may hold none: nanotron's
    cost-balanced split leaves the stages from the LM head's on without layers,
    pipeline.nanotron_stage_counts; `--stage-layers` on the command line still asks for one per
    stage, cli.options), or with vpp > 1 one per virtual stage (Megatron's
    --pipeline-model-parallel-layout: a chunk may hold no decoder layer, as Megatron builds
    empty stages, but every pipeline stage holds a layer or, the first and the last, the
    embedding or the loss); the counts sum to the layers."""
    counts = layout.stage_layers
    if not counts:
        return []
    out = []
    if layout.virtual_split:
        per_stage = layout.layers_per_stage
        if min(counts) < 0 or min(per_stage[1:-1], default=1) < 1:
            out.append("--stage-layers: every pipeline stage but the first and the last (the "
                       "embedding's, the loss's) needs at least one layer")
    elif len(counts) != layout.pp:
        chunks = f" or pp*vpp={layout.pp * layout.vpp}" if layout.vpp > 1 else ""
        out.append(f"--stage-layers gives {len(counts)} stages but pp={layout.pp}{chunks}")
    elif min(counts) < 0 or counts[0] < 1:
        out.append("--stage-layers: every stage needs at least one layer")
    if sum(counts) != num_layers:
        out.append(f"--stage-layers sums to {sum(counts)} layers, the model has {num_layers}")
    if not out and layout.vpp > 1 and not layout.virtual_split and not layout.even_split:
        out.append("uneven --stage-layers with vpp > 1 gives the layers of every virtual stage "
                   "(pp*vpp counts, or a Megatron layout string 'Et*3|(t*4|)*14|t*2L')")
    return out


def layout_violations(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout
) -> list[str]:
    """Every structural problem of `layout`, one readable line each."""
    out: list[str] = []
    lo = layout
    for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs"):
        if getattr(lo, name) < 1:
            out.append(f"{name}={getattr(lo, name)} must be at least 1")
    if out:
        return out
    if lo.zero not in (0, 1, 2, 3):
        out.append(f"zero={lo.zero} must be 0, 1, 2 or 3")
    if lo.recompute not in RECOMPUTE_LEVELS:
        out.append(f"recompute='{lo.recompute}' must be none, selective, full or offload")
    if lo.recompute == "offload" and not offload_allowed(cluster):
        out.append(f"recompute='offload' needs a host link in the GPU profile "
                   f"(host_link_gb_per_s); {cluster.gpu.name} has none")
    n = cluster.num_gpus
    if lo.num_gpus != n:
        out.append(
            f"tp*pp*dp*cp = {lo.tp}*{lo.pp}*{lo.dp}*{lo.cp} = {lo.num_gpus}, "
            f"but the cluster has {n} GPUs"
        )
    a, kv = model.num_attention_heads, model.kv_heads
    if a % lo.tp:
        out.append(f"tp={lo.tp} does not divide the {a} attention heads")
    elif kv % lo.tp and lo.tp % kv:
        out.append(f"tp={lo.tp} neither divides nor is a multiple of the {kv} key/value heads")
    L = model.num_hidden_layers
    if lo.pp > L:
        out.append(f"pp={lo.pp} exceeds the {L} layers")
    if lo.vpp > 1:
        if lo.pp == 1:
            out.append(f"vpp={lo.vpp} needs pp > 1 (interleaving splits pipeline stages)")
        elif not lo.virtual_split and not vpp_allowed(L, lo.pp, lo.vpp):
            out.append(
                f"pp*vpp = {lo.pp * lo.vpp} model chunks divide neither the {L} layers nor "
                f"the layers + 2 (embedding and loss each taking a chunk's slot); give every "
                f"virtual stage's layers (--stage-layers, Megatron's pipeline layout)"
            )
    out += stage_layers_violations(L, lo)
    per_step = lo.mbs * lo.dp
    if job.global_batch % per_step:
        out.append(
            f"global batch {job.global_batch} is not divisible by mbs*dp = "
            f"{lo.mbs}*{lo.dp} = {per_step}"
        )
    elif not interleave_batch_allowed(lo.pp, lo.vpp, job.global_batch // per_step):
        out.append(
            f"vpp={lo.vpp} needs the {job.global_batch // per_step} micro-batches per step "
            f"(grad_accum) divisible by pp={lo.pp} (Megatron's interleaved schedule)"
        )
    if job.seq_len % lo.cp:
        out.append(f"cp={lo.cp} does not divide the sequence length {job.seq_len}")
    elif not cp_allowed(job, lo.cp):
        out.append(
            f"cp={lo.cp} needs an even chunk per rank (s/cp = {job.seq_len // lo.cp}; "
            "causal load balancing splits it in two)"
        )
    if lo.etp < 0:
        out.append(f"etp={lo.etp} must be at least 1")
    elif (lo.ep > 1 or lo.etp) and not model.is_moe:
        knob = f"ep={lo.ep}" if lo.ep > 1 else f"etp={lo.etp}"
        out.append(f"{knob} needs a mixture-of-experts model ({model.name} is dense)")
    elif model.is_moe:
        if model.num_experts % lo.ep:
            out.append(f"ep={lo.ep} does not divide the {model.num_experts} experts")
        if not expert_fold_allowed(lo.tp, lo.cp, lo.dp, lo.ep, lo.expert_tp):
            out.append(
                f"etp*ep = {lo.expert_tp}*{lo.ep} = {lo.expert_tp * lo.ep} does not divide the "
                f"tp*cp*dp = {lo.tp * lo.cp * lo.dp} ranks of a pipeline stage (Megatron-Core "
                "folds the expert groups over them)")
    if moe_needs_sp(model, lo.tp, lo.sp):
        out.append(f"tp={lo.tp} on a mixture-of-experts model needs sequence parallelism (sp): "
                   "Megatron-Core refuses MoE with TP but without SP in training")
    if lo.sp and lo.tp == 1:
        out.append("sequence parallelism (sp) needs tp > 1")
    return out

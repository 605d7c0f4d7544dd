"""Mixture-of-experts terms shared by compute, communication and memory (vectorized over
layouts): how unevenly the router loads the EP ranks and what a capacity factor caps, the token
dispatchers' traffic, and the routed activations that follow the load.

Expert layout (planner.layout): per pipeline stage the tp*cp*dp ranks are folded into expert-TP
(etp, innermost), EP (ep, stride etp) and expert-DP replicas. A rank holds E/ep experts, each
split over etp ranks, and runs them on the tokens its EP peers route to it.

Load. With E experts, top-k routing and T local tokens per rank (mbs x s / cp), a rank's local
experts receive on average T k etp / tp token copies per micro-batch (ep ranks x T k / tp tokens
over E/ep experts per rank, gathered over the etp ranks that share them). The most loaded rank
sets the pace of every dispatch (a barrier) and its expert GEMMs; it holds `load_factor` times
the mean. Without a capacity factor (dropless, Megatron-Core's default) that is the router's
imbalance; with --moe-capacity-factor c Megatron drops the copies beyond c x the mean per
expert (moe_expert_capacity_factor, megatron/core/transformer/transformer_config.py at
d98e8a6), so the load is min(imbalance, c).

Dispatchers (JobSpec.moe_dispatcher; Megatron-Core megatron/core/transformer/moe/
token_dispatcher.py at d98e8a6):
- alltoall (MoEAlltoAllTokenDispatcher): all-to-all of the routed copies over the EP group,
  then an all-gather over the expert-TP group (gather_from_sequence_parallel_region on
  expt_tp); combine is the reverse (reduce-scatter, all-to-all). NCCL's busbw curves
  (comm.all_to_all_time).
- allgather (MoEAllGatherTokenDispatcher): all-gather of every token (not its k copies) over
  the tp_ep group of etp x ep ranks, each rank keeps its experts' share; combine reduce-scatters.
- deepep (MoEFlexTokenDispatcher, moe_flex_dispatcher_backend "deepep", over tp_ep): fused
  all-to-all kernels at DeepEP's measured bandwidths (DEEPEP_* below), no NCCL curve.
Forward runs dispatch + combine per MoE layer, backward the same again, full recompute a
third time (as comm.tp_stage_time counts the TP collectives).
"""

from __future__ import annotations

import numpy as np

from planner.specs import ClusterSpec, ModelSpec

DISPATCHERS = ("alltoall", "allgather", "deepep")
ROUTINGS = ("aux_loss", "loss_free", "force_balanced")
# Per-expert load imbalance of a trained router, MaxVio_global = (max_i Load_i - mean Load) /
# mean Load over the validation set (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing
# Strategy for Mixture-of-Experts", arXiv 2408.15664, Eq. 4 and Table 2; checked against the
# paper's text, quoted in tests/unit/test_costmodel_moe_load.py): auxiliary-loss-controlled
# (alpha 0.001) 0.72 at 1B and 0.52 at 3B; Loss-Free Balancing (expert bias, as DeepSeek-V3
# routes) 0.04 at both. The central value is the larger model's; the 1B value is the upper end
# of the band (EXPERT_MAX_VIOLATION_HIGH, load_band_seconds). Validation-set figures (the load
# summed over the whole set); one micro-batch's, which the step waits for, is not published.
EXPERT_MAX_VIOLATION = {"aux_loss": 0.52, "loss_free": 0.04, "force_balanced": 0.0}
EXPERT_MAX_VIOLATION_HIGH = {"aux_loss": 0.72, "loss_free": 0.04, "force_balanced": 0.0}
# DeepEP (deepseek-ai/DeepEP docs/legacy.md at dd758ca, "Normal kernels with NVLink and RDMA
# forwarding", H800 with ~160 GB/s NVLink and one CX7 400 Gb/s NIC of ~50 GB/s per GPU, 4096
# tokens, hidden 7168, top-4 groups, top-8): intranode EP 8 dispatch 153 GB/s, combine 158 GB/s
# of the ~160 -> 0.97 of the scale-up plateau; internode EP 16/32/64 dispatch 43/58/51 GB/s,
# combine 43/57/50 GB/s of ~50 -> 1.01 of the NIC. What the numbers count (tests/legacy/
# test_intranode.py and test_internode.py at dd758ca): intranode, the bytes of recv_x, one row
# per (token, receiving rank) pair, a token's copies for one rank sent once; internode,
# num_rdma_token_sent x hidden x 2, one row per (token, node) pair (inplace_unique over the
# nodes, the sender's own node included). deepep_time counts the same bytes.
DEEPEP_NVLINK_FRACTION = (153 + 158) / 2 / 160
DEEPEP_RDMA_FRACTION = (43 + 58 + 51 + 43 + 57 + 50) / 6 / 50


def miss_probability(num_experts, held, k):
    """Probability that a token's k distinct experts, drawn uniformly from num_experts, all miss
    a set of `held` experts: prod_{i<k} (E - held - i) / (E - i) (0 when they cannot)."""
    held = np.asarray(held, dtype=float)
    out = np.ones_like(held)
    for i in range(int(k)):
        out = out * np.clip((num_experts - held - i) / (num_experts - i), 0.0, None)
    return out


def load_factor(model: ModelSpec, ep, capacity_factor: float | None,
                routing: str = "aux_loss", copies=None):
    """Routed copies on the most loaded EP rank over the mean (per layout); 1 for dense models.

    Trained routers (aux_loss, loss_free): 1 + MaxVio / sqrt(E/ep). With one expert per rank
    (E/ep = 1) this is the paper's per-expert MaxVio itself; that a rank's E/ep experts average
    their excesses as independent draws is this model's assumption (no source measures a
    rank's load), which is why the step-time band (load_band_seconds) spans 1 to 1 + MaxVio_high.
    force_balanced (Megatron-Core moe_router_force_load_balancing, NeMo AutoModel's
    fake_balanced_gate: random logits, as every vendor benchmark routes): each of the ep x
    (T/tp) tokens of the group picks k of the E experts uniformly, so a rank's count is a sum of
    hypergeometric draws with mean `copies` (= T k / tp, what it sends) and relative spread
    sqrt((1 - 1/ep) (E - k) / (E - 1) / copies); the largest of ep such counts sits about
    sqrt(2 ln ep) spreads above the mean (the Gaussian maximum bound). `copies` None: 0 spread.
    A capacity factor c caps the load at c (tokens beyond are dropped; c < 1 drops some even
    on average)."""
    ep = np.asarray(ep, dtype=float)
    if not model.is_moe:
        return np.ones_like(ep)
    if routing not in EXPERT_MAX_VIOLATION:
        raise ValueError(f"unknown MoE routing {routing!r} (one of {', '.join(ROUTINGS)})")
    e, k = model.num_experts, model.num_experts_per_tok
    if routing == "force_balanced":
        if copies is None:
            imbalance = np.ones_like(ep)
        else:
            rel = np.sqrt((1 - 1 / ep) * (e - k) / max(e - 1, 1) / np.maximum(copies, 1.0))
            imbalance = 1.0 + np.sqrt(2 * np.log(ep)) * rel
    else:
        imbalance = 1.0 + EXPERT_MAX_VIOLATION[routing] / np.sqrt(e / ep)
    return imbalance if capacity_factor is None else np.minimum(imbalance, capacity_factor)


def load_band_seconds(model: ModelSpec, routing: str, capacity_factor: float | None, load,
                      time_ep):
    """(minus, plus) seconds the router's load widens the step-time band by: the EP time is
    linear in the most loaded rank's load, which for a trained router lies anywhere from 1
    (a rank's experts offset each other) to 1 + EXPERT_MAX_VIOLATION_HIGH (one expert's
    excess on the whole rank, the smaller model's MaxVio), capped by a capacity factor; the
    central `load` is load_factor's. 0 for dense models and force-balanced routing. The
    expert GEMMs follow the same load and are not in this widening (a lower bound on it)."""
    time_ep = np.asarray(time_ep, dtype=float)
    if not model.is_moe or routing == "force_balanced":
        return np.zeros_like(time_ep), np.zeros_like(time_ep)
    load = np.asarray(load, dtype=float)
    high = 1.0 + EXPERT_MAX_VIOLATION_HIGH[routing]
    if capacity_factor is not None:
        high = min(high, capacity_factor)
    minus = time_ep * (1.0 - np.minimum(1.0, load) / load)
    plus = time_ep * np.maximum(high / load - 1.0, 0.0)
    return minus, plus


# The dispatchers take the MoE layer's input sequence-parallel, T / tp tokens per rank:
# Megatron-Core refuses MoE with TP in training without SP (moe_layer.py at d98e8a6, "performance
# may degrade if MoE and tensor parallelism are enabled without also enabling sequence
# parallelism"), torchtitan's TP plan shards the norms' sequence (SequenceParallel), and
# DeepSpeed-MoE drops the duplicate tokens of the TP ranks before the all-to-all. So the `sp`
# knob does not change the dispatch volume.


def routed_copy_bytes(model: ModelSpec, tokens, tp, sp=None):
    """Bytes one rank sends in one all-to-all dispatch (or combine) at the mean load: its
    T / tp tokens' k routed copies, 16-bit; 0 for dense models. `sp` is not used (above)."""
    if not model.is_moe:
        return np.zeros(np.shape(tokens))
    return tokens * model.num_experts_per_tok * model.hidden_size * 2 / tp


def token_bytes(model: ModelSpec, tokens, tp, sp=None):
    """Bytes of one rank's T / tp hidden states (16-bit): the allgather dispatcher's
    per-rank piece."""
    return tokens * model.hidden_size * 2 / tp


def dispatch_time(cluster: ClusterSpec, model: ModelSpec, dispatcher: str, tokens, tp, sp,
                  ep, etp, load):
    """Seconds of one dispatch (= one combine) per MoE layer, per layout (module docstring)."""
    from planner.costmodel import comm

    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    if not model.is_moe:
        return np.zeros(np.shape(ep))
    copies = routed_copy_bytes(model, tokens, tp, sp) * load  # the most loaded rank's
    if dispatcher == "allgather":
        group = comm.Group(cluster, ep * etp, 1)
        return comm.all_gather_time(group, token_bytes(model, tokens, tp, sp) * ep * etp)
    if dispatcher == "deepep":
        return deepep_time(comm.Group(cluster, ep * etp, 1), model, tokens, tp, ep, etp, load)
    a2a = comm.all_to_all_time(comm.Group(cluster, ep, etp), copies)
    return a2a + comm.all_gather_time(comm.Group(cluster, etp, 1), copies * etp)


def deepep_time(group, model: ModelSpec, tokens, tp, ep, etp, load):
    """Seconds of one DeepEP dispatch (= combine) for a rank sending its T / tp tokens, in the
    bytes DeepEP's measured bandwidths count (module comment): over NVLink each token once per
    receiving rank, T/tp x R x h x 2 B with R = ep (1 - miss(E/ep)) x etp ranks hit (the
    sender's own included), at DEEPEP_NVLINK_FRACTION of the scale-up plateau; across scale-up
    domains each token once per domain, T/tp x D x h x 2 B with D = N (1 - miss(E/N)) of the N
    domains the group spans hit (its own included), at DEEPEP_RDMA_FRACTION of its NICs'. The
    two legs run in parallel (the slower counts); `load` scales both (the most loaded rank)."""
    from planner.costmodel.comm import plateau_bytes_per_s

    gpu = group.cluster.gpu
    n = np.maximum(np.asarray(group.size, dtype=float), 1.0)
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    e, k, h = model.num_experts, model.num_experts_per_tok, model.hidden_size
    per_token = h * 2 * np.asarray(tokens, dtype=float) / np.asarray(tp, dtype=float) * load
    ranks_hit = ep * (1 - miss_probability(e, e / ep, k)) * etp
    domains = np.maximum(np.asarray(group.domains, dtype=float), 1.0)
    nodes_hit = domains * (1 - miss_probability(e, e / domains, k))
    nvl = DEEPEP_NVLINK_FRACTION * plateau_bytes_per_s(gpu.intra_node)
    rdma = DEEPEP_RDMA_FRACTION * plateau_bytes_per_s(gpu.inter_node) * group.cluster.nics_per_gpu
    local = per_token * ranks_hit / nvl
    remote = np.where(domains > 1, per_token * nodes_hit / rdma, 0.0)
    return np.where(n > 1, np.maximum(local, remote), 0.0)


def ep_stage_time(cluster: ClusterSpec, model: ModelSpec, dispatcher: str, n_moe, tokens, tp,
                  sp, ep, etp, load, recompute):
    """EP seconds per micro-batch of each stage ((layouts, stages)): dispatch + combine in
    forward and in backward (and the forward again under full recompute) on its MoE layers;
    exposed."""
    if not model.is_moe:
        return np.zeros(np.shape(n_moe))
    one = dispatch_time(cluster, model, dispatcher, tokens, tp, sp, ep, etp, load)
    return n_moe * (one * (4 + 2 * (recompute == 2)))[:, None]


def overlapped_ep_time(ep_time, compute_time):
    """EP seconds left exposed per micro-batch when the dispatch and combine of one
    micro-batch run under another's compute (JobSpec.moe_ep_overlap): max(0, EP - compute).
    Megatron-Core overlap_moe_expert_parallel_comm ("Overlap EP A2A communications with
    independent computations of different micro-batches in 1f1b phase of pipelining or
    non-pipelining schedule", megatron/core/model_parallel_config.py); NVIDIA's recipes turn
    it on per model and GPU (Megatron-Bridge scripts/performance/configs/*/
    *_workload_base_configs.py moe_a2a_overlap, e.g. v0.5.0 QWEN3_235B_A22B_PRETRAIN_CONFIG_
    GB300_FP8_MX_V2; src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py at 067f987)."""
    return np.maximum(np.asarray(ep_time) - np.asarray(compute_time), 0.0)


def dispatch_buffer_bytes(model: ModelSpec, dispatcher: str, tokens, tp, sp, ep, etp, load):
    """Bytes of the dispatcher's send + receive buffers on the most loaded rank (0 when neither
    ep nor etp splits the experts): the routed copies (gathered over etp) or, for allgather,
    every token of the tp_ep group."""
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    if not model.is_moe:
        return np.zeros(np.shape(ep))
    if dispatcher == "allgather":
        buf = token_bytes(model, tokens, tp, sp) * (1 + ep * etp)
    else:
        buf = routed_copy_bytes(model, tokens, tp, sp) * load * (1 + etp)
    return np.where((ep > 1) | (etp > 1), buf, 0.0)


def routed_activation_extra(model: ModelSpec, precision: str, tp, etp, load, recompute):
    """Stored bytes per local token of one MoE layer beyond memory.layer_activation's mean-load
    count with expert-TP = tp: the routed copies' hidden tensors scale with the load, their
    inputs with the load times etp / tp (gathered over the expert-TP group, not split by TP).
    Nothing stays under full recompute or offload (the caller's working set)."""
    tp = np.asarray(tp, dtype=float)
    if not model.is_moe:
        return np.zeros(np.shape(tp))
    from planner.costmodel.memory import FP8_SAVED_INPUT_BYTES

    lin = FP8_SAVED_INPUT_BYTES if precision == "fp8" else 2
    k, ffn, h = model.num_experts_per_tok, model.expert_ffn, model.hidden_size
    hidden = k * ((4 if model.activation == "swiglu" else 2) * ffn + lin * ffn)
    inputs = k * lin * h
    extra = (hidden * (load - 1.0) + inputs * (load * etp - 1.0)) / tp
    return np.where(np.asarray(recompute) >= 2, 0.0, extra)

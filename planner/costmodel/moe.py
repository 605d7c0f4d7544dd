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
# Per-expert load imbalance under the auxiliary load-balancing loss: MaxVio = max_i load_i /
# mean load - 1, measured 0.72 (1B) and 0.52 (3B) on held-out data, 0.04 with the loss-free
# bias (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts",
# arXiv 2408.15664, Table 1). The larger model's value; its spread (0.04 .. 0.72) is why the
# MoE step-time band is wide.
EXPERT_MAX_VIOLATION = 0.52
# DeepEP (deepseek-ai/DeepEP docs/legacy.md at 0297fc8, "Normal kernels with NVLink and RDMA
# forwarding", H800 with ~160 GB/s NVLink and one CX7 400 Gb/s NIC of ~50 GB/s per GPU, 4096
# tokens, hidden 7168, top-8): intranode EP 8 dispatch 153 GB/s, combine 158 GB/s of the
# ~160 -> 0.97 of the scale-up busbw plateau; internode EP 16/32/64 dispatch 43/58/51 GB/s,
# combine 43/57/50 GB/s of ~50 -> 1.01 of the NIC (NVLink forwarding deduplicates copies bound
# for one node, so the RDMA leg can beat the plain NIC rate).
DEEPEP_NVLINK_FRACTION = (153 + 158) / 2 / 160
DEEPEP_RDMA_FRACTION = (43 + 58 + 51 + 43 + 57 + 50) / 6 / 50


def load_factor(model: ModelSpec, ep, capacity_factor: float | None):
    """Routed copies on the most loaded EP rank over the mean (per layout). A rank's E/ep
    experts average their independent excesses: 1 + EXPERT_MAX_VIOLATION / sqrt(E/ep) (the
    independence is this model's assumption); a capacity factor c caps it at c (tokens beyond
    are dropped; c < 1 drops some even on average). 1 for dense models."""
    ep = np.asarray(ep, dtype=float)
    if not model.is_moe:
        return np.ones_like(ep)
    imbalance = 1.0 + EXPERT_MAX_VIOLATION / np.sqrt(model.num_experts / ep)
    return imbalance if capacity_factor is None else np.minimum(imbalance, capacity_factor)


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
        return deepep_time(comm.Group(cluster, ep * etp, 1), copies)
    a2a = comm.all_to_all_time(comm.Group(cluster, ep, etp), copies)
    return a2a + comm.all_gather_time(comm.Group(cluster, etp, 1), copies * etp)


def deepep_time(group, nbytes):
    """Seconds of one DeepEP dispatch where each rank sends `nbytes`, 1/n to each peer: the
    share for its own domain at DEEPEP_NVLINK_FRACTION of the scale-up plateau, the rest at
    DEEPEP_RDMA_FRACTION of its NICs', the two legs in parallel (the slower one counts)."""
    from planner.costmodel.comm import plateau_bytes_per_s

    gpu = group.cluster.gpu
    n = np.maximum(group.size, 1.0)
    nvl = DEEPEP_NVLINK_FRACTION * plateau_bytes_per_s(gpu.intra_node)
    rdma = DEEPEP_RDMA_FRACTION * plateau_bytes_per_s(gpu.inter_node) * gpu.nics_per_gpu
    local = nbytes * (group.per_domain - 1) / n / nvl
    remote = nbytes * (n - group.per_domain) / n / rdma
    return np.where(group.size > 1, np.maximum(local, remote), 0.0)


def ep_stage_time(cluster: ClusterSpec, model: ModelSpec, dispatcher: str, n_moe, tokens, tp,
                  sp, ep, etp, load, recompute):
    """EP seconds per micro-batch of each stage ((layouts, stages)): dispatch + combine in
    forward and in backward (and the forward again under full recompute) on its MoE layers;
    exposed."""
    if not model.is_moe:
        return np.zeros(np.shape(n_moe))
    one = dispatch_time(cluster, model, dispatcher, tokens, tp, sp, ep, etp, load)
    return n_moe * (one * (4 + 2 * (recompute == 2)))[:, None]


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

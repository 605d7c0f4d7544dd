"""Collective and point-to-point times (alpha-beta, vectorized over layouts).

Convention (the one nccl-tests reports, docs/hardware.md 2.2): busbw is the per-GPU,
per-direction bus bandwidth, and for a collective on n ranks

    all-reduce of S bytes:           each rank moves 2 S (n-1)/n  -> t = 2 S (n-1)/n / busbw
    all-gather / reduce-scatter (S = the full buffer): S (n-1)/n  -> t = S (n-1)/n / busbw
    all-to-all (S = one rank's send buffer):           S (n-1)/n  -> t = S (n-1)/n / busbw

(ring algorithm volumes, Patarasuk & Yuan 2009; seed 000/001: 2 S (N-1)/N per GPU).
busbw(S) is read from the profile's measured curve at the message size. The curves are
end to end (nccl-tests timings, latency included) at a reference group: one full node for the
intra-node curve (gpus_per_node ranks), two nodes for the inter-node one. Larger groups add
NCCL's per-step ring latency (tuning.cc, docs/hardware.md 2.4) for the ring steps beyond the
reference: 2(n-1) steps for an all-reduce on n ranks, of which 2(k-1) cross the network on k
domains. base_latency_us is already inside the curves and is charged only to point-to-point
sends, which are alpha-beta: base + one hop latency + S / the curve's plateau (p2p copies reach
~90% of the link, docs/hardware.md 2.2, close to the all-reduce plateau).

Tiers. A group stays on the scale-up fabric when all its members sit in one NVLink domain
(cluster.domain_gpus; 8 on a DGX, 72 on NVL72) and uses the intra-node curve. Otherwise it is
network-bound. The profile's inter-node curve is the per-GPU NIC tier (busbw when every ring
step crosses a NIC, ~24 GB/s on HDR); a group with g members per domain runs hierarchically
(NCCL: reduce-scatter inside the domain, all-reduce across domains on g NICs in parallel, each
carrying S/g, all-gather inside), so its busbw is min(intra(S), g x nics_per_gpu x inter(S/g)).
For g = 8 on DGX A100 that is 8 x 24 = 192 GB/s, the measured multi-node busbw (nccl #1576).
Point-to-point across domains uses one NIC.

Algorithm choice (all-reduce across domains). NCCL predicts each algorithm's time with its own
alpha-beta model and runs the fastest (NVIDIA/nccl src/graph/tuning.cc, master 5067397,
2026-06: ncclTopoTuneModel, ncclTopoGetAlgoTime); the model does the same for ring and tree:
- ring: as above, and the multi-node ring Simple all-reduce's latency is multiplied by 1.4 on
  sm80+ GPUs once each rank's chunk per channel reaches 64 B ("Plateau effect of ring"), so
  the latency beyond the reference ring is;
- tree (double binary tree): latency 2((ppn-1) intra + log2(nodes) inter), i.e. logarithmic in
  the domains spanned; beyond the reference (2 domains, whose ppn part is in the curve) that is
  2 (floor(log2 k) - 1) x 14 us (hwLatencies[NET][TREE][SIMPLE]); bandwidth 0.92 x the ring's
  busbw (busBw * .92 for tree all-reduce) x treeCorrectionFactor[SIMPLE] at the message size
  (NCCL's static correction for medium sizes, powers of two from 64 B).
With many domains and many small buckets the tree wins (latency); with large buckets the ring.

All-gather and reduce-scatter (ZeRO / FSDP, SP): NCCL runs them as a ring of n - 1 steps (no
tree, no multi-node NVLS without CollNet) with the latency above, no plateau factor (it is the
all-reduce's only). A group with one member per domain (the DP group of a tp = 8 layout on 8-GPU
nodes) may take PAT instead: latency log2(k) x the network hop / 3.5 + 2.8 us per rank, at 0.75
of the ring's busbw; NCCL takes the faster, and so does the model (small messages over many
nodes take PAT, large ones the ring).
"""

from __future__ import annotations

import numpy as np

from planner.specs import ClusterSpec, LinkProfile

US = 1e-6  # microseconds -> seconds

# NCCL tuning model constants (NVIDIA/nccl src/graph/tuning.cc, master 5067397, 2026-06)
RING_PLATEAU_FACTOR = 1.4  # ncclTopoGetAlgoTime: "Plateau effect of ring", minCompCap >= 80
RING_PLATEAU_CHUNK_BYTES = 64 * 64  # nBytes / (nChannels * nRanks) >= 64, at MAXCHANNELS 64
TREE_NET_LATENCY_US = 14.0  # hwLatencies[NET][TREE][SIMPLE]
TREE_BW_FACTOR = 0.92  # ncclTopoTuneModel: tree all-reduce busBw * .92
# PAT (all-gather / reduce-scatter with one GPU per node, NCCL >= 2.23; ncclPatEnable: nNodes ==
# nRanks): latency log2(nNodes) x interLat / 3.5 + nRanks x 2.8 us, busBw x .75 (ncclTopoTuneModel)
PAT_LOG_DIVISOR = 3.5
PAT_LINEAR_US = 2.8
PAT_BW_FACTOR = 0.75
# treeCorrectionFactor[NCCL_PROTO_SIMPLE][log2(bytes / 64)], 64 B .. 512 MiB; 1 beyond
TREE_CORRECTION_SIMPLE = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8,
                          .7, .7, .8, .9, .9)


def members_per_domain(size, stride, domain: int):
    """Members of one group inside one scale-up domain, for a group of `size` ranks spaced
    `stride` apart under the rank order of planner.layout (vectorized group_span_nodes)."""
    size = np.asarray(size)
    per = np.maximum(domain // np.maximum(stride, 1), 1)
    return np.minimum(per, size)


class Group:
    """Process groups along one axis, one per layout: `size` ranks spaced `stride` apart.
    Holds what every collective on it needs (members per domain, domains spanned, latencies)."""

    def __init__(self, cluster: ClusterSpec, size, stride) -> None:
        gpu = cluster.gpu
        self.cluster = cluster
        self.size = np.asarray(size, dtype=float)
        self.per_domain = members_per_domain(self.size, stride, cluster.domain_gpus).astype(float)
        self.domains = np.ceil(self.size / self.per_domain)
        self.crosses = self.domains > 1
        n = np.maximum(self.size, 1.0)
        self.frac = (n - 1) / n  # (n-1)/n of the ring volumes
        self._ref_ranks = gpu.gpus_per_node  # the intra-node curve's reference ring
        self._intra_lat = gpu.intra_node.latency_us * US
        self._inter_lat = gpu.inter_node.latency_us * US
        self._latency_cache: dict[int, np.ndarray] = {}
        # rings across k > 2 domains on a fabric that slows them (LinkProfile field; None: none)
        slow = gpu.inter_node.ring_slowdown_per_domain or 0.0
        self.ring_slowdown = 1.0 + slow * np.maximum(self.domains - 2.0, 0.0)

    def latency(self, steps_per_rank: int):
        """Seconds of ring latency beyond what the reference curves already contain, for a
        collective with steps_per_rank x (n-1) ring steps (2 for all-reduce, 1 otherwise)."""
        cached = self._latency_cache.get(steps_per_rank)
        if cached is None:
            cached = self._latency_cache[steps_per_rank] = self._ring_latency(steps_per_rank)
        return cached

    def _ring_latency(self, steps_per_rank: int):
        inter = steps_per_rank * (self.domains - 1)
        intra = steps_per_rank * (self.size - 1) - inter
        extra_intra = np.maximum(intra - steps_per_rank * (self._ref_ranks - 1), 0.0)
        extra_inter = np.maximum(inter - steps_per_rank * 1, 0.0)  # reference: two domains
        return extra_intra * self._intra_lat + extra_inter * self._inter_lat

    def busbw(self, nbytes, gather: bool = False):
        """Achieved busbw (bytes/s) of a collective of `nbytes` on this group; `gather`: an
        all-gather or reduce-scatter, whose NVLink part runs without the switch reduction
        that accelerates the all-reduce curve (LinkProfile.gather_busbw_ratio)."""
        gpu = self.cluster.gpu
        intra = gpu.intra_node.busbw_bytes_per_s(nbytes, gather)
        if not self.crosses.any():
            return intra * np.ones_like(self.size)
        nics = self.per_domain * self.cluster.nics_per_gpu
        inter = gpu.inter_node.busbw_bytes_per_s(np.asarray(nbytes) / self.per_domain) * nics
        return np.where(self.crosses, np.minimum(intra, inter), intra)


def tree_correction(nbytes):
    """NCCL's tree bandwidth correction (Simple protocol) at a message of `nbytes`."""
    log_size = np.floor(np.log2(np.maximum(np.asarray(nbytes, dtype=float), 64.0) / 64.0))
    table = np.array(TREE_CORRECTION_SIMPLE)
    idx = np.clip(log_size, 0, len(table) - 1).astype(int)
    return np.where(log_size < len(table), table[idx], 1.0)


def all_reduce_time(group: Group, nbytes, calls=1):
    """Seconds for `calls` all-reduces of `nbytes` each (0 on a group of one): the ring, or
    across domains the faster of ring and tree as NCCL chooses (module docstring)."""
    nbytes = np.asarray(nbytes, dtype=float)
    wire = 2.0 * nbytes * group.frac / group.busbw(nbytes)
    ring_lat = group.latency(2)
    if group.crosses.any():
        plateau = group.crosses & (nbytes >= RING_PLATEAU_CHUNK_BYTES * group.size)
        ring_lat = ring_lat * np.where(plateau, RING_PLATEAU_FACTOR, 1.0)
        ring = wire * group.ring_slowdown + ring_lat
        levels = np.floor(np.log2(np.maximum(group.domains, 1.0)))
        tree_lat = 2.0 * np.maximum(levels - 1.0, 0.0) * TREE_NET_LATENCY_US * US
        tree = wire / (TREE_BW_FACTOR * tree_correction(nbytes)) + tree_lat
        t = np.where(group.crosses, np.minimum(ring, tree), ring)
    else:
        t = wire + ring_lat
    return np.where(group.size > 1, t * calls, 0.0)


def all_gather_time(group: Group, nbytes, calls=1):
    """Seconds for `calls` all-gathers (or reduce-scatters) whose full buffer is `nbytes`: the
    ring (n - 1 steps), or with one member per domain the faster of the ring and NCCL's PAT
    (module docstring). NCCL runs no tree for these, and no NVLS once the group leaves the node
    without CollNet (tuning.cc: busBw = 0)."""
    wire = nbytes * group.frac / group.busbw(nbytes, gather=True) * group.ring_slowdown
    t = wire + group.latency(1)
    pat = group.crosses & (group.per_domain == 1)
    if pat.any():
        n = np.maximum(group.size, 2.0)
        pat_lat = (np.log2(n / 2.0) * group.cluster.gpu.inter_node.latency_us / PAT_LOG_DIVISOR
                   + (n - 2.0) * PAT_LINEAR_US) * US  # beyond the 2-rank reference
        t = np.where(pat, np.minimum(t, wire / PAT_BW_FACTOR + pat_lat), t)
    return np.where(group.size > 1, t * calls, 0.0)


reduce_scatter_time = all_gather_time  # same volume and steps per rank (ring)


def all_to_all_time(group: Group, nbytes, calls=1):
    """Seconds for `calls` all-to-alls where each rank sends `nbytes` in all, 1/n to each peer.

    Inside one domain: S (n-1)/n over the intra-node busbw. Across domains nothing aggregates
    (unlike a reduction), so the S (n-g)/n bound for other domains leaves through the rank's own
    NICs while S (g-1)/n moves on NVLink at the same time: the slower of the two."""
    gpu = group.cluster.gpu
    n = np.maximum(group.size, 1.0)
    intra = gpu.intra_node.busbw_bytes_per_s(nbytes)
    local = nbytes * (group.per_domain - 1) / n / intra
    if group.crosses.any():
        nic = gpu.inter_node.busbw_bytes_per_s(nbytes) * group.cluster.nics_per_gpu
        remote = nbytes * (n - group.per_domain) / n / nic
        t = np.where(group.crosses, np.maximum(local, remote), local)
    else:
        t = local
    t = t + group.latency(1)
    return np.where(group.size > 1, t * calls, 0.0)


def plateau_bytes_per_s(link: LinkProfile) -> float:
    """The highest busbw of a link's curve (large messages), bytes/s."""
    return max(y for _, y in link.busbw_gb_per_s.points) * 1e9


def p2p_time(cluster: ClusterSpec, nbytes, crosses_nodes, calls=1):
    """Seconds for `calls` point-to-point sends of `nbytes` (pipeline stage boundaries, CP ring),
    on the NVLink fabric or on one NIC."""
    gpu = cluster.gpu
    intra = plateau_bytes_per_s(gpu.intra_node)
    inter = plateau_bytes_per_s(gpu.inter_node) * cluster.nics_per_gpu
    bw = np.where(crosses_nodes, min(intra, inter), intra)
    lat = (
        np.where(
            crosses_nodes,
            gpu.inter_node.base_latency_us + gpu.inter_node.latency_us,
            gpu.intra_node.base_latency_us + gpu.intra_node.latency_us,
        )
        * US
    )
    return (nbytes / bw + lat) * calls


# ---- per-stage communication terms (arrays of shape (layouts, candidate stages)) -------------
# Megatron DDP gradient buckets: max(40M, 1M x dp) elements (distributed.DistributedDataParallel
# bucket_size default); the bucket sets the message size the busbw curve is read at.
DP_BUCKET_ELEMENTS = 40e6
_COL = (slice(None), None)  # broadcast a per-layout (N,) array against (N, C) stage arrays


def tp_stage_time(cluster: ClusterSpec, model, stages, tokens, tp, sp, recompute,
                  dense_gemm, moe_gemm, tp_comm_overlap: bool = False):
    """TP seconds per micro-batch of each stage, and of one activation collective per layout.

    2 all-reduces (or AG + RS with SP) per layer in forward, 2 in backward, 2 more when full
    recompute re-runs the forward (Korthikanti 2022 sec. 4.2.2); one for the vocab-parallel
    embedding (forward AR, or RS + AG in backward with SP) and one for the LM head (backward AR
    of its input grad, or AG forward + RS backward with SP) (Megatron). SP stores the norm
    outputs sharded, so backward all-gathers them again before the QKV and MLP weight gradients
    (Calculon's seq_par_ag_redo); full recompute already re-runs those all-gathers. Exposed
    unless tp_comm_overlap: Transformer Engine userbuffers (Megatron-Core tp_comm_overlap, SP
    only) split each all-gather / reduce-scatter into tp chunks pipelined against the GEMM it
    feeds or drains (forward: QKV, out-proj, FC1, FC2; backward: dgrad/wgrad, 2x the forward
    GEMM time); exposed is what the GEMMs cannot cover, and at least one chunk (1/tp), the
    pipeline's fill (TE userbuffers ring-exchange design)."""
    col, st, rc = _COL, stages, recompute
    act_bytes = tokens * model.hidden_size * 2
    tp_group = Group(cluster, tp, 1)
    ar = all_reduce_time(tp_group, act_bytes)
    agrs = all_gather_time(tp_group, act_bytes) + reduce_scatter_time(tp_group, act_bytes)
    tp_one = np.where(sp, agrs, ar)
    ag_redo = np.where(sp & (rc != 2), 2 * all_gather_time(tp_group, act_bytes), 0.0)
    tp_per_layer = tp_one * (4 + 2 * (rc == 2)) + ag_redo
    if tp_comm_overlap:
        def exposed(comm_s: np.ndarray, gemm_s: np.ndarray) -> np.ndarray:
            return np.maximum(comm_s / tp, comm_s - gemm_s)

        def overlapped(gemm_fwd: np.ndarray) -> np.ndarray:
            fwd_x = exposed(2 * tp_one, gemm_fwd)
            return fwd_x * (1 + (rc == 2)) + exposed(2 * tp_one + ag_redo, 2 * gemm_fwd)

        on = sp & (tp > 1)
        tp_dense = np.where(on, overlapped(dense_gemm), tp_per_layer)
        tp_moe = np.where(on, overlapped(moe_gemm), tp_per_layer) if model.is_moe else tp_dense
    else:
        tp_dense = tp_moe = tp_per_layer
    tp_mb = (
        st["n_dense"] * tp_dense[col]
        + st["n_moe"] * tp_moe[col]
        + (st["emb"] + st["head"] + st["mtp"]) * tp_one[col]
    )
    return tp_mb, tp_one


def cp_stage_time(cluster: ClusterSpec, model, layers, tokens, tp, cp, recompute,
                  attention_s, attention_backward_factor: float):
    """CP seconds per micro-batch of each stage: ring exchange of K and V blocks, (cp-1) sends in
    forward, K,V and dK,dV in backward, overlapped with the attention core where it is longer
    (Transformer Engine's ring attention). K, V heads split over TP (replicated once tp > kv
    heads); MLA's latent is not split."""
    rc = recompute
    kv_w = (
        ((model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0))
        if model.is_mla
        else 2 * model.kv_heads * model.head_size
    )
    kv_bytes = tokens * kv_w * 2 / (1.0 if model.is_mla else np.minimum(tp, model.kv_heads))
    cp_cross = Group(cluster, cp, tp).crosses
    cp_send = p2p_time(cluster, kv_bytes, cp_cross) * (cp - 1)
    cp_fwd = np.maximum(cp_send - attention_s, 0.0)
    cp_bwd = np.maximum(2 * cp_send - attention_backward_factor * attention_s, 0.0)
    cp_layer = np.where(cp > 1, cp_fwd * (1 + (rc == 2)) + cp_bwd, 0.0)
    return layers * cp_layer[_COL]


def pp_send_time(cluster: ClusterSpec, model, tokens, tp, pp, dp, cp, sp,
                 crosses=None, scatter_gather: bool = False):
    """Seconds of one pipeline send: a micro-batch's (SP-sharded) 16-bit activation to the
    next stage, across nodes when the PP group leaves the NVLink domain (or `crosses`).
    `scatter_gather` (JobSpec.p2p_scatter_gather): without SP each TP rank sends only its 1/tp
    of the tensor and the receiver all-gathers the whole over its TP group before using it
    (DeepSpeed runtime/pipe/engine.py, PartitionedTensor over the slice-parallel group;
    Megatron-LM's scatter_gather_tensors_in_pipeline, Narayanan 2021 sec. 4.1): a send of
    1/tp, then that all-gather."""
    act_bytes = tokens * model.hidden_size * 2
    split = sp | (scatter_gather & (tp > 1))
    p2p_bytes = act_bytes / np.where(split, tp, 1.0)
    if crosses is None:
        crosses = Group(cluster, pp, tp * cp * dp).crosses
    send = p2p_time(cluster, p2p_bytes, crosses)
    if not scatter_gather:
        return send
    gather = all_gather_time(Group(cluster, tp, 1), act_bytes)
    return send + np.where(split & ~np.asarray(sp, dtype=bool), gather, 0.0)


def pp_p2p_time(cluster: ClusterSpec, model, tokens, tp, pp, dp, cp, vpp, sp, m,
                stage_mb_s, p2p_overlap: bool = True, crosses=None,
                scatter_gather: bool = False):
    """Pipeline send/receive seconds per step, per layout: 2 sends per micro-batch chunk and per
    fill/drain hop. Interleaved 1F1B with overlap_p2p_comm runs the steady-state sends behind
    the next chunk's compute (a chunk = 1/vpp of the stage's micro-batch time, stage_mb_s);
    the pp - 1 fill and drain hops stay exposed. Plain 1F1B / GPipe block on every send
    (Megatron-Core). `crosses` overrides whether the sends leave the node (pools joined by the
    network); `scatter_gather`: pp_send_time's."""
    p2p_one = pp_send_time(cluster, model, tokens, tp, pp, dp, cp, sp, crosses, scatter_gather)
    chunk_s = stage_mb_s / vpp
    p2p_hidden = 2 * (pp - 1) * p2p_one + 2 * m * vpp * np.maximum(p2p_one - chunk_s, 0.0)
    p2p_blocking = 2 * (m * vpp + pp - 1) * p2p_one
    return np.where(pp > 1, np.where(p2p_overlap & (vpp > 1), p2p_hidden, p2p_blocking), 0.0)


def dp_traffic_time(group: Group, params, zero, grad_bytes, unit_bytes,
                    bucket_mb: float | None = None, zero1_all_reduce: bool = False):
    """(per-step, per-micro-batch, parameter gather) seconds of the data-parallel traffic for
    `params` local parameters: ZeRO 0 all-reduces the gradients, 1 reduce-scatters them, 1-2
    all-gather the updated parameters (the third value, also inside per-step), 2
    reduce-scatters per micro-batch, 3 gathers each unit (one layer's 16-bit params,
    `unit_bytes`) in forward and backward and reduce-scatters its gradients. Gradients go in
    buckets of `bucket_mb` MiB of 16-bit gradients (JobSpec.dp_bucket_mb; torch DDP counts
    bucket_cap_mb in the parameters' dtype, and nanotron's fp32 accumulator hook reduces the
    same parameters' fp32 buffer) or Megatron's; the parameter gather keeps Megatron's.
    zero1_all_reduce (JobSpec.zero1_grad_all_reduce): ZeRO-1 reduces its gradients with
    zero1_blocking_time's one all-reduce instead, which the caller charges: no reduce-scatter
    here."""
    bucket = np.maximum(DP_BUCKET_ELEMENTS, 1e6 * group.size)
    calls = np.maximum(np.ceil(params / bucket), 1.0)
    elems = np.minimum(params, bucket)
    msg_grad, msg_param = elems * grad_bytes, elems * 2.0
    if bucket_mb is not None:
        g_bucket = bucket_mb * 2.0**20 / 2.0
        calls_g = np.maximum(np.ceil(params / g_bucket), 1.0)
        msg_grad = np.minimum(params, g_bucket) * grad_bytes
    else:
        calls_g = calls
    per_step = np.where(zero == 0, all_reduce_time(group, msg_grad, calls_g), 0.0)
    z1 = zero == 1
    if z1.any() and not zero1_all_reduce:
        per_step = per_step + np.where(z1, reduce_scatter_time(group, msg_grad, calls_g), 0.0)
    gather = np.where((zero == 1) | (zero == 2), all_gather_time(group, msg_param, calls), 0.0)
    per_step = per_step + gather
    per_mb = np.where(zero == 2, reduce_scatter_time(group, msg_grad, calls_g), 0.0)
    z3 = zero == 3
    if z3.any():
        t_unit, units = zero3_unit_time(group, params, unit_bytes)
        per_mb = per_mb + np.where(z3, 3 * t_unit * units, 0.0)  # AG fwd + AG bwd + RS grads
    return per_step, per_mb, gather


def zero1_blocking_time(group: Group, params, zero, grad_bytes):
    """Seconds per step of a ZeRO-1 gradient reduction that waits for the whole backward: one
    all-reduce of the `params` local gradients (`grad_bytes` each) in a single call, on the
    ZeRO-1 layouts (0 elsewhere). nanotron with accumulate_grad_in_fp32 and zero_stage > 0
    does not wrap the model in DDP (trainer.py `make_ddp = dp > 1 and not
    (accumulate_grad_in_fp32 and zero_stage > 0)`), so no hook reduces during the backward;
    after it, `sync_gradients_across_dp(..., reduce_scatter=False)` runs
    `dist.all_reduce(self._contiguous_fp32_grad_buffer)` (optim/gradient_accumulator.py),
    synchronously ("TODO: This is too memory hungry, instead we run all_reduce"); nanotron @
    0e0a27e, the sweep's commit, and 67c5ebb6 of its benchmark branch read the same."""
    one = all_reduce_time(group, np.asarray(params, dtype=float) * grad_bytes)
    return np.where(np.asarray(zero) == 1, one, 0.0)


def zero3_unit_time(group: Group, params, unit_bytes):
    """(seconds of one unit's all-gather, units on the stage) for ZeRO-3 / FSDP: a unit is one
    layer's 16-bit parameters on this GPU (`unit_bytes`), gathered over the DP group; its
    gradients' reduce-scatter moves the same bytes in the same ring steps (dp_traffic_time)."""
    params2 = np.asarray(params, dtype=float) * 2.0
    units = np.maximum(np.ceil(params2 / np.maximum(unit_bytes, 1.0)), 1.0)
    return all_gather_time(group, np.minimum(unit_bytes, params2)), units


def zero3_exposed_floor(t_unit, units, m, forward_s, recompute_s, backward_s):
    """Seconds per step of ZeRO-3 / FSDP traffic that no overlap can hide, with one unit
    prefetched (in flight) at a time, `units` equal units per stage and `m` micro-batches.

    Forward: unit i+1's all-gather runs beside unit i's forward (FSDP's implicit forward
    prefetch on its own stream: "the 1st all-gather will not be able to overlap with anything",
    PyTorch docs notes/fsdp.rst "FSDP Prefetch Nuances"; DeepSpeed ZeRO-3 prefetches the next
    module), so the first unit's gather waits in full and every later one waits for what it
    exceeds its predecessor's forward by.
    Backward: the gathers are redone (reshard_after_forward, FSDP2's default and DeepSpeed
    ZeRO-3's release of gathered params) and each unit's gather of the next unit and the
    reduce-scatter of the previous unit's gradients share the network beside its backward (and
    recompute): what 2 t_unit exceeds that by waits; the last reduce-scatter (the first layer's
    gradients) has no backward left to hide behind. The backward's first gather is not counted:
    torchtitan keeps the last block gathered after forward (reshard_after_forward False for it,
    torchtitan llama3 parallelize.apply_fsdp), and the others prefetch it at the end of forward.
    All of it repeats per micro-batch: FSDP2 and DeepSpeed ZeRO-3 gather and reduce-scatter on
    every micro-batch under gradient accumulation (FSDP2 "offers (1) [reduce-scatter per
    microbatch] without any intervention", set_requires_gradient_sync(False) keeps unsharded
    gradients instead: pytorch/pytorch PR #126166); Megatron-FSDP (optim_grads_params)
    likewise, with overlap_grad_reduce / overlap_param_gather (Megatron-Core
    DistributedDataParallelConfig)."""
    units = np.maximum(units, 1.0)
    fwd_u = np.asarray(forward_s) / units
    bwd_u = (np.asarray(backward_s) + np.asarray(recompute_s)) / units
    per_mb = 2.0 * t_unit + (units - 1.0) * (
        np.maximum(t_unit - fwd_u, 0.0) + np.maximum(2.0 * t_unit - bwd_u, 0.0))
    return m * per_mb


def dp_exposed_time(per_step, per_mb, m, zero, forward_s, recompute_s, backward_s,
                    dp_overlap: float, grad_overlap: bool = True, gather=0.0,
                    param_overlap: bool = True, floor=0.0, blocking=0.0):
    """Seconds per step of DP traffic left exposed. What can hide: per-step reductions behind the
    last micro-batch's backward (and the distributed optimizer's param all-gather behind the
    next forward: Megatron overlap_grad_reduce / overlap_param_gather); per-micro-batch
    traffic behind all of them; at most the profile's dp_overlap fraction of it.

    Without param_overlap (JobSpec.param_gather_overlap False) the ZeRO-1/2 parameter
    all-gather (`gather`, part of per_step) runs after the optimizer step, all of it exposed,
    and a ZeRO-1 gradient reduce-scatter hides only behind the last backward, as ZeRO 0's
    all-reduce does (nanotron: DDP hook per bucket during the backward, then
    ZeroDistributedOptimizer.step -> _all_gather_params; optim/zero.py @ 0e0a27e).

    `floor` (seconds per step) is what cannot hide whatever the overlap: ZeRO-3's first gather
    and last reduce-scatter per micro-batch and each unit's excess over its compute
    (zero3_exposed_floor); the exposed time is at least that. `blocking` (seconds per step,
    part of per_step) runs after the backward with nothing beside it (zero1_blocking_time):
    always exposed."""
    hide_fwd = 1.0 if param_overlap else 0.0
    window = np.select(
        [zero <= 0, zero == 1],
        [backward_s, backward_s + hide_fwd * (forward_s + recompute_s)],
        default=m * (forward_s + recompute_s + backward_s),
    )
    dp_total = per_step + m * per_mb
    if not grad_overlap:
        return dp_total
    if param_overlap:
        hidable = dp_total - blocking
        exposed = np.maximum((1 - dp_overlap) * hidable, hidable - window) + blocking
    else:
        hidable = dp_total - gather - blocking
        exposed = np.maximum((1 - dp_overlap) * hidable, hidable - window) + gather + blocking
    return np.minimum(np.maximum(exposed, floor), dp_total)

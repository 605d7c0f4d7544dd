"""estimate_batch: the plan columns of many layouts at once (numpy over layouts).

Assembly of the terms in memory.py, compute.py, comm.py and pipeline.py. Per layout it builds the
candidate stages of its (pp, vpp) split (pipeline.stage_features), evaluates memory and
per-micro-batch time on each, and reports the most loaded GPU's memory and the slowest stage's
time. Step time (seconds per optimizer step), with m = grad_accum micro-batches per DP rank:

    step = m x (compute + tp + cp + ep comm per micro-batch of the slowest stage)
         + bubble ((pp-1)/vpp x that stage's per-micro-batch time when m >= pp, Narayanan
           2021; pipeline.bubble_slots for m < pp)
         + pipeline p2p (2 sends per micro-batch chunk and per fill/drain hop; only the
           fill/drain hops when interleaving overlaps them, JobSpec.p2p_overlap)
         + exposed DP communication + optimizer step + profile.step_overhead_s

TP traffic is exposed unless JobSpec.tp_comm_overlap (then only what the GEMMs it is
pipelined with cannot cover, and at least one chunk in tp). The overhead is folded into
time_optimizer_s so the contract's time_* columns add up to step_time_s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from planner.costmodel import comm, compute, memory, pipeline
from planner.layout import Layout
from planner.specs import GIB, ClusterSpec, JobSpec, ModelSpec

RECOMPUTE_INDEX = {"none": 0, "selective": 1, "full": 2, "offload": 3}
# Activation offload keeps two layers' activations of one micro-batch on the GPU: the one being
# copied out (in) while the next computes (Transformer Engine's CPU offload context double-
# buffers one layer ahead; Megatron-Core cpu_offloading).
OFFLOAD_RESIDENT_LAYERS = 2
LAYOUT_FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp")
# Megatron DDP gradient buckets: max(40M, 1M x dp) elements (distributed.DistributedDataParallel
# bucket_size default); the bucket sets the message size the busbw curve is read at.
DP_BUCKET_ELEMENTS = 40e6
ADAM_BYTES_PER_PARAM = (
    30.0  # read fp32 master, m, v, grad (16 B); write master, m, v (12) + bf16 param (2)
)

_STAGE_CACHE: dict[tuple[int, int, int], tuple[ModelSpec, pipeline.StageFeatures]] = {}


def _features(model: ModelSpec, pp: int, vpp: int) -> pipeline.StageFeatures:
    key = (id(model), pp, vpp)
    hit = _STAGE_CACHE.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    if len(_STAGE_CACHE) > 4096:
        _STAGE_CACHE.clear()
    feats = pipeline.stage_features(model, pp, vpp)
    _STAGE_CACHE[key] = (model, feats)
    return feats


def layout_arrays(layouts: Sequence[Layout] | Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Layouts -> one int array per knob (recompute as 0/1/2, sp as bool). A mapping of arrays
    (the search's own columns) is accepted as is, recompute given as codes or names."""
    if isinstance(layouts, Mapping):
        out = {k: np.asarray(layouts[k]) for k in LAYOUT_FIELDS}
        if out["recompute"].dtype.kind in "UO":
            out["recompute"] = np.vectorize(RECOMPUTE_INDEX.__getitem__, otypes=[int])(
                out["recompute"]
            )
        out["sp"] = out["sp"].astype(bool)
        return {k: (v if k == "sp" else v.astype(np.int64)) for k, v in out.items()}
    rows = np.array(
        [
            (
                lo.tp,
                lo.pp,
                lo.dp,
                lo.cp,
                lo.ep,
                lo.vpp,
                lo.mbs,
                lo.zero,
                RECOMPUTE_INDEX[lo.recompute],
                int(lo.sp),
            )
            for lo in layouts
        ],
        dtype=np.int64,
    ).reshape(-1, len(LAYOUT_FIELDS))
    out = {k: rows[:, i] for i, k in enumerate(LAYOUT_FIELDS)}
    out["sp"] = out["sp"].astype(bool)
    return out


def _gather_stages(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray) -> dict[str, np.ndarray]:
    """(N, C) arrays of candidate-stage features, padded by repeating a layout's first candidate."""
    code = pp.astype(np.int64) * 1024 + vpp.astype(np.int64)  # vpp < 1024 (checked: vpp | layers)
    present = np.flatnonzero(np.bincount(code))
    lookup = np.zeros(present[-1] + 1, dtype=np.int64)
    lookup[present] = np.arange(len(present))
    feats = [_features(model, int(c // 1024), int(c % 1024)) for c in present]
    width = max(len(f.index) for f in feats)
    names = list(pipeline.StageFeatures.__dataclass_fields__)
    table = np.empty((len(names), len(feats), width))
    for g, f in enumerate(feats):
        for i, name in enumerate(names):
            col = getattr(f, name)
            table[i, g, : len(col)] = col
            table[i, g, len(col) :] = col[0]
    stacked = np.take(table, lookup[code], axis=1)  # (F, N, C)
    return {name: stacked[i] for i, name in enumerate(names)}


def estimate_batch(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    layouts: Sequence[Layout] | Mapping[str, Any],
) -> dict[str, np.ndarray]:
    """Plan columns (numeric, non-layout) for each layout, as numpy arrays of equal length.

    Layouts must be structurally valid (checks.layout_violations empty); invalid ones give
    finite but meaningless numbers. Extra keys: step_time_low_s, step_time_high_s,
    peak_stage (pipeline stage of the most loaded GPU), slow_stage, in_flight, model_flops,
    hw_flops."""
    lo = layout_arrays(layouts)
    if len(lo["tp"]) == 0:  # the columns, with no rows
        return {k: v[:0] for k, v in estimate_batch(model, cluster, job, [Layout()]).items()}
    gpu = cluster.gpu
    tp, pp, dp, cp, ep = (lo[k].astype(float) for k in ("tp", "pp", "dp", "cp", "ep"))
    vpp, mbs, zero, rc, sp = (
        lo["vpp"].astype(float),
        lo["mbs"].astype(float),
        lo["zero"],
        lo["recompute"],
        lo["sp"],
    )
    n_layouts = len(tp)
    s, batch = job.seq_len, job.global_batch
    m = np.maximum(batch // np.maximum(lo["mbs"] * lo["dp"], 1), 1).astype(float)
    tokens = mbs * s / cp  # local tokens per micro-batch per rank
    st = _gather_stages(model, lo["pp"], lo["vpp"])  # (N, C)
    col = (slice(None), None)  # broadcast (N,) against (N, C)

    # ---- activation bytes per token of one layer (memory.py), for memory and offload traffic
    kind = job.attention
    keys = s / cp
    flash = kind != "unfused"  # fused kernels (flash, cudnn) keep no s x s tensors
    prec = job.precision  # fp8: Transformer Engine keeps 1-byte GEMM inputs (memory.py)
    layer_d = memory.layer_activation(model, False, precision=prec)
    layer_m = memory.layer_activation(model, True, precision=prec) if model.is_moe else layer_d
    # one layer's activations without recompute (full recompute's working set; offload traffic)
    full_d = memory.full_layer_activation_per_token(layer_d, tp, sp, keys, flash)
    full_m = (
        memory.full_layer_activation_per_token(layer_m, tp, sp, keys, flash)
        if model.is_moe
        else full_d
    )

    # ---- time per micro-batch, per layer kind --------------------------------------------
    dense_t = compute.layer_forward_times(
        model, gpu, job.precision, False, tokens, tp, ep, sp, s, kind
    )
    moe_t = (
        compute.layer_forward_times(model, gpu, job.precision, True, tokens, tp, ep, sp, s, kind)
        if model.is_moe
        else dense_t
    )
    head_t = compute.head_forward_time(model, gpu, job.precision, tokens, tp)
    emb_t = tokens * model.hidden_size * 2 * 2 / gpu.hbm_bytes_per_s  # lookup: read + write rows
    fwd = (
        st["n_dense"] * dense_t.total[col]
        + st["n_moe"] * moe_t.total[col]
        + st["head"] * head_t[col]
        + st["emb"] * emb_t[col]
    )
    layers = st["n_dense"] + st["n_moe"]
    attn_core = st["n_dense"] * dense_t.attention[col] + st["n_moe"] * moe_t.attention[col]
    layer_fwd = st["n_dense"] * dense_t.total[col] + st["n_moe"] * moe_t.total[col]
    recomp = np.where((rc == 1)[col], attn_core, 0.0) + np.where((rc == 2)[col], layer_fwd, 0.0)
    attn_bwd = compute.attention_backward_factor(kind)
    bwd = compute.backward_time(fwd, attn_core, kind)
    # host-side launch / dispatch time of each layer pass (profile.layer_overhead_us, fitted by
    # calibrate; 0 in the stock profiles): forward 1, backward 2, full recompute 1 more
    passes = 3.0 + (rc == 2)
    compute_mb = fwd + bwd + recomp + layers * (gpu.layer_overhead_us * 1e-6 * passes)[col]
    if gpu.host_link_gb_per_s is not None and (rc == 3).any():
        # offload: each layer's activations go to host memory in forward and come back in
        # backward over the host link, behind that layer's compute where they are shorter
        link = gpu.host_link_gb_per_s * 1e9

        def offload_exposed(t: compute.LayerTimes, per_token: np.ndarray) -> np.ndarray:
            copy = tokens * per_token / link
            layer_bwd = compute.backward_time(t.total, t.attention, kind)
            return np.maximum(copy - t.total, 0.0) + np.maximum(copy - layer_bwd, 0.0)

        off = (st["n_dense"] * offload_exposed(dense_t, full_d)[col]
               + st["n_moe"] * offload_exposed(moe_t, full_m)[col])
        compute_mb = compute_mb + np.where((rc == 3)[col], off, 0.0)

    # TP: 2 all-reduces (or AG + RS with SP) per layer in forward, 2 in backward, 2 more when
    # full recompute re-runs the forward (Korthikanti 2022 sec. 4.2.2); one for the
    # vocab-parallel embedding (forward AR, or RS + AG in backward with SP) and one for the LM
    # head (backward AR of its input grad, or AG forward + RS backward with SP) (Megatron).
    act_bytes = tokens * model.hidden_size * 2
    tp_group = comm.Group(cluster, tp, 1)
    ar = comm.all_reduce_time(tp_group, act_bytes)
    agrs = comm.all_gather_time(tp_group, act_bytes) + comm.reduce_scatter_time(tp_group, act_bytes)
    tp_one = np.where(sp, agrs, ar)
    # SP stores the norm outputs sharded, so backward all-gathers them again before the QKV and
    # MLP weight gradients (Korthikanti 2022 sec. 4.2.2; Calculon's seq_par_ag_redo); full
    # recompute already re-runs those all-gathers in its forward.
    ag_redo = np.where(sp & (rc != 2), 2 * comm.all_gather_time(tp_group, act_bytes), 0.0)
    tp_per_layer = tp_one * (4 + 2 * (rc == 2)) + ag_redo
    if job.tp_comm_overlap:
        # Transformer Engine userbuffers (Megatron-Core tp_comm_overlap, SP only): each
        # all-gather / reduce-scatter is split into tp chunks pipelined against the GEMM it
        # feeds or drains (forward: QKV, out-proj, FC1, FC2; backward: their dgrad/wgrad, 2x the
        # forward GEMM time). Exposed: what the GEMMs cannot cover, and at least one chunk
        # (1/tp) of the collective, the pipeline's fill (TE userbuffers ring-exchange design).
        def exposed(comm_s: np.ndarray, gemm_s: np.ndarray) -> np.ndarray:
            return np.maximum(comm_s / tp, comm_s - gemm_s)

        def overlapped(gemm_fwd: np.ndarray) -> np.ndarray:
            fwd_x = exposed(2 * tp_one, gemm_fwd)
            return fwd_x * (1 + (rc == 2)) + exposed(2 * tp_one + ag_redo, 2 * gemm_fwd)

        on = sp & (tp > 1)
        tp_dense = np.where(on, overlapped(dense_t.gemm), tp_per_layer)
        tp_moe = np.where(on, overlapped(moe_t.gemm), tp_per_layer) if model.is_moe else tp_dense
    else:
        tp_dense = tp_moe = tp_per_layer
    tp_mb = (
        st["n_dense"] * tp_dense[col]
        + st["n_moe"] * tp_moe[col]
        + (st["emb"] + st["head"]) * tp_one[col]
    )

    # CP: ring exchange of K and V blocks, (cp-1) sends in forward, K,V and dK,dV in backward,
    # overlapped with the attention core where it is longer (Transformer Engine's ring attention)
    kv_w = (
        ((model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0))
        if model.is_mla
        else 2 * model.kv_heads * model.head_size
    )
    # K, V heads split over TP (replicated once tp > kv heads); MLA's latent is not split
    kv_bytes = tokens * kv_w * 2 / (1.0 if model.is_mla else np.minimum(tp, model.kv_heads))
    cp_cross = comm.Group(cluster, cp, tp).crosses
    cp_send = comm.p2p_time(cluster, kv_bytes, cp_cross) * (cp - 1)
    cp_fwd = np.maximum(cp_send - dense_t.attention, 0.0)
    cp_bwd = np.maximum(2 * cp_send - attn_bwd * dense_t.attention, 0.0)
    cp_layer = np.where(cp > 1, cp_fwd * (1 + (rc == 2)) + cp_bwd, 0.0)
    cp_mb = layers * cp_layer[col]

    # EP: all-to-all dispatch + combine in forward and backward (+ forward again under full
    # recompute), each rank sending its tokens' k copies (Megatron alltoall dispatcher); exposed
    if model.is_moe:
        a2a_bytes = (
            tokens * model.num_experts_per_tok * model.hidden_size * 2 / np.where(sp, tp, 1.0)
        )
        a2a = comm.all_to_all_time(comm.Group(cluster, ep, tp), a2a_bytes)
        ep_mb = st["n_moe"] * (a2a * (4 + 2 * (rc == 2)))[col]
    else:
        a2a_bytes = np.zeros(n_layouts)
        ep_mb = np.zeros_like(fwd)

    stage_mb = compute_mb + tp_mb + cp_mb + ep_mb
    slow = np.argmax(stage_mb, axis=1)
    rows = np.arange(n_layouts)

    width = stage_mb.shape[1]
    flat = {}  # flat indices of (row, chosen stage), one array per choice of stages

    def at(x: np.ndarray, which: np.ndarray = slow) -> np.ndarray:
        """x[row, which[row]] for (N, C) arrays (one flat take instead of fancy indexing)."""
        key = id(which)
        if key not in flat:
            flat[key] = (rows * width + which, which)
        return np.take(np.ascontiguousarray(x).reshape(-1), flat[key][0])

    time_compute = m * at(compute_mb)
    time_tp = m * at(tp_mb)
    time_cp = m * at(cp_mb)
    time_ep = m * at(ep_mb)
    bubble = pipeline.bubble_slots(pp, vpp, m) * at(stage_mb)
    p2p_bytes = tokens * model.hidden_size * 2 / np.where(sp, tp, 1.0)
    pp_cross = comm.Group(cluster, pp, tp * cp * dp).crosses
    p2p_one = comm.p2p_time(cluster, p2p_bytes, pp_cross)
    # Interleaved 1F1B with overlap_p2p_comm: the steady-state sends and receives run behind
    # the next chunk's compute (a chunk = 1/vpp of the stage's micro-batch time); the pp - 1
    # fill and drain hops stay exposed. Plain 1F1B / GPipe block on every send (Megatron-Core).
    chunk_s = at(stage_mb) / vpp
    p2p_hidden = 2 * (pp - 1) * p2p_one + 2 * m * vpp * np.maximum(p2p_one - chunk_s, 0.0)
    p2p_blocking = 2 * (m * vpp + pp - 1) * p2p_one
    time_pp_comm = np.where(
        pp > 1, np.where(job.p2p_overlap & (vpp > 1), p2p_hidden, p2p_blocking), 0.0
    )

    # ---- parameters on each candidate stage (local to one GPU) -----------------------------
    p_dense = st["p_dense"] / tp[col]
    p_exp = st["p_expert"] / (ep * tp)[col]
    d_dense = dp * cp  # ZeRO / distributed optimizer shard over the data-parallel group with CP
    d_exp = np.maximum(dp * cp / ep, 1.0)  # expert-data-parallel group
    wd, gd, od = memory.param_state_arrays(zero, d_dense, job.grad_dtype)
    we, ge, oe = memory.param_state_arrays(zero, d_exp, job.grad_dtype)
    mem_w = p_dense * wd[col] + p_exp * we[col]
    mem_g = p_dense * gd[col] + p_exp * ge[col]
    mem_o = p_dense * od[col] + p_exp * oe[col]

    # ---- DP communication (per step), on the stage holding the most parameters ------------
    heavy = np.argmax(p_dense + p_exp, axis=1)
    pd_h, pe_h = at(p_dense, heavy), at(p_exp, heavy)
    grad_w = memory.grad_reduce_bytes(zero, job.grad_dtype)
    # one layer's bf16 params, the FSDP / ZeRO-3 unit (experts sharded over ep as well)
    unit_all = (st["max_layer_params"] + st["max_layer_experts"] / ep[col]) / tp[col] * 2.0
    unit = at(unit_all, heavy)

    def dp_time(params: np.ndarray, group: comm.Group) -> tuple[np.ndarray, np.ndarray]:
        """(per-step, per-micro-batch) seconds of the DP traffic for `params` local params."""
        bucket = np.maximum(DP_BUCKET_ELEMENTS, 1e6 * group.size)
        calls = np.maximum(np.ceil(params / bucket), 1.0)
        elems = np.minimum(params, bucket)
        msg_grad, msg_param = elems * grad_w, elems * 2.0
        per_step = np.where(zero == 0, comm.all_reduce_time(group, msg_grad, calls), 0.0)
        z1 = zero == 1
        if z1.any():
            per_step = per_step + np.where(
                z1, comm.reduce_scatter_time(group, msg_grad, calls), 0.0
            )
        ag = comm.all_gather_time(group, msg_param, calls)
        per_step = per_step + np.where((zero == 1) | (zero == 2), ag, 0.0)
        per_mb = np.where(zero == 2, comm.reduce_scatter_time(group, msg_grad, calls), 0.0)
        z3 = zero == 3
        if z3.any():
            unit_calls = np.maximum(np.ceil(params * 2.0 / np.maximum(unit, 1.0)), 1.0)
            t_unit = comm.all_gather_time(group, np.minimum(unit, params * 2.0), unit_calls)
            per_mb = per_mb + np.where(z3, 3 * t_unit, 0.0)  # AG fwd + AG bwd + RS grads
        return per_step, per_mb

    per_step, per_mb = dp_time(pd_h, comm.Group(cluster, d_dense, tp))
    if model.is_moe:
        ps_e, pm_e = dp_time(pe_h, comm.Group(cluster, d_exp, tp * ep))
        per_step, per_mb = per_step + ps_e, per_mb + pm_e
    # What can hide: per-step reductions behind the last micro-batch's backward (and the
    # distributed optimizer's param all-gather behind the next forward: Megatron
    # overlap_grad_reduce / overlap_param_gather); per-micro-batch traffic behind all of them.
    fwd_h, recomp_h = at(fwd, heavy), at(recomp, heavy)
    bwd_h = at(bwd, heavy)
    window = np.select(
        [zero <= 0, zero == 1],
        [bwd_h, bwd_h + fwd_h + recomp_h],
        default=m * (fwd_h + recomp_h + bwd_h),
    )
    dp_total = per_step + m * per_mb
    time_dp = (
        np.maximum((1 - gpu.dp_overlap) * dp_total, dp_total - window)
        if job.grad_overlap
        else dp_total
    )

    # ---- optimizer: Adam over the local shard at HBM bandwidth ----------------------------
    shard = np.where(zero >= 1, pd_h / d_dense + pe_h / d_exp, pd_h + pe_h)
    time_opt = shard * ADAM_BYTES_PER_PARAM / gpu.hbm_bytes_per_s + gpu.step_overhead_s

    # ---- activations ----------------------------------------------------------------------
    act_d = memory.activation_per_token(layer_d, tp, sp, rc, keys, flash)
    act_m = memory.activation_per_token(layer_m, tp, sp, rc, keys, flash) if model.is_moe else act_d
    flight = pipeline.in_flight(st["index"], pp[col], vpp[col], m[col])
    per_mb_layers = tokens[col] * (st["n_dense"] * act_d[col] + st["n_moe"] * act_m[col])
    rep_div = np.where(sp, tp, 1.0)
    h, voc = model.hidden_size, model.vocab_size
    emb_extra = tokens * (
        memory.INPUT_ID_BYTES + (h if memory.uses_dropout(model) else 0) / rep_div
    )
    head_extra = tokens * (2 * 2 * h / rep_div + memory.LOGIT_BYTES * voc / tp)
    # full recompute rebuilds one layer's activations (one micro-batch) during its backward;
    # offload keeps OFFLOAD_RESIDENT_LAYERS of them
    resident = np.select([rc == 2, rc == 3], [1.0, OFFLOAD_RESIDENT_LAYERS], default=0.0)
    working = resident * tokens * np.maximum(full_d, full_m)
    mem_act = (
        per_mb_layers * flight
        + st["emb"] * (emb_extra[col] * flight)
        + st["head"] * head_extra[col]
        + np.where(layers > 0, working[col], 0.0)
    )

    # ---- temporary buffers: the largest collective's, and ZeRO-2/3 unsharded units ---------
    tp_buf = np.where(tp > 1, tokens * h * 2, 0.0)  # SP all-gather output (one b s h tensor)
    ep_buf = np.where(ep > 1, 2 * a2a_bytes, 0.0)  # all-to-all send + receive
    coll = np.maximum(tp_buf, ep_buf)
    # nothing is gathered when the DP group is a single rank
    unit_c = np.where((d_dense > 1)[col], unit_all, 0.0)
    z = zero[col]
    zero_units = np.select(
        [z == 2, z == 3], [unit_c, memory.ZERO3_LIVE_UNITS * unit_c], default=0.0
    )
    # The step's fp32 gradient shard (memory.step_grad_bytes); JobSpec.software
    # "deepspeed-2022": the fp32 copy of the largest gradient and the reduce bucket
    # (memory.recipe_buffers), the eager CUDA context and extra NCCL communicators
    # (memory.runtime_extra_bytes).
    # Buffers that exist only after the backward count beyond the activations they replace:
    # peak = max(activations + backward buffers, after-backward buffers).
    end_stage = st["emb"] + st["head"]
    grad_elems = memory.largest_grad_elements(model, end_stage) / tp[col]
    during, after = memory.recipe_buffers(job.software, job.grad_dtype, grad_elems,
                                          p_dense + p_exp)
    step_grads = (p_dense * memory.step_grad_bytes(d_dense, job.grad_dtype)[col]
                  + p_exp * memory.step_grad_bytes(d_exp, job.grad_dtype)[col])
    after = np.maximum(after, step_grads)  # the step's fp32 shard comes after the reduction
    backward_other = coll[col] + zero_units + during
    mem_other = np.maximum(backward_other, after - mem_act) + memory.runtime_extra_bytes(
        job.software, tp[col], pp[col], end_stage)

    total = mem_w + mem_g + mem_o + mem_act + mem_other
    peak_stage = np.argmax(total, axis=1)

    step = time_compute + time_tp + time_cp + time_ep + bubble + time_pp_comm + time_dp + time_opt
    n_gpus = tp * pp * dp * cp
    tokens_step = float(s * batch)
    model_flops = compute.model_flops_per_step(model, s, batch)
    hw_flops = model_flops + compute.recompute_flops_per_step(model, s, batch, rc)
    peak = gpu.peak_flops(job.precision)
    rel = gpu.step_time_rel_error or 0.0
    cap = gpu.usable_memory_gib
    peak_mem = at(total, peak_stage) / GIB
    return {
        "grad_accum": m.astype(np.int64),
        "global_batch": np.full(n_layouts, batch, dtype=np.int64),
        "seq_len": np.full(n_layouts, s, dtype=np.int64),
        "step_time_s": step,
        "tokens_per_s": tokens_step / step,
        "tokens_per_s_per_gpu": tokens_step / step / n_gpus,
        "model_tflops_per_gpu": model_flops / step / n_gpus / 1e12,
        "hw_tflops_per_gpu": hw_flops / step / n_gpus / 1e12,
        "mfu": model_flops / (step * peak * n_gpus),
        "hfu": hw_flops / (step * peak * n_gpus),
        "peak_mem_gb": peak_mem,
        "mem_capacity_gb": np.full(n_layouts, cap),
        "fits": peak_mem <= cap,
        "time_compute_s": time_compute,
        "time_tp_comm_s": time_tp,
        "time_cp_comm_s": time_cp,
        "time_ep_comm_s": time_ep,
        "time_pp_comm_s": time_pp_comm,
        "time_pp_bubble_s": bubble,
        "time_dp_comm_exposed_s": time_dp,
        "time_optimizer_s": time_opt,
        "mem_weights_gb": at(mem_w, peak_stage) / GIB,
        "mem_grads_gb": at(mem_g, peak_stage) / GIB,
        "mem_optimizer_gb": at(mem_o, peak_stage) / GIB,
        "mem_activations_gb": at(mem_act, peak_stage) / GIB,
        "mem_other_gb": at(mem_other, peak_stage) / GIB,
        "step_time_low_s": step * (1 - rel),
        "step_time_high_s": step * (1 + rel),
        "peak_stage": at(st["index"], peak_stage).astype(np.int64),
        "slow_stage": at(st["index"]).astype(np.int64),
        "in_flight": at(flight, peak_stage),
        "model_flops": np.full(n_layouts, model_flops),
        "hw_flops": hw_flops,
    }

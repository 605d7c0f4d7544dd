"""estimate_batch: the plan columns of many layouts at once (numpy over layouts).

A short assembly of per-stage terms, each a small function in its home module:
compute.stage_compute_time, comm.tp_stage_time / cp_stage_time, moe.ep_stage_time (per
micro-batch), memory.stage_state / stage_activation_bytes / stage_other_bytes (bytes on one GPU),
comm.pp_p2p_time, comm.dp_traffic_time / dp_exposed_time and compute.optimizer_time (per step),
pipeline.in_flight / bubble_slots. Per layout it builds the candidate stages of its (pp, vpp)
split (pipeline.stage_features), evaluates every term on each ((layouts, stages) arrays), and
reports the most loaded GPU's memory and the slowest stage's time. Step time (seconds per
optimizer step), with m = grad_accum micro-batches per DP rank:

    step = m x (compute + tp + cp + ep comm per micro-batch of the slowest stage)
         + bubble ((pp-1)/vpp x the mean per-micro-batch time of the other stages when
           m >= pp, Narayanan 2021 with unequal stages; pipeline.bubble_time)
         + pipeline p2p (2 sends per micro-batch chunk and per fill/drain hop; only the
           fill/drain hops when interleaving overlaps them, JobSpec.p2p_overlap)
         + exposed DP communication + optimizer step + profile.step_overhead_s

TP traffic is exposed unless JobSpec.tp_comm_overlap (then only what the GEMMs it is
pipelined with cannot cover, and at least one chunk in tp). The overhead is folded into
time_optimizer_s so the contract's time_* columns add up to step_time_s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.costmodel import comm, compute, memory, moe, pipeline
from planner.layout import KNOBS, RECOMPUTE_LEVELS, Layout
from planner.specs import GIB, ClusterSpec, JobSpec, ModelSpec

RECOMPUTE_INDEX = {r: i for i, r in enumerate(RECOMPUTE_LEVELS)}

_STAGE_CACHE: dict[tuple, tuple[ModelSpec, pipeline.StageFeatures]] = {}


def _features(model: ModelSpec, pp: int, vpp: int, counts: tuple[int, ...] = (),
              prune: bool = True) -> pipeline.StageFeatures:
    key = (id(model), pp, vpp, counts, prune)
    hit = _STAGE_CACHE.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    if len(_STAGE_CACHE) > 4096:
        _STAGE_CACHE.clear()
    feats = pipeline.stage_features(model, pp, vpp, counts, prune)
    _STAGE_CACHE[key] = (model, feats)
    return feats


def layout_arrays(layouts: Sequence[Layout] | Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Layouts -> one int array per knob (recompute as 0/1/2, sp as bool). A mapping of arrays
    (the search's own columns) is accepted as is, recompute given as codes or names."""
    if isinstance(layouts, Mapping):
        out = {k: np.asarray(layouts[k]) for k in KNOBS}
        if out["recompute"].dtype.kind in "UO":
            out["recompute"] = np.vectorize(RECOMPUTE_INDEX.__getitem__, otypes=[int])(
                out["recompute"]
            )
        out["sp"] = out["sp"].astype(bool)
        out = {k: (v if k == "sp" else v.astype(np.int64)) for k, v in out.items()}
        # expert-TP: the space's column (resolved), else the TP size (Megatron's default)
        etp = layouts.get("etp")
        out["etp"] = out["tp"] if etp is None else np.asarray(etp).astype(np.int64)
        if layouts.get("stage_layers") is not None:
            out["stage_layers"] = _split_column(layouts["stage_layers"])
        return out
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
    ).reshape(-1, len(KNOBS))
    out = {k: rows[:, i] for i, k in enumerate(KNOBS)}
    out["sp"] = out["sp"].astype(bool)
    out["etp"] = np.array([lo.expert_tp for lo in layouts], dtype=np.int64)
    if any(lo.stage_layers for lo in layouts):
        out["stage_layers"] = _split_column([lo.stage_layers for lo in layouts])
    return out


def _split_column(splits: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-layout layer counts per stage as an object array of tuples (() = the even rule)."""
    col = np.empty(len(splits), dtype=object)
    col[:] = [tuple(int(n) for n in s) for s in splits]
    return col


def _gather_stages(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray,
                   splits: np.ndarray | None = None, prune: bool = True
                   ) -> dict[str, np.ndarray]:
    """(N, C) arrays of candidate-stage features, padded by repeating a layout's first candidate.
    splits: per-layout explicit layer counts (object array of tuples, () = the even rule);
    prune False: every stage, in order (figures, pools)."""
    if splits is None:
        code = pp.astype(np.int64) * 1024 + vpp.astype(np.int64)  # vpp < 1024 (vpp | layers)
        present = np.flatnonzero(np.bincount(code))
        lookup = np.zeros(present[-1] + 1, dtype=np.int64)
        lookup[present] = np.arange(len(present))
        feats = [_features(model, int(c // 1024), int(c % 1024), (), prune) for c in present]
        which = lookup[code]
    else:
        groups: dict[tuple, int] = {}
        which = np.array([groups.setdefault(key, len(groups))
                          for key in zip(pp.tolist(), vpp.tolist(), splits.tolist(),
                                         strict=True)], dtype=np.int64)
        feats = [_features(model, p, v, c, prune) for p, v, c in groups]
    width = max(len(f.index) for f in feats)
    names = list(pipeline.StageFeatures.__dataclass_fields__)
    table = np.empty((len(names), len(feats), width))
    for g, f in enumerate(feats):
        for i, name in enumerate(names):
            col = getattr(f, name)
            table[i, g, : len(col)] = col
            table[i, g, len(col) :] = col[0]
    stacked = np.take(table, which, axis=1)  # (F, N, C)
    return {name: stacked[i] for i, name in enumerate(names)}


def estimate_batch(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    layouts: Sequence[Layout] | Mapping[str, Any],
    all_stages: bool = False,
) -> dict[str, np.ndarray]:
    """Plan columns (numeric, non-layout) for each layout, as numpy arrays of equal length.

    Layouts must be structurally valid (checks.layout_violations empty); invalid ones give
    finite but meaningless numbers. Extra keys: step_time_low_s, step_time_high_s, ranking_band,
    peak_stage (pipeline stage of the most loaded GPU), slow_stage, in_flight, model_flops,
    hw_flops; the slowest stage's per-micro-batch pass times fwd_mb_s, bwd_mb_s, recompute_mb_s
    (fp8_cast_mb_s of them its FP8 casts, compute.fp8_cast_times; fp8_weight_cast_s its
    weights' cast, once a step, in time_compute_s), stage_mb_s (all of its per-micro-batch
    time, comm included) and one p2p_send_s. all_stages:
    also (N, pp) arrays stages_index, stages_mem_{weights,grads,optimizer,activations,other}_gb
    for every stage (figures)."""
    lo = layout_arrays(layouts)
    if len(lo["tp"]) == 0:  # the columns, with no rows
        return {k: v[:0] for k, v in estimate_batch(model, cluster, job, [Layout()]).items()}
    st = _gather_stages(model, lo["pp"], lo["vpp"], lo.get("stage_layers"),
                        prune=not all_stages)  # (N, C) stages
    x = _Knobs.of(lo, job, model)
    t = _stage_times(model, cluster, job, x, st)
    mem = _stage_memory(model, cluster, job, x, st, t)
    period = round_period(model, cluster, job, x, lo)
    return _assemble(model, [cluster], job, x, st, [(t, mem)], all_stages=all_stages,
                     period=period)


def _chunk_counts(model: ModelSpec, pp: int, vpp: int, split: tuple[int, ...]) -> np.ndarray:
    """(pp * vpp, 5) counts of each model chunk in layer order: dense layers, MoE layers, the
    embedding (none: below), the LM head and MTP head passes: pipeline._stage_row of each chunk
    as a stage of pp * vpp (the last holds the head and its MTP modules, layers like the last)."""
    chunks = (list(split) if len(split) == pp * vpp
              else pipeline.stage_layer_counts(model.num_hidden_layers, pp * vpp))
    starts = np.cumsum([0, *chunks]).tolist()
    rows = [pipeline._stage_row(model, c, len(chunks), range(starts[c], starts[c + 1]))
            for c in range(len(chunks))]
    # (n_dense, n_moe, emb, head, mtp); the embedding's excess on the first round is left out:
    # the first virtual stage waits on nothing, and its excess only shifts the fill (simulate():
    # chunks of 4.01, 4, 4, 4 | 4, 4, 4, 4 + h layers' time run at the slowest stage's 8 + h,
    # not 8.01 + h)
    return np.array([(r[1], r[2], 0, r[4], r[9]) for r in rows], dtype=float)


def round_period(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, x: _Knobs,
                 lo: Mapping[str, np.ndarray]) -> np.ndarray:
    """Seconds per micro-batch of interleaved 1F1B's steady state (0 where vpp is 1): the sum
    over the vpp rounds of the round's slowest chunk (chunk c * pp + s on stage s). Megatron's
    schedule runs a round's chunk on every stage for pp micro-batches before the next round's
    (pipeline.schedule_order), so a round moves at its slowest chunk: with equal chunks that is
    the stage's time, with uneven ones it can exceed every stage's total (DeepSeek-V3 pp 8 x
    vpp 4 with one layer beside the LM head and MTP in the last chunk: 0.257 s against a
    slowest stage of 0.206 s; pipeline.simulate() runs at 0.254). Chunk times are the stage
    terms of one layer of each kind, the embedding and the head (linear in the counts:
    _stage_times) times each chunk's counts."""
    n = len(x.tp)
    out = np.zeros(n)
    inter = np.flatnonzero(lo["vpp"] > 1)
    if not len(inter):
        return out
    names = list(pipeline.StageFeatures.__dataclass_fields__)
    unit = {name: np.zeros((len(inter), 5)) for name in names}
    for j, name in enumerate(("n_dense", "n_moe", "emb", "head", "mtp")):
        unit[name][:, j] = 1.0
    sub = _Knobs(**{f: getattr(x, f)[inter] for f in _Knobs.__dataclass_fields__})
    unit_t = _stage_times(model, cluster, job, sub, unit).total  # (rows, 5)
    splits = lo.get("stage_layers")
    groups: dict[tuple, list[int] | np.ndarray] = {}
    given = (np.array([len(splits[r]) > 0 for r in inter.tolist()], dtype=bool)
             if splits is not None else np.zeros(len(inter), dtype=bool))
    for j in np.flatnonzero(given).tolist():  # explicit splits, row by row
        r = int(inter[j])
        groups.setdefault((int(lo["pp"][r]), int(lo["vpp"][r]), tuple(splits[r])), []).append(j)
    plain = np.flatnonzero(~given)  # the even rule: by (pp, vpp) at once
    code = lo["pp"][inter[plain]].astype(np.int64) * 1024 + lo["vpp"][inter[plain]]
    for c in np.unique(code).tolist():
        groups[(c // 1024, c % 1024, ())] = plain[code == c]
    for (pp, vpp, split), members in groups.items():
        counts = _chunk_counts(model, pp, vpp, split)
        # (rows, pp * vpp) in layer order, the terms added in a fixed order (a matrix product
        # could round differently with the batch's size; the search's chunks must not)
        unit_m = unit_t[members]
        chunk_t = sum(unit_m[:, j, None] * counts[None, :, j] for j in range(counts.shape[1]))
        out[inter[members]] = chunk_t.reshape(len(members), vpp, pp).max(axis=2).sum(axis=1)
    return out


@dataclass(frozen=True)
class _Knobs:
    """Per-layout knobs as float arrays (recompute as codes, sp as bool) and derived counts."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray  # expert-TP (the TP size unless folded otherwise)
    vpp: np.ndarray
    mbs: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    sp: np.ndarray
    m: np.ndarray  # micro-batches per DP rank per step (grad_accum)
    tokens: np.ndarray  # local tokens per micro-batch per rank: mbs x s / cp
    load: np.ndarray  # routed copies on the most loaded EP rank / the mean (moe.load_factor)

    @classmethod
    def of(cls, lo: dict[str, np.ndarray], job: JobSpec, model: ModelSpec) -> _Knobs:
        tp, pp, dp, cp, ep = (lo[k].astype(float) for k in ("tp", "pp", "dp", "cp", "ep"))
        mbs = lo["mbs"].astype(float)
        m = np.maximum(job.global_batch // np.maximum(lo["mbs"] * lo["dp"], 1), 1).astype(float)
        etp = lo["etp"].astype(float) if "etp" in lo else tp
        return cls(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=lo["vpp"].astype(float),
                   mbs=mbs, zero=lo["zero"], rc=lo["recompute"], sp=lo["sp"], m=m,
                   tokens=mbs * job.seq_len / cp,
                   load=moe.load_factor(model, ep, job.moe_capacity_factor, job.moe_routing,
                                        copies=mbs * job.seq_len / cp
                                        * model.num_experts_per_tok / tp))


@dataclass(frozen=True)
class _StageTimes:
    """Seconds per micro-batch of each candidate stage ((N, C) arrays) and what they share."""

    compute: compute.StageCompute
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    whole: np.ndarray  # (N,) seconds per micro-batch of all stages together (their sum)
    ep_buffer: np.ndarray  # (N,) bytes of the MoE dispatcher's buffers (moe.dispatch_buffer_bytes)
    acts: tuple[memory.LayerActivation, memory.LayerActivation]  # dense, MoE layer
    full: tuple[np.ndarray, np.ndarray]  # one layer's activations per token, no recompute

    @property
    def total(self) -> np.ndarray:
        return self.compute.total + self.tp + self.cp + self.ep


def _stage_times(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, x: _Knobs,
                 st: dict[str, np.ndarray]) -> _StageTimes:
    """Compute and TP/CP/EP communication per micro-batch of each stage, and of all stages
    together: every term is linear in a stage's counts (layers, embedding, LM head), so the sum
    over the stages is the time of one extra column holding the whole model."""
    gpu, kind, s = cluster.gpu, job.attention, job.seq_len
    n_moe = sum(model.is_moe_layer(i) for i in range(model.num_hidden_layers))
    mtp = model.num_nextn_predict_layers  # MTP modules: layers like the last (pipeline)
    last_moe = mtp * model.is_moe_layer(model.num_hidden_layers - 1)
    whole = {"n_dense": model.num_hidden_layers - n_moe + mtp - last_moe,
             "n_moe": n_moe + last_moe, "emb": 1, "head": 1, "mtp": mtp}
    st = {k: np.concatenate([v, np.full((v.shape[0], 1), whole.get(k, 0), dtype=float)],
                            axis=1) for k, v in st.items()}
    keys, flash, prec = s / x.cp, kind != "unfused", job.precision
    layer_d = memory.layer_activation(model, False, precision=prec, software=job.software)
    layer_m = (memory.layer_activation(model, True, precision=prec, software=job.software)
               if model.is_moe else layer_d)
    full_d = memory.full_layer_activation_per_token(layer_d, x.tp, x.sp, keys, flash)
    full_m = (memory.full_layer_activation_per_token(layer_m, x.tp, x.sp, keys, flash)
              if model.is_moe else full_d)
    drop = memory.uses_dropout(model, job.software)
    dense_t = compute.layer_forward_times(model, gpu, prec, False, x.tokens, x.tp, x.ep, x.sp,
                                          s, kind, dropout=drop)
    moe_t = (compute.layer_forward_times(model, gpu, prec, True, x.tokens, x.tp, x.ep, x.sp,
                                         s, kind, x.etp, x.load, dropout=drop)
             if model.is_moe else dense_t)
    head_t = compute.head_forward_time(model, gpu, prec, x.tokens, x.tp)
    emb_t = compute.embedding_forward_time(model, gpu, x.tokens)
    casts_d = compute.fp8_cast_times(model, gpu, prec, False, x.tokens, x.tp, x.sp)
    casts_m = (compute.fp8_cast_times(model, gpu, prec, True, x.tokens, x.tp, x.sp, x.ep, x.etp,
                                      x.load) if model.is_moe else casts_d)
    comp = compute.stage_compute_time(gpu, st, dense_t, moe_t, head_t, emb_t, x.rc, kind,
                                      (x.tokens * full_d, x.tokens * full_m),
                                      (casts_d, casts_m))
    tp_mb, _ = comm.tp_stage_time(cluster, model, st, x.tokens, x.tp, x.sp, x.rc, dense_t.gemm,
                                  moe_t.gemm, job.tp_comm_overlap)
    cp_mb = comm.cp_stage_time(cluster, model, st["n_dense"] + st["n_moe"], x.tokens, x.tp, x.cp,
                               x.rc, dense_t.attention, compute.attention_backward_factor(kind))
    disp = job.moe_dispatcher
    ep_buffer = moe.dispatch_buffer_bytes(model, disp, x.tokens, x.tp, x.sp, x.ep, x.etp, x.load)
    ep_mb = moe.ep_stage_time(cluster, model, disp, st["n_moe"], x.tokens, x.tp, x.sp, x.ep,
                              x.etp, x.load, x.rc)
    if job.moe_ep_overlap:
        ep_mb = moe.overlapped_ep_time(ep_mb, comp.total)
    whole_mb = (comp.total + tp_mb + cp_mb + ep_mb)[:, -1]
    comp = compute.StageCompute(*(getattr(comp, f)[:, :-1]
                                  for f in compute.StageCompute.__dataclass_fields__))
    return _StageTimes(comp, tp_mb[:, :-1], cp_mb[:, :-1], ep_mb[:, :-1], whole_mb, ep_buffer,
                       (layer_d, layer_m), (full_d, full_m))


@dataclass(frozen=True)
class _StageMemory:
    """Bytes on one GPU of each candidate stage ((N, C) arrays)."""

    state: memory.StageState
    activations: np.ndarray
    other: np.ndarray
    flight: np.ndarray  # micro-batches of activations held (stage-equivalents)

    @property
    def total(self) -> np.ndarray:
        s = self.state
        return s.weights + s.grads + s.optimizer + self.activations + self.other


def _stage_memory(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, x: _Knobs,
                  st: dict[str, np.ndarray], t: _StageTimes) -> _StageMemory:
    """Model state, activations and buffers of each stage's GPU."""
    del cluster  # one GPU type; the capacity is checked by the assembly
    col = (slice(None), None)
    keys, flash = job.seq_len / x.cp, job.attention != "unfused"
    state = memory.stage_state(st, x.tp, x.dp, x.cp, x.ep, x.zero, job.grad_dtype, x.etp,
                               job.software)
    act_d = memory.activation_per_token(t.acts[0], x.tp, x.sp, x.rc, keys, flash)
    act_m = (memory.activation_per_token(t.acts[1], x.tp, x.sp, x.rc, keys, flash)
             + moe.routed_activation_extra(model, job.precision, x.tp, x.etp, x.load, x.rc)
             if model.is_moe else act_d)
    flight = pipeline.in_flight(st["index"], x.pp[col], x.vpp[col], x.m[col])
    act = memory.stage_activation_bytes(model, st, x.tokens, x.tp, x.sp, x.rc, flight,
                                        (act_d, act_m), t.full, job.software)
    other = memory.stage_other_bytes(model, job.software, job.grad_dtype, st, state, x.tokens,
                                     x.tp, x.pp, x.zero, t.ep_buffer, act)
    return _StageMemory(state, act, other, flight)


def dp_and_optimizer_time(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, x: _Knobs,
                          t: _StageTimes, state: Any, heavy: np.ndarray, at: Any
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per step of exposed DP traffic and of the optimizer step, taken on stage `heavy`
    of each layout (the stage holding the most parameters; its pass times hide the reduce):
    dense parameters reduce over the DP x CP group, expert parameters over the expert-DP group.
    One home for the plain model (_assemble) and for each pool of a cluster of pools."""
    pd_h, pe_h = at(state.p_dense, heavy), at(state.p_expert, heavy)
    grad_w = memory.grad_reduce_bytes(x.zero, job.grad_dtype, job.grad_reduce_dtype)
    unit = at(state.unit, heavy)
    dp_group = comm.Group(cluster, state.d_dense, x.tp)
    z1_ar = job.zero1_grad_all_reduce
    per_step, per_mb, gather = comm.dp_traffic_time(dp_group, pd_h, x.zero, grad_w, unit,
                                                    job.dp_bucket_mb, z1_ar)
    blocking = comm.zero1_blocking_time(dp_group, pd_h, x.zero, grad_w) if z1_ar else 0.0
    if model.is_moe:
        e_group = comm.Group(cluster, state.d_expert, x.etp * x.ep)
        ps_e, pm_e, g_e = comm.dp_traffic_time(e_group, pe_h, x.zero, grad_w, unit,
                                               job.dp_bucket_mb, z1_ar)
        per_step, per_mb, gather = per_step + ps_e, per_mb + pm_e, gather + g_e
        if z1_ar:
            blocking = blocking + comm.zero1_blocking_time(e_group, pe_h, x.zero, grad_w)
    per_step = per_step + blocking
    fwd, rc, bwd = (at(t.compute.forward, heavy), at(t.compute.recompute, heavy),
                    at(t.compute.backward, heavy))
    floor = 0.0
    if (x.zero == 3).any():  # ZeRO-3: first gather, last reduce-scatter, per-unit excess
        t_unit, units = comm.zero3_unit_time(dp_group, pd_h, unit)
        floor = np.where(x.zero == 3, comm.zero3_exposed_floor(t_unit, units, x.m, fwd, rc, bwd),
                         0.0)
    time_dp = comm.dp_exposed_time(per_step, per_mb, x.m, x.zero, fwd, rc, bwd,
                                   cluster.gpu.dp_overlap, job.grad_overlap, gather,
                                   job.param_gather_overlap, floor, blocking)
    shard = np.where(x.zero >= 1, pd_h / state.d_dense + pe_h / state.d_expert, pd_h + pe_h)
    return time_dp, compute.optimizer_time(cluster.gpu, shard, job.software)


def _mean_peak(pools: Sequence[ClusterSpec], precision: str) -> float:
    """Peak FLOP/s per GPU of the cluster: its GPU's, or on pools the GPU-weighted mean (MFU
    counts each pool's GPUs at their own peak)."""
    peaks = [cl.gpu.peak_flops(precision) for cl in pools]
    if all(p == peaks[0] for p in peaks):
        return peaks[0]
    return sum(cl.num_gpus * p for cl, p in zip(pools, peaks, strict=True)) / sum(
        cl.num_gpus for cl in pools)


def _assemble(model: ModelSpec, pools: Sequence[ClusterSpec], job: JobSpec, x: _Knobs,
              st: dict[str, np.ndarray], parts: Sequence[tuple[_StageTimes, _StageMemory]],
              pool: np.ndarray | None = None, real: np.ndarray | None = None,
              same_gpu: bool = True, all_stages: bool = False,
              period: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The plan columns: the slowest stage sets the per-micro-batch time, the stage holding the
    most parameters the DP traffic and the optimizer step, the most loaded GPU the memory.
    Interleaved, a steady-state round period above the slowest stage (round_period) adds its
    excess per micro-batch to the bubble (the stage idles for it).

    One assembly for every cluster: a homogeneous cluster is one pool (pools = [cluster], parts =
    its stage times and memory). On several pools (costmodel.pools) `pool` is each candidate
    stage's pool and `real` masks the padding past a layout's pp; each stage is costed on its
    pool's GPU and fabric, DP traffic and the optimizer step per pool (the slowest pool counts),
    the pipeline sends on the slower network (a pool boundary is a network hop), the memory
    against each stage's own capacity (the reported GPU has the least headroom), the band is the
    slowest stage's profile's."""
    s, batch, m = job.seq_len, job.global_batch, x.m
    n_layouts = len(x.tp)
    one = len(pools) == 1

    def per_stage(get: Any) -> np.ndarray:
        if one:
            return get(*parts[0])
        out = np.zeros(st["index"].shape)
        for j, part in enumerate(parts):
            out = np.where(pool == j, get(*part), out)
        return out

    stage_mb = per_stage(lambda t, mem: t.total)
    slow = np.argmax(stage_mb if real is None else np.where(real, stage_mb, -np.inf), axis=1)
    at = _Picker(stage_mb.shape)
    # the slowest stage's passes, and once a step the FP8 cast of its layers' weights
    weight_cast = at(per_stage(lambda t, mem: t.compute.weight_cast), slow)
    time_compute = m * at(per_stage(lambda t, mem: t.compute.total), slow) + weight_cast
    time_tp = m * at(per_stage(lambda t, mem: t.tp), slow)
    time_cp = m * at(per_stage(lambda t, mem: t.cp), slow)
    time_ep = m * at(per_stage(lambda t, mem: t.ep), slow)
    slow_mb = at(stage_mb, slow)
    if one:
        whole = parts[0][0].whole  # every stage once (pipeline.bubble_time)
    elif same_gpu:  # every stage of the pipeline once, on pools of one GPU profile
        whole = np.where(real, stage_mb, 0.0).sum(axis=1)
    else:  # the split's sum is not fixed across pools: the equal-stage bound (an upper bound)
        whole = slow_mb * x.pp
    bubble = pipeline.bubble_time(x.pp, x.vpp, m, slow_mb, whole)
    if period is not None:  # interleaved: rounds slower than the slowest stage idle it
        bubble = bubble + m * np.maximum(period - slow_mb, 0.0)
    crosses = None if one else np.ones(n_layouts, dtype=bool)  # a pool boundary: the network
    time_pp_comm = np.max([comm.pp_p2p_time(cl, model, x.tokens, x.tp, x.pp, x.dp, x.cp, x.vpp,
                                            x.sp, m, slow_mb, job.p2p_overlap, crosses,
                                            job.p2p_scatter_gather)
                           for cl in pools], axis=0)

    # DP communication and the optimizer step, on the stage holding the most parameters (of each
    # pool; the pool that takes longest counts: the step ends when every stage has stepped)
    dp_opt = []
    for j, (cl, (t, mem)) in enumerate(zip(pools, parts, strict=True)):
        state = mem.state
        params = state.p_dense + state.p_expert
        if not one:
            params = np.where((pool == j) & real, params, -1.0)
        heavy = np.argmax(params, axis=1)
        t_dp, t_opt = dp_and_optimizer_time(model, cl, job, x, t, state, heavy, at)
        if not one:
            present = at(params, heavy) >= 0
            t_dp, t_opt = np.where(present, t_dp, 0.0), np.where(present, t_opt, 0.0)
        dp_opt.append((t_dp, t_opt))
    if one:
        time_dp, time_opt = dp_opt[0]
    else:
        worst = np.argmax(np.stack([d + o for d, o in dp_opt], axis=1), axis=1)
        rows = np.arange(n_layouts)
        time_dp = np.stack([d for d, _ in dp_opt], axis=1)[rows, worst]
        time_opt = np.stack([o for _, o in dp_opt], axis=1)[rows, worst]

    total = per_stage(lambda t, mem: mem.total)
    if one:
        peak_stage = np.argmax(total, axis=1)  # the most loaded GPU
        capacity = np.full(n_layouts, pools[0].gpu.usable_memory_gib)
        hbm: Any = pools[0].gpu.memory_gib
        rel: Any = pools[0].gpu.step_time_band  # calibrated, else the held-out error
        rank_rel: Any = pools[0].gpu.ranking_band  # the error between layouts of one job
    else:
        cap = np.array([cl.gpu.usable_memory_gib for cl in pools])[pool]
        peak_stage = np.argmin(np.where(real, cap - total / GIB, np.inf), axis=1)  # least room
        capacity = at(cap, peak_stage)
        hbm = at(np.array([cl.gpu.memory_gib for cl in pools])[pool], peak_stage)
        rel = np.array([cl.gpu.step_time_band for cl in pools])[at(pool, slow)]
        rank_rel = np.array([cl.gpu.ranking_band for cl in pools])[at(pool, slow)]
    step = time_compute + time_tp + time_cp + time_ep + bubble + time_pp_comm + time_dp + time_opt
    terms = pools[0].gpu.step_time_band_terms if one else None
    if terms is not None:  # calibrated: wider for a plan unlike the calibration runs
        from planner.specs.hardware import structural_band

        named = {"time_compute_s": time_compute, "time_tp_comm_s": time_tp,
                 "time_cp_comm_s": time_cp, "time_ep_comm_s": time_ep,
                 "time_pp_comm_s": time_pp_comm, "time_pp_bubble_s": bubble,
                 "time_dp_comm_exposed_s": time_dp, "time_optimizer_s": time_opt}
        safe = np.maximum(step, 1e-30)
        names = list(terms.shares)
        rel = structural_band(np.column_stack([np.broadcast_to(named[c], step.shape) / safe
                                               for c in names]),
                              [terms.shares[c] for c in names], [terms.tau[c] for c in names],
                              rel)
    # a trained router's load is known only to a range (moe.load_band_seconds)
    load_minus, load_plus = moe.load_band_seconds(model, job.moe_routing, job.moe_capacity_factor,
                                                  x.load, time_ep)
    n_gpus = x.tp * x.pp * x.dp * x.cp
    tokens_step = float(s * batch)
    model_flops = compute.model_flops_per_step(model, s, batch)
    hw_flops = model_flops + compute.recompute_flops_per_step(model, s, batch, x.rc)
    peak = _mean_peak(pools, job.precision)
    peak_mem = at(total, peak_stage) / GIB

    def mem_at_peak(get: Any) -> np.ndarray:
        return at(per_stage(get), peak_stage) / GIB

    send = np.max([comm.pp_send_time(cl, model, x.tokens, x.tp, x.pp, x.dp, x.cp, x.sp, crosses,
                                     job.p2p_scatter_gather) for cl in pools], axis=0)
    out = {
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
        "mem_capacity_gb": capacity,
        "fits": peak_mem <= capacity,
        "time_compute_s": time_compute,
        "time_tp_comm_s": time_tp,
        "time_cp_comm_s": time_cp,
        "time_ep_comm_s": time_ep,
        "time_pp_comm_s": time_pp_comm,
        "time_pp_bubble_s": bubble,
        "time_dp_comm_exposed_s": time_dp,
        "time_optimizer_s": time_opt,
        "mem_weights_gb": mem_at_peak(lambda t, mem: mem.state.weights),
        "mem_grads_gb": mem_at_peak(lambda t, mem: mem.state.grads),
        "mem_optimizer_gb": mem_at_peak(lambda t, mem: mem.state.optimizer),
        "mem_activations_gb": mem_at_peak(lambda t, mem: mem.activations),
        "mem_other_gb": mem_at_peak(lambda t, mem: mem.other),
        "step_time_low_s": step * (1 - rel) - load_minus,
        "step_time_high_s": step * (1 + rel) + load_plus,
        "ranking_band": np.broadcast_to(np.asarray(rank_rel, dtype=float), step.shape).copy(),
        "device_mem_gb": memory.device_memory_gib(
            peak_mem, mem_at_peak(lambda t, mem: mem.activations), hbm,
            x.tp, x.pp, x.dp, x.cp, x.ep),
        "peak_stage": at(st["index"], peak_stage).astype(np.int64),
        "slow_stage": at(st["index"], slow).astype(np.int64),
        "in_flight": at(per_stage(lambda t, mem: mem.flight), peak_stage),
        "model_flops": np.full(n_layouts, model_flops),
        "hw_flops": hw_flops,
        "fwd_mb_s": at(per_stage(lambda t, mem: t.compute.forward), slow),
        "bwd_mb_s": at(per_stage(lambda t, mem: t.compute.backward), slow),
        "recompute_mb_s": at(per_stage(lambda t, mem: t.compute.recompute), slow),
        "fp8_cast_mb_s": at(per_stage(lambda t, mem: t.compute.cast), slow),
        "fp8_weight_cast_s": weight_cast,
        "stage_mb_s": slow_mb,
        "p2p_send_s": np.where(x.pp > 1, send, 0.0),
    }
    if all_stages:  # every stage's memory terms, (N, C) (figures)
        out |= {"stages_index": st["index"]} | {
            f"stages_mem_{k}_gb": per_stage(get) / GIB for k, get in (
                ("weights", lambda t, mem: mem.state.weights),
                ("grads", lambda t, mem: mem.state.grads),
                ("optimizer", lambda t, mem: mem.state.optimizer),
                ("activations", lambda t, mem: mem.activations),
                ("other", lambda t, mem: mem.other))}
    if pool is not None:  # on pools, every stage's own numbers (their table and JSON)
        out |= {"stage_time_s": np.where(real, stage_mb, np.nan),
                "stage_mem_gb": np.where(real, total / GIB, np.nan),
                "stage_pool": np.where(real, pool, -1)}
    return out


class _Picker:
    """x[row, which[row]] for (N, C) arrays (one flat take instead of fancy indexing), the flat
    indices cached per choice of stages."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.rows, self.width = np.arange(shape[0]), shape[1]
        self.flat: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, x: np.ndarray, which: np.ndarray) -> np.ndarray:
        key = id(which)
        if key not in self.flat:
            self.flat[key] = (self.rows * self.width + which, which)
        return np.take(np.ascontiguousarray(x).reshape(-1), self.flat[key][0])


def stage_costs(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    layouts: Sequence[Layout] | Mapping[str, Any],
    stages: pipeline.StageFeatures,
    memory: bool = True,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(seconds per micro-batch, peak bytes on one GPU) of every given stage (rows of `stages`,
    the same for every layout) under each layout, as (layouts, stages) arrays: the terms the
    assembly takes the slowest and the most loaded of. The split search reads its tables here.
    memory False: the times only (None for the bytes)."""
    lo = layout_arrays(layouts)
    n = len(lo["tp"])
    st = {name: np.broadcast_to(getattr(stages, name), (n, len(stages.index)))
          for name in pipeline.StageFeatures.__dataclass_fields__}
    x = _Knobs.of(lo, job, model)
    t = _stage_times(model, cluster, job, x, st)
    if not memory:
        return t.total, None
    return t.total, _stage_memory(model, cluster, job, x, st, t).total

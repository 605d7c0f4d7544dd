"""Pipeline stages: which layers each stage holds, the stages that can be the most loaded, the
micro-batches in flight per schedule and the bubble.

Sources: Narayanan et al. 2021 (arXiv:2104.04473) section 2.2 for the 1F1B / interleaved bubble
and in-flight counts; Megatron-LM `theoretical_memory_usage.py` and its interleaved schedule
(`get_forward_backward_func`, num_warmup_microbatches) for the interleaved in-flight count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.layout import (  # noqa: F401 - the even rule, with Layout
    chunk_layers,
    chunk_totals,
    stage_layer_counts,
    stage_layers,
)
from planner.specs import ModelSpec

Schedule = Literal["1f1b", "gpipe"]


@dataclass(frozen=True)
class StageFeatures:
    """Per-stage counts for one (pp, vpp) split, one entry per candidate stage.

    The cost of a stage is a non-negative linear function of these counts (times per-layout
    factors), so a stage whose counts are all <= an earlier stage's (which has at least as many
    micro-batches in flight) can never be the most loaded; only the others are kept."""

    index: np.ndarray  # stage index (0 = first stage)
    n_dense: np.ndarray  # dense transformer layers on the stage
    n_moe: np.ndarray  # MoE transformer layers on the stage
    emb: np.ndarray  # 1 where the stage holds the token embedding (stage 0)
    head: np.ndarray  # 1 where the stage holds the final norm + LM head + loss (last stage)
    p_dense: np.ndarray  # non-expert parameters on the stage (all TP ranks together)
    p_expert: np.ndarray  # routed-expert parameters on the stage (all EP x TP ranks together)
    max_layer_params: np.ndarray  # non-expert params of the stage's largest layer (ZeRO-3 unit)
    max_layer_experts: np.ndarray  # routed-expert params of its largest MoE layer
    # multi-token-prediction modules on the stage (the last, as Megatron-Core places them
    # without a layout: mtp_standalone off): each one more layer like the last (counted in
    # n_dense / n_moe), a 2h -> h projection and norms (in p_dense) and one more pass through
    # the shared LM head and loss (ModelSpec.mtp_params, mtp_flops_per_token)
    mtp: np.ndarray


def nanotron_stage_counts(model: ModelSpec, pp: int) -> list[int]:
    """Decoder layers per pipeline stage as nanotron places them (models/base.py build_model
    @ 0e0a27e, the sweep's commit, unchanged at 2411b02): its pipeline blocks in order
    (embedding, the layers, final norm, LM head, fp32 cast, loss) with costs from
    LlamaForTraining.get_block_compute_costs (a layer 4 h^2 + 3 ffn h, the LM head vocab x h,
    the rest 0); each block goes to the current rank, which moves on once the cumulative cost
    exceeds total x (rank + 1) / pp. A large vocabulary thus leaves the head's stage with few
    or no layers and the stages after it empty; the cost model holds the head on the last stage,
    which gives the same stage times (empty stages cost nothing) and the same bubble."""
    h, n_layers = model.hidden_size, model.num_hidden_layers
    layer = 4 * h * h + 3 * model.intermediate_size * h
    blocks = [0] + [layer] * n_layers + [0, model.vocab_size * h, 0, 0]
    total = float(sum(blocks))
    counts, rank, cum = [0] * pp, 0, 0.0
    for i, cost in enumerate(blocks):
        cum += cost
        if 1 <= i <= n_layers:
            counts[rank] += 1
        if cum > total * ((rank + 1) / pp) and rank < pp - 1:
            rank += 1
    return counts


def split_layers(counts: Sequence[int]) -> list[list[int]]:
    """Layer indices of each stage for explicit per-stage layer counts (contiguous, in order)."""
    stages, start = [], 0
    for n in counts:
        stages.append(list(range(start, start + n)))
        start += n
    return stages


def stage_counts(num_layers: int, pp: int, vpp: int = 1,
                 counts: Sequence[int] = ()) -> list[int]:
    """Layers per pipeline stage of a plan: the explicit counts (per stage, or per virtual stage
    when there are pp * vpp of them: each stage's chunks together), or the even rule's
    (stage_layers; with vpp > 1 each stage's chunks together)."""
    if counts and vpp > 1 and len(counts) == pp * vpp:
        return chunk_totals(counts, pp)
    if counts:
        return list(counts)
    return [len(s) for s in stage_layers(num_layers, pp, vpp)]


def _stage_row(model: ModelSpec, idx: int, pp: int, layers: Sequence[int]) -> tuple:
    """(index, n_dense, n_moe, emb, head, p_dense, p_expert, max_layer_params,
    max_layer_experts, mtp) of stage idx holding `layers` (StageFeatures' fields)."""
    expert_params = model.num_experts * model.mlp_params(model.expert_ffn) if model.is_moe else 0
    moe_flags = [model.is_moe_layer(i) for i in layers]
    n_moe = sum(moe_flags)
    n_dense = len(layers) - n_moe
    emb = 1 if idx == 0 else 0
    head = 1 if idx == pp - 1 else 0
    p_dense = 0
    max_layer = max_experts = 0
    for i, moe in zip(layers, moe_flags, strict=True):
        lp = model.layer_params(i)
        p_dense += lp - (expert_params if moe else 0)
        max_layer = max(max_layer, lp - (expert_params if moe else 0))
        max_experts = max(max_experts, expert_params if moe else 0)
    if emb:
        p_dense += model.embedding_params
    if head:
        # The LM head lives on the last stage; a tied head needs its own copy there when
        # pp > 1 (Megatron keeps the shared embedding on both end stages).
        tied_copy = model.tie_word_embeddings and pp > 1
        p_dense += model.lm_head_params + model.final_norm_params
        p_dense += model.vocab_size * model.hidden_size if tied_copy else 0
    mtp = model.num_nextn_predict_layers if head else 0
    p_expert = n_moe * expert_params
    if mtp:
        last = model.num_hidden_layers - 1
        experts = expert_params if model.is_moe_layer(last) else 0
        n_moe, n_dense = (n_moe + mtp, n_dense) if experts else (n_moe, n_dense + mtp)
        p_dense += model.mtp_params - mtp * experts
        p_expert += mtp * experts
    return (idx, n_dense, n_moe, emb, head, p_dense, p_expert, max_layer, max_experts, mtp)


def _features(rows: list[tuple], prune: bool = True) -> StageFeatures:
    keep = []
    for i, row in enumerate(rows):
        dominated = prune and any(
            all(rj >= ri for rj, ri in zip(rows[j][1:], row[1:], strict=True)) for j in range(i)
        )
        if not dominated:
            keep.append(row)
    cols = list(zip(*keep, strict=True))
    return StageFeatures(*(np.asarray(c, dtype=float) for c in cols))


def stage_features(model: ModelSpec, pp: int, vpp: int,
                   counts: Sequence[int] = (), prune: bool = True) -> StageFeatures:
    """Candidate (non-dominated) stages of the (pp, vpp) split, or of the explicit layer counts
    (per stage, or per virtual stage when there are pp * vpp of them: Megatron's pipeline
    layout, chunk c on stage c mod pp, the embedding on chunk 0 and the loss on the last, both
    on their stages), with their counts; every stage when not `prune` (stages on different
    GPUs: a stage with fewer layers may still be the slowest)."""
    if counts and vpp > 1 and len(counts) == pp * vpp:
        layers = chunk_layers(counts, pp)
    elif counts:
        layers = split_layers(counts)
    else:
        layers = stage_layers(model.num_hidden_layers, pp, vpp)
    return _features([_stage_row(model, idx, pp, ls) for idx, ls in enumerate(layers)], prune)


def uniform_layers(model: ModelSpec) -> bool:
    """Whether every transformer layer is of one kind (all dense or all MoE), so a stage's cost
    depends on how many layers it holds, not which."""
    kinds = {model.is_moe_layer(i) for i in range(model.num_hidden_layers)}
    return len(kinds) == 1


def dense_prefix(model: ModelSpec) -> int | None:
    """k where the first k transformer layers are dense and the rest MoE (DeepSeek-V3's
    first_k_dense_replace 3, Kimi K2's 1; 0 for an all-MoE model, the layers for a dense one);
    None for any other pattern (Llama 4's alternating layers)."""
    kinds = [model.is_moe_layer(i) for i in range(model.num_hidden_layers)]
    k = kinds.index(True) if True in kinds else len(kinds)
    return k if all(kinds[k:]) else None


def kind_features(model: ModelSpec, pp: int, max_layers: int, k: int) -> StageFeatures:
    """Every (stage, layer count, dense count) of a model whose first k layers are dense and
    the rest MoE (dense_prefix): stage i of pp holding n = 1..max_layers layers of which
    d = 0..k dense, row (i * max_layers + n - 1) * (k + 1) + d; rows with d > n repeat d = n
    (the split search never allows them). Counts and parameters grow by one dense or one MoE
    layer's (_stage_row of layer 0 and of layer k); the largest-layer fields are those of the
    kinds present. What the split search over mixed kinds reads each stage's cost off."""
    rows = []
    for i in range(pp):
        base = np.array(_stage_row(model, i, pp, []), dtype=float)
        dense = np.array(_stage_row(model, i, pp, [0]), dtype=float)
        moe = np.array(_stage_row(model, i, pp, [k]), dtype=float)
        d_step, m_step = dense - base, moe - base
        for step in (d_step, m_step):
            step[[0, 3, 4, 7, 8, 9]] = 0.0  # index, emb, head, largest layer / experts, MTP
        for n in range(1, max_layers + 1):
            for d in range(k + 1):
                d = min(d, n)
                row = base + d * d_step + (n - d) * m_step
                row[7] = max(dense[7] if d else 0.0, moe[7] if n > d else 0.0)
                row[8] = moe[8] if n > d else 0.0
                rows.append(row)
    return StageFeatures(*np.array(rows).T)


def count_features(model: ModelSpec, pp: int, max_layers: int) -> StageFeatures:
    """Every (stage, layer count) pair of a model with uniform layers: stage i of pp holding
    n = 1..max_layers layers, i-major (row i * max_layers + n - 1); not pruned. The split
    search (planner.search.stages) reads each stage's cost off these rows. Counts and
    parameters grow by one layer's per extra layer (uniform_layers); the largest-layer fields
    stay."""
    rows = []
    for i in range(pp):
        one = np.array(_stage_row(model, i, pp, [0]), dtype=float)
        two = np.array(_stage_row(model, i, pp, [0, 1]), dtype=float) if max_layers > 1 else one
        step = two - one
        step[[0, 3, 4, 7, 8, 9]] = 0.0  # index, emb, head, largest layer / experts, MTP: fixed
        rows.extend(one + (n - 1) * step for n in range(1, max_layers + 1))
    cols = np.array(rows).T
    return StageFeatures(*cols)


def in_flight(
    stage: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray, schedule: Schedule = "1f1b"
) -> np.ndarray:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage's
    layers (so activation memory = stage layers x per-layer bytes x this).

    1F1B: min(pp - stage, m) (Narayanan 2021 sec. 2.2.1: stage i warms up with pp - i - 1
    forwards, then holds one more). Interleaved (vpp > 1): Megatron warms up
    2(pp - stage - 1) + (vpp - 1) pp chunk-micro-batches, holds one more, capped by m*vpp; each
    chunk is 1/vpp of the stage, which for stage 0 gives Megatron's pp (1 + (pp-1)/(pp vpp)).
    GPipe: all m micro-batches."""
    if schedule == "gpipe":
        return np.broadcast_to(m, np.broadcast(stage, m).shape).astype(float)
    plain = np.minimum(pp - stage, m).astype(float)
    if not np.any(vpp > 1):
        return plain
    chunks = np.minimum(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    return np.where(vpp > 1, chunks / np.maximum(vpp, 1), plain)


def bubble_fraction(pp, vpp, m, schedule: Schedule = "1f1b"):
    """Bubble time relative to the ideal (bubble-free) compute time: (p-1)/(v m) for
    (interleaved) 1F1B, (p-1)/m for GPipe (Narayanan 2021 eqs. 1 and 2). This is the metric
    seed 001 Ex 9.6 uses; the fraction of the whole step is (p-1)/(v m + p - 1)."""
    v = 1 if schedule == "gpipe" else vpp
    return (np.asarray(pp) - 1) / (np.asarray(v) * np.asarray(m))


def bubble_slots(pp, vpp, m):
    """Idle time of the slowest stage per step, in units of its per-micro-batch time.

    m >= pp: (pp - 1) / vpp (Narayanan 2021 sec. 2.2.2). m < pp: a round of chunks cannot start
    again before its first micro-batch has crossed all pp stages, so each of the vpp rounds
    takes pp chunk slots instead of m: step = vpp pp + m - 1 chunk slots of t/vpp against
    m vpp busy ones, i.e. bubble = (pp - m) + (m - 1) / vpp (equal to pp - 1 when vpp = 1, and
    to the formula above at m = pp)."""
    pp, vpp, m = (np.asarray(x, dtype=float) for x in (pp, vpp, m))
    return np.maximum(pp - m, 0.0) + (np.minimum(m, pp) - 1) / vpp


def bubble_time(pp, vpp, m, slowest_s, whole_s):
    """Idle seconds of the slowest stage per step: bubble_slots x the mean per-micro-batch time
    of the *other* stages, (whole_s - slowest_s) / (pp - 1), where whole_s is all stages'
    per-micro-batch time together. With equal stages that is bubble_slots x slowest_s
    (Narayanan 2021); with unequal ones (the first stage's embedding, the last stage's LM head
    and loss) 1F1B's critical path is one micro-batch through every stage plus m - 1 of the
    slowest, sum_i t_i + (m - 1) t_max, so the bubble is sum_i t_i - t_max (the makespan of a
    flow shop of identical jobs; simulate() with per-stage times checks it)."""
    pp = np.asarray(pp, dtype=float)
    others = (np.asarray(whole_s) - slowest_s) / np.maximum(pp - 1, 1.0)
    return bubble_slots(pp, vpp, m) * np.where(pp > 1, others, 0.0)


# ---- the schedule itself: order of passes per stage, and its timeline ------------------------
# bubble_slots and in_flight above are this schedule's closed forms (tests/unit/
# test_pipeline_schedule.py checks them against simulate() for every small pp, vpp, m); the
# Gantt chart (planner.figures) draws simulate() with the estimate's per-pass times.

@dataclass(frozen=True)
class Pass:
    """One forward ("F") or backward ("B") pass of a micro-batch through one model chunk."""

    kind: str  # "F" or "B"
    microbatch: int
    chunk: int  # model chunk on this stage (0 .. vpp-1); virtual stage = chunk * pp + stage


def schedule_order(pp: int, vpp: int, m: int, schedule: Schedule = "1f1b") -> list[list[Pass]]:
    """The passes each stage runs, in order. 1F1B (Narayanan 2021 sec. 2.2.1): stage s warms up
    with pp - s - 1 forwards, alternates one forward and one backward, then drains. Interleaved
    (vpp > 1, m a multiple of pp): Megatron-Core's order (schedules.py
    forward_backward_pipelining_with_interleaving: micro-batches in groups of pp per chunk,
    get_schedule_table; warmup 2 (pp - s - 1) + (vpp - 1) pp). GPipe: all forwards, then all
    backwards."""
    if vpp > 1 and m > pp and m % pp:
        raise ValueError(f"interleaved schedule needs m <= pp or a multiple of pp: m={m}, pp={pp}")
    table = [(g + i, c) for g in range(0, m, pp) for c in range(vpp)
             for i in range(min(pp, m - g))]
    out = []
    for s in range(pp):
        fwd = [Pass("F", mb, c) for mb, c in table]
        bwd = [Pass("B", mb, vpp - 1 - c) for mb, c in table]
        if schedule == "gpipe":
            out.append(fwd + bwd)
            continue
        warm = (pp - s - 1) if vpp == 1 else 2 * (pp - s - 1) + (vpp - 1) * pp
        warm = min(warm, len(fwd))
        order = fwd[:warm]
        for i in range(len(fwd) - warm):
            order += [fwd[warm + i], bwd[i]]
        out.append(order + bwd[len(fwd) - warm:])
    return out


@dataclass(frozen=True)
class Slot:
    """One pass on the timeline: stage, pass, start and end (seconds)."""

    stage: int
    op: Pass
    start: float
    end: float


def simulate(pp: int, vpp: int, m: int, fwd_s, bwd_s, send_s: float = 0.0,
             schedule: Schedule = "1f1b", blocking_sends: bool = True) -> list[Slot]:
    """Times schedule_order: each stage runs its passes in order, a pass starts when the stage
    is free and its input has arrived (the previous virtual stage's forward, the next one's
    backward, send_s later). fwd_s / bwd_s are one chunk's pass times: one number, one per
    stage, or (vpp > 1) one per virtual stage, pp * vpp of them in layer order (chunk c on stage
    c mod pp: an uneven pipeline layout's chunks); with blocking sends the sender is busy for
    send_s after each pass that sends (plain 1F1B, Megatron without overlap_p2p_comm)."""

    def per_virtual(x) -> list[float]:
        a = np.asarray(x, dtype=float)
        if a.ndim and a.size == pp * vpp and vpp > 1:
            return [float(t) for t in a]
        return [float(t) for t in np.tile(np.broadcast_to(a, (pp,)), vpp)]

    fwd, bwd = per_virtual(fwd_s), per_virtual(bwd_s)
    order = schedule_order(pp, vpp, m, schedule)
    last_v = pp * vpp - 1
    done: dict[tuple[str, int, int], float] = {}  # (kind, mb, virtual stage) -> arrival time
    free = [0.0] * pp
    nxt = [0] * pp
    slots: list[Slot] = []
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for s in range(pp):
            while nxt[s] < len(order[s]):
                op = order[s][nxt[s]]
                v = op.chunk * pp + s
                if op.kind == "F":
                    dep = ("F", op.microbatch, v - 1) if v > 0 else None
                else:
                    dep = ("B", op.microbatch, v + 1) if v < last_v else ("F", op.microbatch, v)
                if dep is not None and dep not in done:
                    break
                ready = done[dep] if dep is not None else 0.0
                start = max(free[s], ready)
                end = start + (fwd[v] if op.kind == "F" else bwd[v])
                sends = (op.kind == "F" and v < last_v) or (op.kind == "B" and v > 0)
                hop = send_s if sends else 0.0
                done[(op.kind, op.microbatch, v)] = end + hop if sends else end
                free[s] = end + (hop if blocking_sends else 0.0)
                slots.append(Slot(s, op, start, end))
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"schedule deadlocks for pp={pp} vpp={vpp} m={m}")
    return slots

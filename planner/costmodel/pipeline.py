"""Pipeline stages: which layers each stage holds, the stages that can be the most loaded, the
micro-batches in flight per schedule and the bubble.

Sources: Narayanan et al. 2021 (arXiv:2104.04473) section 2.2 for the 1F1B / interleaved bubble
and in-flight counts; Megatron-LM `theoretical_memory_usage.py` and its interleaved schedule
(`get_forward_backward_func`, num_warmup_microbatches) for the interleaved in-flight count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

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


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage (or per model chunk) for an uneven split: every one gets
    floor(L/pp); the L mod pp extra layers go first to the inner ones (1 .. pp-2), then to the
    first, then to the last, because the first stage also holds the embedding and the most
    in-flight micro-batches and the last holds the LM head. When pp divides L + 2 this is
    Megatron's account_for_embedding/loss_in_pipeline_split (the embedding and the loss each
    take one layer's slot: L = 126 on 16 stages gives 7, 8 x 14, 7)."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0] + ([pp - 1] if pp > 1 else [])
    for stage in order[:extra]:
        counts[stage] += 1
    return counts


def stage_layers(num_layers: int, pp: int, vpp: int) -> list[list[int]]:
    """Layer indices held by each stage. vpp > 1 (interleaved): the model is cut into pp * vpp
    contiguous chunks (split as stage_layer_counts does), chunk c on stage c mod pp (Megatron's
    interleaving)."""
    counts = stage_layer_counts(num_layers, pp * vpp)
    stages: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(counts):
        stages[c % pp].extend(range(start, start + n))
        start += n
    return stages


def stage_features(model: ModelSpec, pp: int, vpp: int) -> StageFeatures:
    """Candidate (non-dominated) stages of the (pp, vpp) split with their counts."""
    moe_flags = [model.is_moe_layer(i) for i in range(model.num_hidden_layers)]
    expert_params = model.num_experts * model.mlp_params(model.expert_ffn) if model.is_moe else 0
    rows = []
    for idx, layers in enumerate(stage_layers(model.num_hidden_layers, pp, vpp)):
        n_moe = sum(moe_flags[i] for i in layers)
        n_dense = len(layers) - n_moe
        emb = 1 if idx == 0 else 0
        head = 1 if idx == pp - 1 else 0
        p_dense = 0
        max_layer = max_experts = 0
        for i in layers:
            lp = model.layer_params(i)
            p_dense += lp - (expert_params if moe_flags[i] else 0)
            max_layer = max(max_layer, lp - (expert_params if moe_flags[i] else 0))
            max_experts = max(max_experts, expert_params if moe_flags[i] else 0)
        if emb:
            p_dense += model.embedding_params
        if head:
            # The LM head lives on the last stage; a tied head needs its own copy there when
            # pp > 1 (Megatron keeps the shared embedding on both end stages).
            tied_copy = model.tie_word_embeddings and pp > 1
            p_dense += model.lm_head_params + model.final_norm_params
            p_dense += model.vocab_size * model.hidden_size if tied_copy else 0
        rows.append(
            (idx, n_dense, n_moe, emb, head, p_dense, n_moe * expert_params, max_layer, max_experts)
        )
    keep = []
    for i, row in enumerate(rows):
        dominated = any(
            all(rj >= ri for rj, ri in zip(rows[j][1:], row[1:], strict=True)) for j in range(i)
        )
        if not dominated:
            keep.append(row)
    cols = list(zip(*keep, strict=True))
    return StageFeatures(*(np.asarray(c, dtype=float) for c in cols))


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


def bubble_fraction(pp, vpp, m, schedule: Schedule = "1f1b"):  # noqa: ANN001, ANN201
    """Bubble time relative to the ideal (bubble-free) compute time: (p-1)/(v m) for
    (interleaved) 1F1B, (p-1)/m for GPipe (Narayanan 2021 eqs. 1 and 2). This is the metric
    seed 001 Ex 9.6 uses; the fraction of the whole step is (p-1)/(v m + p - 1)."""
    v = 1 if schedule == "gpipe" else vpp
    return (np.asarray(pp) - 1) / (np.asarray(v) * np.asarray(m))


def bubble_slots(pp, vpp, m):  # noqa: ANN001, ANN201
    """Idle time of the slowest stage per step, in units of its per-micro-batch time.

    m >= pp: (pp - 1) / vpp (Narayanan 2021 sec. 2.2.2). m < pp: a round of chunks cannot start
    again before its first micro-batch has crossed all pp stages, so each of the vpp rounds
    takes pp chunk slots instead of m: step = vpp pp + m - 1 chunk slots of t/vpp against
    m vpp busy ones, i.e. bubble = (pp - m) + (m - 1) / vpp (equal to pp - 1 when vpp = 1, and
    to the formula above at m = pp)."""
    pp, vpp, m = (np.asarray(x, dtype=float) for x in (pp, vpp, m))
    return np.maximum(pp - m, 0.0) + (np.minimum(m, pp) - 1) / vpp

"""DeepSpeed's pipeline engine (Megatron-DeepSpeed, BLOOM 2022) against what the cost model
assumes of it: its TrainSchedule is plain 1F1B (the bubble the model counts), its sends are
split over TP and all-gathered on receipt (JobSpec.p2p_scatter_gather), and the layer split of
BLOOM's partition methods. Hand computations on flat profiles."""

from __future__ import annotations

import pytest
from costmodel_fixtures import cluster, flat_gpu, job, llama_like

from planner.costmodel import estimate, pipeline
from planner.layout import Layout, stage_layer_counts


def deepspeed_train_schedule(pp: int, stage: int, m: int) -> list[tuple[str, int]]:
    """(kind, micro-batch) of each pass stage `stage` runs, in order, as DeepSpeed's
    TrainSchedule orders them (deepspeed/runtime/pipe/schedule.py at v0.6.0: 2 (m + pp - 1)
    steps; forward on the steps whose parity is the stage's, _even/_odd_step_forward_id and
    _backward_id map a step to its micro-batch; ids outside 0..m-1 are idle steps)."""
    out = []
    for step in range(2 * (m + pp - 1)):
        even_step, even_stage = step % 2 == 0, stage % 2 == 0
        if even_step and even_stage:
            mb, fwd = step // 2 - stage // 2, True
        elif not even_step and not even_stage:
            mb, fwd = (step - 1) // 2 - stage // 2, True
        elif even_step and not even_stage:
            mb, fwd = step // 2 - pp + (stage + 1) // 2, False
        else:
            mb, fwd = ((step - 1) // 2) - pp + 1 + stage // 2, False
        if 0 <= mb < m:
            out.append(("F" if fwd else "B", mb))
    return out


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6, 8, 12])
def test_deepspeed_train_schedule_is_the_models_1f1b(pp):
    """Every stage of DeepSpeed's TrainSchedule runs its passes in the order of the model's
    1F1B (pipeline.schedule_order: pp - s - 1 warm-up forwards, then one forward, one backward),
    so the ASAP timeline, and its bubble, are the ones the model counts. Counted the second way,
    DeepSpeed's own steps: 2 (m + pp - 1) half-slots of which each stage is busy 2 m, i.e.
    pp - 1 idle micro-batch times when forward and backward take alike: bubble_slots."""
    for m in range(1, 3 * pp + 2):
        for s, order in enumerate(pipeline.schedule_order(pp, 1, m)):
            assert deepspeed_train_schedule(pp, s, m) == [(op.kind, op.microbatch)
                                                          for op in order], (pp, s, m)
        idle = (2 * (m + pp - 1) - 2 * m) / 2
        assert idle == pytest.approx(float(pipeline.bubble_slots(pp, 1, m)))


H, S, T, PP, M = 8192, 4096, 8, 2, 8  # llama_like's width, its sequence; tp 8 per node, pp 2


def _pp_comm(scatter_gather: bool, sp: bool = False) -> float:
    model = llama_like()
    gpu = flat_gpu(intra_gb=100.0, inter_gb=10.0)
    lo = Layout(tp=T, pp=PP, dp=1, mbs=1, zero=0, recompute="full", sp=sp)
    spec = job(model, global_batch=M, p2p_overlap=False, p2p_scatter_gather=scatter_gather)
    return estimate(model, cluster(gpu, T * PP), spec, lo).time_pp_comm_s


def test_scatter_gather_sends_a_tp_share_then_gathers_it():
    """tp 8 fills a node, so the 2 stages sit on two nodes and each send leaves through one
    10 GB/s NIC per GPU. Megatron-Core (no SP): every TP rank sends the whole 2-byte
    activation, S H 2 = 64 MiB, 6.71 ms. DeepSpeed's engine: each rank sends its 1/8 (0.84 ms)
    and the receiver all-gathers the 64 MiB over its 8 TP ranks on a 100 GB/s NVLink,
    (7/8) S H 2 / 100 GB/s = 0.59 ms. Blocking 1F1B: 2 (m + pp - 1) = 18 such hops per step."""
    act = S * H * 2
    whole = act / 10e9
    split = act / T / 10e9 + act * (T - 1) / T / 100e9
    hops = 2 * (M + PP - 1)
    assert _pp_comm(False) == pytest.approx(hops * whole, rel=1e-6)
    assert _pp_comm(True) == pytest.approx(hops * split, rel=1e-6)
    assert _pp_comm(True) / _pp_comm(False) == pytest.approx(1 / 8 + 7 / 8 * 10 / 100, rel=1e-6)


def test_scatter_gather_changes_nothing_under_sequence_parallelism():
    """With SP the activation between stages is already sharded over TP (1/8 per rank): no
    gather is added, Megatron-LM's scatter_gather_tensors_in_pipeline is off with SP."""
    assert _pp_comm(True, sp=True) == pytest.approx(_pp_comm(False, sp=True), rel=1e-12)
    assert _pp_comm(False, sp=True) == pytest.approx(
        2 * (M + PP - 1) * S * H * 2 / T / 10e9, rel=1e-6)


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    # train/tr11-176B-ml/README.md (bigscience, "Architecture"): 70 layers on 12 stages under
    # --pp-partition-method 'type:transformer|embedding': [embed | 5], 6 x 10, [5 | embed]
    (70, 12, [5] + [6] * 10 + [5]),
    # chronicles-prequel.md "Rebalancing layers": NLAYERS 106 and 82 chosen so that
    # 2 + NLAYERS divides PP: (106 + 2) / 12 = 9, (82 + 2) / 12 = 7 slots per stage
    (106, 12, [8] + [9] * 10 + [8]),
    (82, 12, [6] + [7] * 10 + [6]),
])
def test_even_rule_is_bloom_embedding_partition(layers, pp, expected):
    """When pp divides L + 2 the even rule gives the embedding and the tied LM head one layer's
    slot each, as DeepSpeed's 'type:transformer|embedding' partition does for BLOOM."""
    assert stage_layer_counts(layers, pp) == expected

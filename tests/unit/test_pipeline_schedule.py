"""The pipeline schedule (pipeline.schedule_order / simulate) against the closed forms the cost
model counts (bubble_slots, in_flight), and the estimate's bubble against the timeline the
Gantt chart draws."""

from __future__ import annotations

import numpy as np
import pytest

from planner.costmodel import estimate_batch, pipeline
from planner.layout import Layout
from planner.registry import load_model, parse_cluster
from planner.specs import JobSpec


def _cases():
    for pp in (1, 2, 3, 4, 8):
        for vpp in (1, 2, 3, 4):
            for m in range(1, 17):
                if vpp > 1 and (pp == 1 or (m > pp and m % pp)):
                    continue  # Megatron's interleaved schedule refuses these (as the search)
                yield pp, vpp, m


@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (1.0, 1.0), (0.7, 2.3)])
def test_simulated_bubble_is_bubble_slots(tf, tb):
    for pp, vpp, m in _cases():
        slots = pipeline.simulate(pp, vpp, m, tf / vpp, tb / vpp)
        makespan = max(s.end for s in slots)
        idle_slots = (makespan - m * (tf + tb)) / (tf + tb)
        assert idle_slots == pytest.approx(float(pipeline.bubble_slots(pp, vpp, m))), (pp, vpp, m)


def test_peak_in_flight_is_in_flight():
    for pp, vpp, m in _cases():
        for s, order in enumerate(pipeline.schedule_order(pp, vpp, m)):
            held = peak = 0
            for op in order:
                held += 1 if op.kind == "F" else -1
                peak = max(peak, held)
            expect = pipeline.in_flight(np.array(s), np.array(pp), np.array(vpp), np.array(m))
            assert peak / vpp == pytest.approx(float(expect)), (pp, vpp, m, s)


def test_gpipe_holds_every_micro_batch_and_idles_pp_minus_one_slots():
    slots = pipeline.simulate(4, 1, 8, 1.0, 2.0, schedule="gpipe")
    assert max(s.end for s in slots) == pytest.approx(8 * 3 + 3 * 3)  # (m + pp - 1) x (f + b)
    order = pipeline.schedule_order(4, 1, 8, "gpipe")[0]
    assert [op.kind for op in order] == ["F"] * 8 + ["B"] * 8


def test_every_pass_runs_once_and_respects_its_dependency():
    slots = pipeline.simulate(4, 2, 8, 0.5, 1.0, send_s=0.1)
    seen = {(s.op.kind, s.op.microbatch, s.op.chunk * 4 + s.stage): s for s in slots}
    assert len(seen) == len(slots) == 2 * 8 * 4 * 2
    for (kind, mb, v), s in seen.items():
        if kind == "F" and v > 0:
            assert s.start >= seen[("F", mb, v - 1)].end + 0.1 - 1e-12
        if kind == "B" and v < 7:
            assert s.start >= seen[("B", mb, v + 1)].end + 0.1 - 1e-12


def test_interleaved_refuses_what_megatron_refuses():
    with pytest.raises(ValueError, match="multiple of pp"):
        pipeline.schedule_order(4, 2, 6)


def test_estimate_bubble_equals_the_drawn_timeline():
    """The estimate's time_pp_bubble_s is the idle time of the slowest stage (the last: the LM
    head) on the timeline simulate() draws with each stage's per-micro-batch time (sends
    aside), each stage's time spread over its chunks; and within 1% of the timeline with each
    chunk's own time (the head on the last chunk, the embedding on the first: the rounds run
    at the slowest stage here, costmodel.batch.round_period adds nothing)."""
    from planner.costmodel.batch import stage_costs

    model, cluster = load_model("llama2-7b"), parse_cluster("16xA100")
    job = JobSpec(seq_len=4096, global_batch=64)
    layout = Layout(tp=2, pp=4, dp=2, vpp=2, mbs=1, zero=1, recompute="selective", sp=True)
    cols = estimate_batch(model, cluster, job, [layout])
    m, stage_mb = int(cols["grad_accum"][0]), float(cols["stage_mb_s"][0])
    per_stage, _ = stage_costs(model, cluster, job, [layout],
                               pipeline.stage_features(model, 4, 2, prune=False))
    assert per_stage[0].argmax() == 3 and per_stage[0].max() == pytest.approx(stage_mb)
    share_f = cols["fwd_mb_s"][0] / (cols["fwd_mb_s"][0] + cols["bwd_mb_s"][0]
                                     + cols["recompute_mb_s"][0])
    tf, tb = per_stage[0] * share_f, per_stage[0] * (1 - share_f)
    slots = pipeline.simulate(4, 2, m, tf / 2, tb / 2)
    makespan = max(s.end for s in slots)
    assert makespan - m * stage_mb == pytest.approx(float(cols["time_pp_bubble_s"][0]), rel=1e-9)
    # each chunk's own time: chunk c on stage c mod 4, 4 layers each, the embedding on chunk 0
    # and the LM head on chunk 7 (a stage row of chunk 0's layers on stage 0, and so on)
    chunk_rows = [pipeline._stage_row(model, 0 if c == 0 else (3 if c == 7 else 1), 4,
                                      list(range(4 * c, 4 * c + 4))) for c in range(8)]
    feats = pipeline.StageFeatures(*(np.asarray(col, dtype=float) for col in zip(*chunk_rows,
                                                                                 strict=True)))
    chunk_s, _ = stage_costs(model, cluster, job, [layout], feats)
    slots = pipeline.simulate(4, 2, m, chunk_s[0] * share_f, chunk_s[0] * (1 - share_f))
    simulated = max(s.end for s in slots) - m * stage_mb
    assert float(cols["time_pp_bubble_s"][0]) == pytest.approx(simulated, rel=0.01)
    assert cols["time_compute_s"][0] == pytest.approx(
        m * (cols["fwd_mb_s"][0] + cols["bwd_mb_s"][0] + cols["recompute_mb_s"][0]), rel=0.05)


def test_bubble_with_a_heavy_last_stage_by_hand():
    """pp 4, m 8, plain 1F1B, stages of 3, 3, 3 and 9 s per micro-batch (forward 1, 1, 1, 3;
    backward twice that): the first micro-batch reaches the last stage after 3 s of forwards,
    which then works 8 x 9 s without a gap, and the last backward leaves through 3 x 2 s: 81 s,
    i.e. 81 - 72 = 9 s of bubble = sum - max = 18 - 9. The equal-stage formula,
    (pp - 1) x 9 = 27 s, charged the LM head's stage time to every idle slot."""
    slots = pipeline.simulate(4, 1, 8, [1.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 6.0])
    assert max(s.end for s in slots) == pytest.approx(81.0)
    assert float(pipeline.bubble_time(4, 1, 8, 9.0, 18.0)) == pytest.approx(9.0)
    assert float(pipeline.bubble_slots(4, 1, 8)) * 9.0 == pytest.approx(27.0)


@pytest.mark.parametrize("times", [[1.0, 1.0, 1.0, 3.0], [1.5, 1.0, 1.0, 2.5],
                                   [2.0, 1.0, 1.0, 1.0], [1.0, 2.0, 1.0, 1.0]])
def test_bubble_time_against_the_simulated_schedule(times):
    """With the slowest stage last (the LM head) bubble_time is the simulated idle time of the
    slowest stage; with it earlier the simulation idles less (bubble_time is an upper bound),
    and never more than the equal-stage formula."""
    tf = np.array(times)
    t = 3 * tf  # backward = 2 x forward
    for pp, vpp, m in [(4, 1, 2), (4, 1, 4), (4, 1, 8), (4, 2, 4), (4, 2, 8), (4, 4, 12)]:
        slots = pipeline.simulate(pp, vpp, m, tf / vpp, 2 * tf / vpp)
        simulated = max(s.end for s in slots) - m * t.max()
        closed = float(pipeline.bubble_time(pp, vpp, m, t.max(), t.sum()))
        if t.argmax() == pp - 1:
            assert closed == pytest.approx(simulated), (pp, vpp, m)
        else:
            assert simulated - 1e-9 <= closed
        assert closed <= float(pipeline.bubble_slots(pp, vpp, m)) * t.max() + 1e-9

"""Structural layout checks: readable reasons, LayoutError from estimate."""

from __future__ import annotations

import pytest
from costmodel_fixtures import a100, cluster, job, llama_like

from planner.costmodel import estimate, layout_violations
from planner.errors import LayoutError
from planner.layout import Layout
from planner.specs import ModelSpec

MODEL = llama_like()  # 80 layers, 64 heads, 8 KV heads, global batch 1024, seq 4096
CLUSTER = cluster(a100(), 128)
JOB = job(MODEL)


def _why(**kw) -> list[str]:
    return layout_violations(MODEL, CLUSTER, JOB, Layout(**kw))


def test_valid_layout_has_no_violations():
    assert _why(tp=8, pp=4, dp=4, zero=1, sp=True) == []


@pytest.mark.parametrize("kw,needle", [
    (dict(tp=8, pp=4, dp=2), "= 64, but the cluster has 128 GPUs"),
    (dict(tp=1, pp=128, dp=1), "pp=128 exceeds the 80 layers"),
    (dict(tp=8, pp=8, dp=2, vpp=11), "pp*vpp = 88 model chunks divide neither the 80 layers"),
    # 12 chunks: 80 % 12 = 8 and 82 % 12 = 10 (Megatron refuses the uneven interleaved split)
    (dict(tp=8, pp=4, dp=4, vpp=3), "pp*vpp = 12 model chunks divide neither the 80 layers"),
    # 1024 / (128 x 4) = 2 micro-batches, not a multiple of pp = 4
    (dict(tp=8, pp=4, dp=4, vpp=2, mbs=128), "2 micro-batches per step (grad_accum) divisible"),
    (dict(tp=8, pp=1, dp=16, vpp=2), "vpp=2 needs pp > 1"),
    (dict(tp=8, pp=4, dp=4, mbs=3), "global batch 1024 is not divisible by mbs*dp"),
    (dict(tp=8, pp=4, dp=4, ep=2), "needs a mixture-of-experts model"),
    (dict(tp=1, pp=4, dp=32, sp=True), "sp) needs tp > 1"),
])
def test_each_violation_says_why(kw, needle):
    reasons = _why(**kw)
    assert any(needle in r for r in reasons), reasons


def test_heads_and_sequence_divisibility():
    odd = ModelSpec(name="odd", num_hidden_layers=4, hidden_size=960, num_attention_heads=12,
                    num_key_value_heads=4, intermediate_size=2048, vocab_size=1000,
                    activation="swiglu", seq_len=1000, global_batch=8)
    why = layout_violations(odd, cluster(a100(), 8), job(odd), Layout(tp=8, dp=1))
    assert any("does not divide the 12 attention heads" in r for r in why)
    why = layout_violations(odd, cluster(a100(), 32), job(odd), Layout(tp=2, cp=16, dp=1))
    assert any("cp=16 does not divide the sequence length 1000" in r for r in why)
    why = layout_violations(odd, cluster(a100(), 16), job(odd), Layout(tp=2, cp=8, dp=1))
    assert any("needs an even chunk per rank (s/cp = 125" in r for r in why)


def test_estimate_raises_layout_error_with_all_reasons():
    with pytest.raises(LayoutError) as err:
        estimate(MODEL, CLUSTER, JOB, Layout(tp=16, pp=4, dp=4, mbs=3))
    text = str(err.value)
    assert "mbs*dp" in text and "= 256, but the cluster has 128 GPUs" in text


def test_tp_beyond_the_nvlink_domain_is_estimated_with_a_warning():
    """tp 16 on 8-GPU nodes runs (Megatron allows it; DLPerf's tp 16/32 rows ran it): estimate
    answers with a warning and the TP collectives go over the network, slower per byte than
    NVLink. solve leaves it out unless asked."""
    from planner.costmodel.checks import layout_warnings
    from planner.search import enumerate_layouts

    wide = Layout(tp=16, pp=2, dp=4, zero=1, recompute="selective", sp=True)
    assert _why(**wide.as_dict()) == []
    (line,) = layout_warnings(CLUSTER, wide)
    assert "tp=16 spans 2 NVLink domains of 8 GPUs" in line and "--tp-across-nodes" in line
    assert layout_warnings(CLUSTER, Layout(tp=8, pp=4, dp=4)) == []
    narrow = Layout(tp=8, pp=4, dp=4, zero=1, recompute="selective", sp=True)
    t16 = estimate(MODEL, CLUSTER, JOB, wide).time_tp_comm_s
    t8 = estimate(MODEL, CLUSTER, JOB, narrow).time_tp_comm_s
    # per GPU, pp 2 holds twice the layers of pp 4 (40 vs 20) and each collective moves 15/16
    # instead of 7/8 of the same b s h tensor: 2 x (15/16) / (7/8) = 2.14x the bytes; the rest
    # is the slower network tier (hierarchical: 8 HDR NICs per domain, planner.costmodel.comm)
    assert t16 > 2 * (15 / 16) / (7 / 8) * t8
    assert max(enumerate_layouts(MODEL, CLUSTER, JOB, {})["tp"]) == 8
    assert max(enumerate_layouts(MODEL, CLUSTER, JOB, {}, tp_across_nodes=True)["tp"]) == 64


def test_interleaving_accepts_layers_plus_two():
    # a 126-layer model (Llama 3 405B): pp 16 x vpp 8 = 128 chunks = 126 + 2
    big = MODEL.model_copy(update={"num_hidden_layers": 126})
    lo = Layout(tp=8, pp=16, dp=1, vpp=8, mbs=1)
    assert layout_violations(big, CLUSTER, JOB, lo) == []


def test_search_rules_come_from_checks():
    from planner.costmodel import checks
    from planner.search.exhaustive import enumerate_structures

    for tp, pp, dp, cp, ep, etp, vpp, mbs in enumerate_structures(MODEL, CLUSTER, JOB, {}):
        # chunks the flags cannot split evenly carry a layout string's layers per virtual stage
        lo = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                    stage_layers=checks.layout_string_chunks(MODEL.num_hidden_layers, pp, vpp))
        assert layout_violations(MODEL, CLUSTER, JOB, lo) == [], lo
    assert checks.vpp_allowed(80, 4, 2) and not checks.vpp_allowed(80, 4, 3)

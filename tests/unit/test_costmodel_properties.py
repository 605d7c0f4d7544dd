"""Properties of the cost model over random layouts (hypothesis)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from costmodel_fixtures import a100, cluster, job, llama_like
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.costmodel import Estimate, estimate, estimate_batch, layout_violations
from planner.layout import Layout
from planner.plan import MEM_COLUMNS, TIME_COLUMNS
from planner.specs import ModelSpec

GPU = a100()
BIG = cluster(GPU, 4096)  # estimate_batch does not check the GPU count
MODELS = [
    llama_like(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, global_batch=256),
    ModelSpec(name="gpt-ish", num_hidden_layers=24, hidden_size=2048, num_attention_heads=16,
              intermediate_size=8192, vocab_size=50304, activation="gelu", norm="layernorm",
              position_embedding="learned", max_position_embeddings=2048, seq_len=2048,
              global_batch=512),
    ModelSpec(name="moe-ish", num_hidden_layers=16, hidden_size=2048, num_attention_heads=16,
              num_key_value_heads=4, intermediate_size=8192, vocab_size=32000,
              activation="swiglu", num_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=4096, seq_len=4096, global_batch=256),
]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw, even_pp: bool = False):
    model = draw(st.sampled_from(MODELS))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp_choices = [p for p in (1, 2, 4, 8) if model.num_hidden_layers % p == 0] if even_pp \
        else list(range(1, 9))
    pp = draw(st.sampled_from(pp_choices))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if model.is_moe and (dp * cp) % e == 0]
                              or [1]))
    vpps = [v for v in (1, 2) if v == 1 or (pp > 1 and model.num_hidden_layers % (pp * v) == 0)]
    vpp = draw(st.sampled_from(vpps))
    mbs = draw(st.sampled_from([m for m in (1, 2, 4) if model.global_batch % (m * dp) == 0]))
    lo = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs,
                zero=draw(st.integers(0, 3)),
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                sp=tp > 1 and draw(st.booleans()))
    return model, lo


def _one(model: ModelSpec, lo: Layout, **job_kw) -> dict:
    cols = estimate_batch(model, BIG, job(model, **job_kw), [lo])
    return {k: v[0] for k, v in cols.items()}


@SETTINGS
@given(cases())
def test_time_terms_non_negative_and_add_up(case):
    model, lo = case
    row = _one(model, lo)
    terms = [row[c] for c in TIME_COLUMNS]
    assert all(t >= 0 for t in terms)
    assert sum(terms) == pytest.approx(row["step_time_s"], rel=1e-12)
    mem = [row[c] for c in MEM_COLUMNS]
    assert all(m >= 0 for m in mem)
    assert sum(mem) == pytest.approx(row["peak_mem_gb"], rel=1e-12)
    assert row["step_time_low_s"] <= row["step_time_s"] <= row["step_time_high_s"]


@SETTINGS
@given(cases())
def test_estimate_equals_estimate_batch(case):
    model, lo = case
    cl = cluster(GPU, lo.num_gpus)
    assume(not layout_violations(model, cl, job(model), lo))
    est = estimate(model, cl, job(model), lo)
    others = [dataclasses.replace(lo, mbs=1), dataclasses.replace(lo, zero=(lo.zero + 1) % 4)]
    cols = estimate_batch(model, cl, job(model), [*others, lo])
    assert est == Estimate.from_batch(cols, 2)


@SETTINGS
@given(cases())
def test_memory_never_grows_with_more_tp(case):
    model, lo = case
    if lo.tp == 8:
        return
    more = dataclasses.replace(lo, tp=lo.tp * 2, sp=lo.sp or lo.tp == 1)
    assert _one(model, more)["peak_mem_gb"] <= _one(model, lo)["peak_mem_gb"] * (1 + 1e-12)


@SETTINGS
@given(cases(even_pp=True))
def test_memory_never_grows_with_more_pp(case):
    """Plain 1F1B with even splits: each stage keeps ~L layers of activations in flight while
    its weights shrink. (Interleaving adds (pp-1)/(pp v) activations per stage as pp grows, and
    uneven splits can put ceil(L/pp) layers on a stage with pp-1 in flight: both excluded.)"""
    model, lo = case
    lo = dataclasses.replace(lo, vpp=1)
    more = dataclasses.replace(lo, pp=lo.pp * 2)
    if model.num_hidden_layers % more.pp:
        return
    assert _one(model, more)["peak_mem_gb"] <= _one(model, lo)["peak_mem_gb"] * (1 + 1e-12)


@SETTINGS
@given(cases(), st.integers(0, 2))
def test_memory_never_grows_with_a_higher_zero_stage(case, zero):
    """From ZeRO-2 to 3 the three live unsharded layers must be paid for by sharding the
    weights: true once the stage holds a few layers and the DP group has >= 4 ranks."""
    model, lo = case
    lo = dataclasses.replace(lo, zero=zero)
    if zero == 2 and (lo.dp * lo.cp < 4 or model.num_hidden_layers // lo.pp < 4):
        return
    higher = dataclasses.replace(lo, zero=zero + 1)
    assert _one(model, higher)["peak_mem_gb"] <= _one(model, lo)["peak_mem_gb"] * (1 + 1e-12)


@SETTINGS
@given(cases())
def test_more_micro_batches_never_grow_the_bubble(case):
    """Same global batch cut into twice the micro-batches (half the mbs)."""
    model, lo = case
    if lo.mbs == 1:
        lo = dataclasses.replace(lo, mbs=2)
        if model.global_batch % (2 * lo.dp):
            return
    more = dataclasses.replace(lo, mbs=lo.mbs // 2)
    a, b = _one(model, lo), _one(model, more)
    assert b["grad_accum"] == 2 * a["grad_accum"]
    assert b["time_pp_bubble_s"] <= a["time_pp_bubble_s"] * (1 + 1e-12)
    frac = lambda r: r["time_pp_bubble_s"] / r["time_compute_s"]  # noqa: E731
    assert frac(b) <= frac(a) * (1 + 1e-12)


def test_batch_is_vectorized_not_a_loop():
    """Many layouts in one call give the same numbers as one at a time."""
    model = MODELS[0]
    los = [Layout(tp=t, pp=p, dp=d, mbs=1, zero=z, recompute="selective", sp=t > 1)
           for t in (1, 2, 8) for p in (1, 2, 4) for d in (1, 4) for z in (0, 1, 3)]
    cols = estimate_batch(model, BIG, job(model), los)
    for i in (0, 7, len(los) - 1):
        single = estimate_batch(model, BIG, job(model), [los[i]])
        for key, values in single.items():
            assert np.array_equal(values[0], cols[key][i]), key


def test_no_layouts_give_empty_columns():
    cols = estimate_batch(MODELS[0], BIG, job(MODELS[0]), [])
    assert "step_time_s" in cols and all(len(v) == 0 for v in cols.values())

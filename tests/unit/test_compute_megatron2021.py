"""Compute-side terms of JobSpec.software "megatron-2021" (NVIDIA/Megatron-LM @ 8aa4619, the
commit of DLPerf's V100 runs), checked against hand computations on a flat GPU (HBM 1 TB/s,
efficiency 1): the dropout over the unfused s x s probabilities and the step's memory passes."""

from __future__ import annotations

import pytest
from costmodel_fixtures import cluster, flat_gpu, gpt3_175b, job

from planner.costmodel import estimate
from planner.layout import Layout


@pytest.mark.parametrize("recompute,passes", [
    ("none", 2),  # forward 5 B + backward 5 B per score
    ("selective", 3),  # the attention core (its dropout with it) runs forward again
    ("full", 3),  # the whole layer forward again
])
def test_attention_dropout_bytes_by_hand(recompute, passes):
    """GPT-3 175B, t = 8, one micro-batch of s = 2048: the dropout reads the 2-byte score and
    writes a 2-byte output and a 1-byte mask (5 B) per score of the b x a/t x s x s tensor, its
    backward reads the gradient and the mask and writes 2 B (5 B). Against the same job with
    the current software (no dropout): L x passes x 5 x s^2 a / t bytes at 1 TB/s."""
    model = gpt3_175b()
    gpu = flat_gpu(tflops=100.0, eff=0.5, memory_gib=10_000)
    s, a, L, t = 2048, 96, 96, 8
    lo = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute=recompute, sp=False)
    cl = cluster(gpu, 8)
    base = job(model, global_batch=1, attention="unfused", precision="fp16")
    old = estimate(model, cl, base.model_copy(update={"software": "megatron-2021"}), lo)
    new = estimate(model, cl, base, lo)
    per_pass = 5 * s * s * a / t / 1e12  # seconds of one dropout pass over one layer's scores
    expected = L * passes * per_pass
    assert old.time_compute_s - new.time_compute_s == pytest.approx(expected, rel=1e-9)


def test_no_dropout_bytes_with_flash_attention():
    """Flash kernels apply dropout inside the kernel: the software's dropout adds no time."""
    model = gpt3_175b()
    gpu = flat_gpu(tflops=100.0, eff=0.5, memory_gib=10_000)
    lo = Layout(tp=8, pp=1, dp=1, mbs=1, zero=0, recompute="full", sp=False)
    cl = cluster(gpu, 8)
    base = job(model, global_batch=1, precision="fp16")
    old = estimate(model, cl, base.model_copy(update={"software": "megatron-2021"}), lo)
    assert old.time_compute_s == pytest.approx(estimate(model, cl, base, lo).time_compute_s)


def test_step_passes_by_hand():
    """Per local parameter and step, Megatron-LM 2021 moves (megatron/model/distributed.py
    allreduce_params; megatron/optimizer/optimizer.py FP16OptimizerWithFP16Params.step):
    flatten the 16-bit grads 2 + 2, scale by 1/dp 2 + 2, copy back 2 + 2; 16-bit grad to fp32
    main grad 2 + 4; unscale and inf check 4 + 4; grad norm 4; FusedAdam 16 + 12; fp32 master
    to 16-bit param 4 + 2: 64 B, where the fused Adam pass of current software moves 30 B."""
    model = gpt3_175b()
    gpu = flat_gpu(tflops=100.0, eff=0.5, memory_gib=10_000)
    t = 8
    lo = Layout(tp=t, pp=1, dp=1, mbs=1, zero=0, recompute="full", sp=False)
    cl = cluster(gpu, 8)
    base = job(model, global_batch=1, attention="unfused", precision="fp16")
    old = estimate(model, cl, base.model_copy(update={"software": "megatron-2021"}), lo)
    new = estimate(model, cl, base, lo)
    megatron_2021 = (2 + 2) + (2 + 2) + (2 + 2) + (2 + 4) + (4 + 4) + 4 + (16 + 12) + (4 + 2)
    assert megatron_2021 == 64
    local = model.num_params / t
    assert new.time_optimizer_s == pytest.approx(local * 30 / 1e12, rel=1e-3)
    assert old.time_optimizer_s == pytest.approx(local * megatron_2021 / 1e12, rel=1e-3)

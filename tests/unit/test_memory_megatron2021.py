"""Memory terms checked by hand against the code that decides them: Megatron-LM before July 2021
(JobSpec.software "megatron-2021", NVIDIA/Megatron-LM @ 8aa4619, the commit DLPerf's V100 runs
name), the optimizer step's fp32 gradients at ZeRO 0, and full recompute's rebuilt layer beside
the LM head's logits (planner/costmodel/memory.py comments cite the sources)."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_fixtures import cluster, flat_gpu, gpt3_175b, job, llama_like

from planner.costmodel import estimate, memory
from planner.layout import Layout
from planner.measured.runs import PUBLISHED_RUNS_CSV, load_table

GIB = 2**30
MIB = 2**20


def _gpt(**overrides):
    """DLPerf's GPT (1536x16): h 1536, 16 layers, 16 heads, GELU 4h, GPT-2 vocabulary, tied."""
    fields = dict(num_hidden_layers=16, hidden_size=1536, num_attention_heads=16,
                  intermediate_size=4 * 1536, vocab_size=50257, tie_word_embeddings=True)
    fields.update(overrides)
    return gpt3_175b(**fields)


def test_step_fp32_gradients_are_whole_at_zero_0():
    """The "half" recipe casts gradients to fp32 at the step: over the DP group where the
    optimizer state is sharded (ZeRO >= 1), every parameter's at ZeRO 0 (the optimizer steps
    all of them)."""
    assert memory.step_grad_bytes(8, "half", 0) == 4.0
    assert memory.step_grad_bytes(8, "half", 1) == 0.5
    assert memory.step_grad_bytes(np.array([8, 8]), "half", np.array([0, 2])).tolist() == [4, 0.5]
    # in an estimate: a short sequence (activations below the shard), tp 8, dp 8, ZeRO 0
    model = llama_like()
    est = estimate(model, cluster(flat_gpu(memory_gib=10_000), 64),
                   job(model, grad_dtype="half", seq_len=16),
                   Layout(tp=8, pp=1, dp=8, mbs=1, zero=0, recompute="none", sp=True))
    p = model.num_params / 8
    assert est.mem_other_gb * GIB == pytest.approx(4 * p - est.mem_activations_gb * GIB)


def test_full_recompute_logits_and_rebuilt_layer_do_not_coexist():
    """One GPU, full recompute, flash attention, no dropout: the stored layer inputs (2h per
    token and layer), the input ids (8 B per token), and the larger of the LM head's input and
    fp32 logits (4h + 4V per token) and the layer rebuilt in the backward (Korthikanti's 34h
    less its two 1-byte dropout masks, flash's fp32 statistics for the score term: 32h + 4a)."""
    for vocab in (256_000, 1_024):  # the logits larger, then the rebuilt layer larger
        model = _gpt(vocab_size=vocab, tie_word_embeddings=False)
        s, h, a, L = 2048, 1536, 16, 16
        est = estimate(model, cluster(flat_gpu(memory_gib=10_000), 1),
                       job(model, global_batch=1, seq_len=s),
                       Layout(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="full"))
        head, rebuilt = 4 * h + 4 * vocab, 32 * h + 4 * a
        expected = s * (L * 2 * h + 8 + max(head, rebuilt))
        assert est.mem_activations_gb * GIB == pytest.approx(expected)


def test_megatron_2021_memory_by_hand():
    """DLPerf's 1-GPU row (GPT 1536x16, mbs 2, seq 2048, fp16, full recompute, unfused
    attention) under Megatron-LM @ 8aa4619: per parameter 2 (fp16 weights) + 2 (fp16 .grad) +
    4 (fp32 main grad, kept) + 12 (fp32 master, Adam m, v) = 20 B; activations: 16 stored layer
    inputs (2h), the input ids (8) and the embedding's dropout mask (h) per token, and the larger
    of the head (4h + 4V) and the rebuilt layer with dropout (Korthikanti's 34h + 5as); after
    the backward local DDP's flat fp16 copy of the grads (2 B per parameter) replaces the
    activations; the eager CUDA context (1573 MiB measured) beyond the profiles' 300 MiB."""
    model = _gpt()
    s, b, h, a, L, V = 2048, 2, 1536, 16, 16, 50257
    lo = Layout(tp=1, pp=1, dp=1, mbs=2, zero=0, recompute="full")
    cl = cluster(flat_gpu(memory_gib=10_000), 1)
    jb = job(model, global_batch=2, seq_len=s, precision="fp16", attention="unfused",
             software="megatron-2021")
    est = estimate(model, cl, jb, lo)
    p = model.num_params
    assert est.mem_weights_gb * GIB == pytest.approx(2 * p)
    assert est.mem_grads_gb * GIB == pytest.approx(6 * p)
    assert est.mem_optimizer_gb * GIB == pytest.approx(12 * p)
    act = s * b * (L * 2 * h + 8 + h + max(4 * h + 4 * V, 34 * h + 5 * a * s))
    assert est.mem_activations_gb * GIB == pytest.approx(act)
    other = max(0.0, 2 * p - act) + (1573 - 300) * MIB
    assert est.mem_other_gb * GIB == pytest.approx(other)
    assert est.peak_mem_gb * GIB == pytest.approx(20 * p + act + other)
    # tiny activations (a short sequence): the flat copy decides, 22 B per parameter
    short = estimate(model, cl, jb.model_copy(update={"seq_len": 64}), lo)
    assert short.peak_mem_gb * GIB == pytest.approx(22 * p + (1573 - 300) * MIB)


def test_dlperf_rows_are_megatron_2021_with_tied_embeddings():
    """DLPerf's rows run Megatron-LM @ 8aa4619 (the megatron-lm-2021 stack's software), whose GPT
    ties the LM head to the word embedding (gpt_model.py parallel_lm_logits with
    word_embeddings_weight): the count of DLPerf's formula, 12 L h^2 + 13 L h + (V + s) h, here
    with the unpadded vocabulary and no position table as the model counts them, within 0.2%
    (an untied head would add V h, 7-31% of these models)."""
    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    dlperf = [r for r in runs if r.source_id == "dlperf_megatron_v100"]
    assert len(dlperf) == 18
    for run in dlperf:
        assert run.job.software == "megatron-2021" and run.model.tie_word_embeddings
        L, h = run.model.num_hidden_layers, run.model.hidden_size
        stated = 12 * L * h * h + 13 * L * h + 50257 * h
        assert run.model.num_params == pytest.approx(stated, rel=0.002)

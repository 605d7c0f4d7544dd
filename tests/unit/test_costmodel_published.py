"""Iteration times Korthikanti et al. 2022 measured (Table 5; Megatron-LM on Selene, A100 80GB,
seq 2048, micro-batch 1; model shapes and layouts from their Table 3), predicted with an
uncalibrated A100 profile built from docs/hardware.md numbers (no SM count: no GEMM quantization)
and the attention Megatron-LM ran in 2022 (unfused: its fused scale-mask-softmax, no flash
attention). Calculon reproduces the same eight points with a 3.65% mean error, 8.87% max
(docs/hardware.md section 4); this model: 2.6% mean, 6.3% max."""

from __future__ import annotations

from costmodel_fixtures import a100, cluster

from planner.costmodel import estimate
from planner.layout import Layout
from planner.specs import JobSpec, ModelSpec

# name, hidden, heads, layers, tp, pp, GPUs, global batch, measured s (full, seq + selective)
TABLE = [
    ("22B", 6144, 64, 48, 8, 1, 8, 4, 1.42, 1.10),
    ("175B", 12288, 96, 96, 8, 8, 64, 64, 18.13, 13.75),
    ("530B", 20480, 128, 105, 8, 35, 280, 280, 49.05, 37.83),
    ("1T", 25600, 160, 128, 8, 64, 512, 512, 94.42, 71.49),
]


def table5_estimates() -> list[tuple[float, object]]:
    """(measured s, this model's Estimate) for each TABLE row, full and selective recompute
    (benchmarks/term_split.py and test_ties read the TP share from the same estimates)."""
    out = []
    for _, h, a, layers, tp, pp, n, batch, full, selective in TABLE:
        model = ModelSpec(name="gpt", num_hidden_layers=layers, hidden_size=h,
                          num_attention_heads=a, intermediate_size=4 * h, vocab_size=51200,
                          activation="gelu", norm="layernorm", position_embedding="learned",
                          max_position_embeddings=2048, linear_bias=True)
        job = JobSpec(seq_len=2048, global_batch=batch, attention="unfused")
        for recompute, measured in (("full", full), ("selective", selective)):
            lo = Layout(tp=tp, pp=pp, dp=n // (tp * pp), mbs=1, zero=1, recompute=recompute,
                        sp=recompute == "selective")
            out.append((measured, estimate(model, cluster(a100(), n), job, lo)))
    return out


def _errors() -> list[float]:
    errors = []
    for measured, est in table5_estimates():
        assert est.fits
        errors.append(est.step_time_s / measured - 1)
    return errors


def test_korthikanti_table5_iteration_times():
    errors = _errors()
    assert max(abs(e) for e in errors) < 0.0887  # Calculon's max on the same points
    assert sum(abs(e) for e in errors) / len(errors) < 0.0365  # and its mean

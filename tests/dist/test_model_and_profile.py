"""Fast checks of the validate package without torchrun: the torch model has exactly the
parameters the ModelSpec counts, scale-down keeps the architecture, and a profile built from
hand-made benchmark numbers has the values worked out here by hand and works with estimate."""

from __future__ import annotations

import math

import pytest

from planner.errors import LayoutError, SpecError
from planner.layout import Layout
from planner.registry import load_gpu, load_model, parse_cluster
from planner.specs import JobSpec
from planner.validate.config import ScaleDown, check_supported, require_supported, scaled_spec
from planner.validate.profile import build_profile, write_profile

SMALL = ScaleDown(layers=2, hidden=64, heads=4, ffn=96, vocab=160)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-1.3b", "gpt-neox-20b", "mixtral-8x7b",
                                  "qwen2.5-7b"])
def test_torch_model_has_the_spec_parameter_count(name: str) -> None:
    torch = pytest.importorskip("torch")
    from planner.validate.model import ModelArgs, Transformer

    spec = scaled_spec(load_model(name), SMALL)
    model = Transformer(ModelArgs.from_spec(spec, seq_len=32))
    counted = sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert counted == spec.num_params
    tokens = torch.randint(0, SMALL.vocab, (2, 32))
    assert model(tokens).shape == (2, 32, SMALL.vocab)


def test_scale_down_keeps_the_architecture() -> None:
    llama = load_model("llama3-8b")  # 32 heads, 8 KV heads (GQA 4:1)
    s = scaled_spec(llama, ScaleDown(layers=2, hidden=128, heads=8))
    assert (s.num_hidden_layers, s.hidden_size, s.num_attention_heads, s.kv_heads) == (2, 128, 8, 2)
    assert s.head_size == 16 and s.activation == llama.activation and s.norm == llama.norm
    assert s.vocab_size == llama.vocab_size and s.name == "llama3-8b-scaled"
    # by hand: attention 128*128*2 (q, o) + 2*128*32 (k, v) = 40960; SwiGLU 3*128*14336;
    # norms 2*128 per layer; embedding and untied head 2*128256*128; final norm 128
    per_layer = 2 * 128 * 128 + 2 * 128 * 32 + 3 * 128 * llama.intermediate_size + 2 * 128
    assert s.num_params == 2 * per_layer + 2 * llama.vocab_size * 128 + 128
    moe = scaled_spec(load_model("mixtral-8x7b"), SMALL)  # SwiGLU experts: kept (validate.moe)
    assert moe.is_moe and moe.num_experts == 8 and moe.expert_ffn == 96
    biased = scaled_spec(load_model("mixtral-8x7b").model_copy(update={"linear_bias": True}),
                         SMALL)  # biased experts are not built: the dense shape
    assert not biased.is_moe and biased.intermediate_size == 96
    assert scaled_spec(llama, ScaleDown()) == llama  # no override: the spec itself
    # gpt-oss alternates sliding (128 tokens) and full attention, sliding first: 3 layers keep
    # the first 3 of its 24 entries (it failed validation with the 24-entry list before)
    oss = scaled_spec(load_model("gpt-oss-20b"), ScaleDown(layers=3))
    assert oss.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert oss.sliding_window == 128


def test_unsupported_layouts_say_why() -> None:
    spec = scaled_spec(load_model("llama3-8b"), ScaleDown(layers=2, hidden=48, heads=3,
                                                          kv_heads=3))
    problems = check_supported(spec, Layout(tp=2, pp=4, cp=2), global_batch=6, seq_len=16,
                               backend="gloo")
    text = " | ".join(problems)
    assert "cp=2: torch's context parallelism (ring attention) has no CPU kernel" in text
    assert "tp=2 must divide the heads (3)" in text
    assert "pp*vpp=4 stages need at least as many layers (2)" in text
    assert "not divisible by mbs*dp" not in text
    assert check_supported(spec, Layout(), 6, 16) == []
    assert check_supported(spec, Layout(cp=2), 6, 16, backend="nccl") == []
    assert "divisible by 2*cp" in check_supported(spec, Layout(cp=4), 6, 12, backend="nccl")[0]
    with pytest.raises(LayoutError, match="3 micro-batches per DP rank are fewer than pp=4"):
        require_supported(scaled_spec(spec, ScaleDown(layers=4)), Layout(pp=4), 3, 16)


def _raw() -> dict:
    """Benchmark numbers made up so that every derived value is easy to work out by hand."""
    ar = [[1024, 100e-6, 2 * 1024 * 0.5 / 100e-6], [2**20, 2e-3, 2 * 2**20 * 0.5 / 2e-3]]
    return {
        "world_size": 2, "nnodes": 1, "nproc_per_node": 2, "backend": "gloo",
        "threads_per_rank": 1, "hostname": "box", "device": "cpu test", "date": "2026-01-01",
        "torch_version": "x", "memory": {"total_bytes": 8 * 2**30, "reserved_bytes": 2**28},
        "gemm": {"float32": [[2 * 64**3, 1e9], [2 * 256**3, 4e9], [2 * 1024**3, 8e9]],
                 "bfloat16": [[2 * 64**3, 5e8]]},
        "attention": {"flop": 1e9, "flop_per_s": 4e9, "batch": 1, "heads": 4, "seq": 128,
                      "head_dim": 64, "dtype": "float32"},
        "copy_bytes_per_s": 4e9,
        "intra_node": {"all_reduce": ar, "all_gather": [], "reduce_scatter": []},
        "intra_node_send_recv": [[1024, 80e-6, 1024 / 80e-6], [2**20, 1e-3, 2**20 / 1e-3]],
    }


def test_profile_from_benchmarks_by_hand(tmp_path) -> None:
    prof = build_profile(_raw(), "cpu-test")
    assert prof.peak_bf16_tflops == pytest.approx(0.008)  # best fp32 GEMM, 8 GFLOP/s
    assert [y for _x, y in prof.gemm_efficiency.points] == [0.125, 0.5, 1.0]
    assert prof.attention_efficiency == pytest.approx(0.5)  # 4 / 8 GFLOP/s
    assert prof.memory_gib == 8 and prof.reserve_gib == pytest.approx(0.25, abs=1e-3)
    assert prof.hbm_tb_per_s == pytest.approx(0.004) and prof.gpus_per_node == 2
    # all-reduce of 1 KiB on 2 ranks in 100 us: busbw 2*1024*(1/2)/1e-4 B/s; 2 ring steps
    assert prof.intra_node.busbw_gb_per_s.points[0] == (1024, pytest.approx(0.01024))
    assert prof.intra_node.latency_us == 50 and prof.intra_node.base_latency_us == 30
    assert prof.intra_node.link_gb_per_s == pytest.approx(2**20 / 2e-3 / 1e9, rel=1e-3)
    assert prof.inter_node.busbw_gb_per_s == prof.intra_node.busbw_gb_per_s  # one node
    for field in ("peak_bf16_tflops", "gemm_efficiency", "attention_efficiency", "memory_gib",
                  "reserve_gib", "hbm_tb_per_s", "intra_node.busbw_gb_per_s", "dp_overlap"):
        assert prof.sources[field], field
    path = tmp_path / "cpu-test.yaml"
    write_profile(prof, path)
    assert load_gpu(str(path)) == prof  # round trip through the registry's loader
    from planner.costmodel import estimate

    cluster = parse_cluster(str(path))
    est = estimate(load_model("gpt3-1.3b"), cluster, JobSpec(seq_len=64, global_batch=4),
                   Layout(dp=2, zero=3))
    assert est.step_time_s > 0 and math.isfinite(est.step_time_s)
    # compute-bound sanity: 6 * params * tokens FLOP over 2 ranks at most at peak
    flop = 6 * load_model("gpt3-1.3b").num_params * 64 * 4
    assert est.step_time_s > flop / 2 / 8e9


def test_profile_needs_two_processes() -> None:
    raw = dict(_raw(), nproc_per_node=1, world_size=1)
    with pytest.raises(SpecError, match="at least 2 processes"):
        build_profile(raw, "x")

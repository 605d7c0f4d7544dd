"""Specs for the cost-model tests, built in code (independent of the built-in YAMLs).

gpt3_175b: Brown et al. 2020 Table 2.1 (96 layers, d_model 12288, 96 heads of 128, context
2048), ffn = 4 d_model, GeLU, LayerNorm, learned positions, biases; vocab 51200 (Megatron's
padded GPT-2 vocabulary, Narayanan 2021 sec. 5.1).
a100: A100-SXM4-80GB numbers of docs/hardware.md (312 TFLOP/s bf16 [S1],
80 GiB, 2.039 TB/s [S3], Azure square-GEMM sweep [S10], NVLink busbw plateau 231.6 GB/s [S10],
inter-node 24 GB/s per NIC = 192 GB/s / 8 [nccl #1576]).
flat_gpu: the same GPU with flat curves and negligible latency, so times can be computed by hand.
"""

from __future__ import annotations

from planner.specs import ClusterSpec, Curve, GpuProfile, JobSpec, LinkProfile, ModelSpec

TINY_US = 1e-9  # LinkProfile latencies must be positive; this one is negligible


def gpt3_175b(**overrides) -> ModelSpec:
    fields = dict(
        name="gpt3-175b-test", num_hidden_layers=96, hidden_size=12288, num_attention_heads=96,
        intermediate_size=4 * 12288, vocab_size=51200, activation="gelu", norm="layernorm",
        position_embedding="learned", max_position_embeddings=2048, linear_bias=True,
        seq_len=2048, global_batch=1536,
    )
    fields.update(overrides)
    return ModelSpec(**fields)


def llama_like(**overrides) -> ModelSpec:
    """Llama 2 70B shape (Touvron et al. 2023): 80 layers, h 8192, 64 heads, 8 KV, ffn 28672."""
    fields = dict(
        name="llama-like", num_hidden_layers=80, hidden_size=8192, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=28672, vocab_size=32000, activation="swiglu",
        norm="rmsnorm", seq_len=4096, global_batch=1024,
    )
    fields.update(overrides)
    return ModelSpec(**fields)


def _flat(y: float) -> Curve:
    return Curve(points=[(1.0, y), (1e18, y)])


def a100() -> GpuProfile:
    gemm = Curve(points=[(2 * 1024**3, 0.383), (2 * 2048**3, 0.711), (2 * 4096**3, 0.731),
                         (2 * 8192**3, 0.813), (2 * 16384**3, 0.822)])
    intra = LinkProfile(fabric="nvswitch", link_gb_per_s=300, latency_us=3.4, base_latency_us=8.4,
                        busbw_gb_per_s=Curve(points=[(1024, 0.04), (1048576, 36.2),
                                                     (67108864, 166.6), (8589934592, 231.6)]))
    inter = LinkProfile(fabric="ib hdr", link_gb_per_s=25, latency_us=14.0, base_latency_us=8.4,
                        busbw_gb_per_s=Curve(points=[(1024, 0.043), (1048576, 15.6),
                                                     (268435456, 23.9), (8589934592, 24.0)]))
    return GpuProfile(
        name="A100-test", peak_bf16_tflops=312, peak_fp16_tflops=312, memory_gib=80,
        hbm_tb_per_s=2.039, hbm_efficiency=0.82, reserve_gib=4.0, gemm_efficiency=gemm,
        attention_efficiency=0.575, gpus_per_node=8, intra_node_fabric="nvswitch",
        intra_node=intra, inter_node=inter, nic_gbit_per_s=200,
    )


def flat_gpu(tflops: float = 100.0, eff: float = 0.5, intra_gb: float = 100.0,
             inter_gb: float = 10.0, memory_gib: float = 80.0, **extra) -> GpuProfile:
    """Flat curves and negligible latency: every time is a hand computation."""
    fields = dict(
        name="flat", peak_bf16_tflops=tflops, peak_fp16_tflops=tflops, peak_fp8_tflops=2 * tflops,
        memory_gib=memory_gib, hbm_tb_per_s=1.0, hbm_efficiency=1.0, reserve_gib=0.0,
        gemm_efficiency=_flat(eff), attention_efficiency=eff, gpus_per_node=8,
        intra_node_fabric="nvswitch",
        intra_node=LinkProfile(fabric="x", link_gb_per_s=intra_gb, busbw_gb_per_s=_flat(intra_gb),
                               latency_us=TINY_US),
        inter_node=LinkProfile(fabric="y", link_gb_per_s=inter_gb, busbw_gb_per_s=_flat(inter_gb),
                               latency_us=TINY_US),
        nic_gbit_per_s=8 * inter_gb, dp_overlap=0.0,
    )
    fields.update(extra)
    return GpuProfile(**fields)


def cluster(gpu: GpuProfile, num_gpus: int) -> ClusterSpec:
    """num_gpus GPUs in nodes of the profile's size (smaller nodes when it does not divide)."""
    import math

    per = math.gcd(num_gpus, gpu.gpus_per_node)
    return ClusterSpec(gpu=gpu, num_nodes=num_gpus // per, gpus_per_node=per)


def job(model: ModelSpec, **overrides) -> JobSpec:
    fields = dict(seq_len=model.seq_len, global_batch=model.global_batch)
    fields.update(overrides)
    return JobSpec(**fields)

"""planner.measured.runs: published_runs.csv rows and validate records -> MeasuredRun."""

from __future__ import annotations

import json

import pytest
from calib_fixtures import a100_like

from planner.errors import SpecError
from planner.layout import Layout
from planner.measured.runs import (
    PUBLISHED_RUNS_CSV,
    gpu_name_of,
    load_records,
    load_runs,
    load_table,
    model_from_row,
    precision_of,
    step_time_of,
    zero_of,
)
from planner.stacks import recipe_of


def _resolver(name: str):
    """Every A100/H100 row resolves to the fixture profile (renamed) with the part's own dense
    peaks (H100 SXM: 989 BF16, 1979 FP8 TFLOP/s, NVIDIA datasheet), so no H100 row reads as
    faster than its peak; other GPUs are unknown."""
    if name.startswith(("A100", "H100")):
        gpu = a100_like(name)
        peak = 989.0 if name.startswith("H100") else gpu.peak_bf16_tflops
        return gpu.model_copy(update={"peak_fp8_tflops": 1979.0, "peak_bf16_tflops": peak,
                                      "peak_fp16_tflops": peak})
    raise SpecError(f"unknown GPU '{name}'")


@pytest.fixture(scope="module")
def table():
    runs, skipped = load_table(PUBLISHED_RUNS_CSV, resolve_gpu=_resolver)
    return {r.run_id: r for r in runs}, skipped


def test_labels_map_to_knobs():
    assert gpu_name_of("A100-SXM4-80GB (Jean Zay)") == "A100-SXM4-80GB"
    assert gpu_name_of("GB200 NVL72 (B200-class GPU)") == "GB200"
    assert precision_of("amp_bf16") == "bf16"
    assert precision_of("FP8-CS") == "fp8"
    assert precision_of("MXFP8") == "fp8"
    assert precision_of("NVFP4") is None
    assert precision_of("FP16") == "fp16"
    assert zero_of("FSDP FULL_SHARD (ZeRO-3)") == 3
    assert zero_of("FSDP SHARD_GRAD_OP (ZeRO-3)") == 2
    assert zero_of("ZeRO-1") == 1
    assert zero_of("ZeRO-0 (none)") == 0
    assert zero_of("DDP + (Megatron distributed optimizer likely; not stated)") is None


def test_every_row_is_loaded_or_skipped_with_a_reason(table):
    runs, skipped = table
    # the README's row count: 689 dense rows + 124 Megatron-Bridge, 4 dgxc and 6 NeMo
    # AutoModel MoE rows
    assert len(runs) + len(skipped) == 823
    assert all(s.reason for s in skipped)
    # GB200/GB300/B200/V100 have no profile in this resolver: skipped, not guessed
    assert not any(r.cluster.gpu.name.startswith(("GB", "B2", "V1")) for r in runs.values())


def test_llama3_8b_row(table):
    runs, _ = table
    run = runs["dgxc_benchmarking:639"]
    h, kv, ffn, v, n = 4096, 1024, 14336, 128256, 32  # Llama 3 8B, kv = 8 heads x 128
    by_hand = n * (2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h) + 2 * v * h + h
    assert run.model.activation == "swiglu"
    assert run.model.num_params == by_hand  # 8.030e9, the row's params_b is 8.03
    assert run.measured_step_time_s == pytest.approx(12.91)
    assert run.pins == {"tp": 1, "pp": 1, "dp": 4, "cp": 2, "mbs": 1}
    assert run.cluster.num_gpus == 8 and run.job.seq_len == 8192 and run.job.global_batch == 128
    assert run.layout is None  # zero and recompute are not stated: the search chooses


def test_mpt_row_derives_step_time_and_full_layout(table):
    runs, _ = table
    run = runs["llmfoundry_mpt_bench:231"]
    assert run.model.activation == "gelu"  # FFN 4h, 2 matrices (MPT)
    # global_batch x seq / (tokens/s/GPU x GPUs) = 3072 * 2048 / (9670 * 512)
    assert run.measured_step_time_s == pytest.approx(3072 * 2048 / (9670 * 512), rel=1e-4)
    assert run.layout == Layout(tp=1, pp=1, dp=512, cp=1, mbs=6, zero=3, recompute="none")
    assert run.cluster.num_nodes == 64


def test_oom_rows_are_labels(table):
    runs, _ = table
    oom = {rid for rid, r in runs.items() if r.oom}
    assert oom == {f"bloom_prequel:{i}" for i in (158, 165, 166, 200, 201, 215)}
    assert all(runs[i].measured_step_time_s is None for i in oom)


def test_step_time_from_throughput_when_no_time_column():
    row = {"global_batch": 64, "seq_len": 4096, "tokens_per_s_per_gpu": 1000.0, "num_gpus": 16}
    assert step_time_of(row) == pytest.approx(64 * 4096 / (1000 * 16))


def test_user_csv(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(
        "model,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,gpu_type,num_gpus,"
        "tp,pp,dp,cp,micro_batch,global_batch,zero_or_fsdp,recompute,precision,iteration_time_s\n"
        "mine,4,512,8,8,2048,1000,128,A100-SXM4-80GB,8,2,1,4,1,2,16,ZeRO-1,none,bf16,0.5\n")
    runs, skipped = load_table(path, resolve_gpu=_resolver)
    assert not skipped and len(runs) == 1
    assert runs[0].pins == {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "mbs": 2, "zero": 1,
                            "recompute": "none"}
    assert runs[0].layout is None  # sp is unknown with tp > 1: the search chooses it
    assert runs[0].measured_step_time_s == 0.5
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="not a runs table"):
        load_runs(bad, a100_like())


def test_validate_records(tmp_path):
    good = {"model_spec": {"name": "tiny", "num_hidden_layers": 2, "hidden_size": 64,
                           "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 128,
                           "activation": "swiglu"},
            "tp": 2, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "zero": 0,
            "recompute": "none", "sp": False, "seq_len": 32, "global_batch": 4,
            "world_size": 4, "measured_step_time_s": 0.25, "ok": True, "error": None}
    failed = dict(good, ok=False, error="rank 1 exited", measured_step_time_s=None)
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(failed) + "\n")
    runs, skipped = load_records(path, a100_like())
    assert len(runs) == 1 and len(skipped) == 1 and "rank 1 exited" in skipped[0].reason
    assert runs[0].layout == Layout(tp=2, dp=2)
    assert runs[0].cluster.num_gpus == 4 and runs[0].model.hidden_size == 64


def test_recipe_follows_the_framework():
    """Rules by framework: Megatron-DeepSpeed 2022 and Megatron-LM 2021 predate flash attention;
    DeepSpeed keeps 16-bit grads, plus an fp32 accumulator with its BF16_Optimizer; Megatron-LM
    2021's local DDP all-reduces the fp16 .grad (--fp32-allreduce off)."""
    assert recipe_of("Megatron-DeepSpeed", "Precision not stated (pre BF16-optimizer).") == {
        "attention": "unfused", "grad_dtype": "half", "grad_overlap": False,
        "p2p_overlap": False, "p2p_scatter_gather": True, "software": "deepspeed-2022"}
    assert recipe_of("Megatron-DeepSpeed", "BF16 with new BF16_Optimizer (fp32 grad ...)") == {
        "attention": "unfused", "grad_dtype": "half+fp32", "grad_overlap": False,
        "p2p_overlap": False, "p2p_scatter_gather": True, "software": "deepspeed-2022"}
    assert recipe_of("Megatron-LM (commit 8aa4619, 2021)", "") == {
        "attention": "unfused", "grad_reduce_dtype": "half", "grad_overlap": False,
        "p2p_overlap": False, "software": "megatron-2021"}
    assert recipe_of("NeMo Megatron 24.11 (Megatron-Core)", "") == {
        "attention": "cudnn", "tp_comm_overlap": True, "grad_dtype": "half"}
    assert recipe_of("NeMo (25.02 container)", "Recipe: gradients in fp32 (...)")[
        "grad_dtype"] == "auto"
    assert recipe_of("Megatron-Bridge / NeMo 26.06 (Megatron-Core)", "") == {
        "attention": "cudnn", "tp_comm_overlap": True, "grad_dtype": "half"}
    assert recipe_of("MaxText (JAX/XLA on GPU)", "") == {"attention": "cudnn"}
    assert recipe_of("MosaicML Composer/llm-foundry (PyTorch FSDP)", "") == {}


def test_bloom_rows_carry_the_deepspeed_recipe(table):
    runs, _ = table
    bloom = [r for r in runs.values() if r.source_id == "bloom_prequel"]
    assert bloom and all(r.job.attention == "unfused" for r in bloom)
    assert {r.job.grad_dtype for r in bloom} == {"half", "half+fp32"}


def test_megatron_lm_2021_rows_run_without_zero():
    """Megatron-LM of 2021 had no distributed optimizer: its rows pin ZeRO 0 and an exposed
    gradient all-reduce (built-in V100 profile)."""
    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    old = [r for r in runs if r.source_id == "dlperf_megatron_v100"]
    assert len(old) == 18
    assert all(r.pins.get("zero") == 0 and not r.job.grad_overlap for r in old)


# ---- the model a runs table states exactly (issue 16 section 4) ---------------------------------

HEADER = ("model,params_b,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,gpu_type,num_gpus,"
          "tp,pp,dp,micro_batch,global_batch,zero_or_fsdp,recompute,precision,iteration_time_s")


def test_model_spec_column_names_the_model_exactly(tmp_path):
    """A tied-embedding SwiGLU model (not what a parameter count suggests): the model_spec column
    (a YAML path relative to the table, or a built-in name) gives it exactly; shape columns that
    contradict it are reported."""
    (tmp_path / "tied.yaml").write_text(
        "name: tied\nnum_hidden_layers: 4\nhidden_size: 512\nnum_attention_heads: 8\n"
        "intermediate_size: 2048\nvocab_size: 32000\nactivation: swiglu\n"
        "tie_word_embeddings: true\n")
    path = tmp_path / "runs.csv"
    row = "A100-SXM4-80GB,8,2,1,4,2,16,ZeRO-1,none,bf16,0.5"
    path.write_text(
        HEADER + ",model_spec\n"
        f"tied,,4,512,8,8,2048,32000,128,{row},tied.yaml\n"
        f"llama,,32,4096,32,8,14336,128256,128,{row},llama3-8b\n"
        f"llama,,32,4000,32,8,14336,128256,128,{row},llama3-8b\n")
    runs, skipped = load_table(path, resolve_gpu=_resolver)
    assert not skipped
    tied = runs[0].model
    assert (tied.activation, tied.tie_word_embeddings) == ("swiglu", True)
    # by hand: 4 layers x (4 h^2 attention + 3 h ffn SwiGLU + 2 h norms) + V h once + h final
    h, f = 512, 2048
    assert tied.num_params == 4 * (4 * h * h + 3 * h * f + 2 * h) + 32000 * h + h
    assert runs[1].model.name == "llama3-8b" and not runs[1].extra
    (line,) = runs[2].extra["warnings"]
    assert "row 3" in line and "hidden_size 4000 != 4096" in line


def test_activation_and_tie_columns_replace_the_guess(tmp_path):
    path = tmp_path / "runs.csv"
    row = "A100-SXM4-80GB,8,2,1,4,2,16,ZeRO-1,none,bf16,0.5"
    path.write_text(HEADER + ",activation,tie_word_embeddings\n"
                    f"m,1.0,4,512,8,8,2048,32000,128,{row},swiglu,true\n")
    (run,), _ = load_table(path, resolve_gpu=_resolver)
    assert (run.model.activation, run.model.tie_word_embeddings) == ("swiglu", True)
    assert not run.extra  # stated, nothing guessed


def test_a_guess_that_contradicts_the_named_model_is_reported(tmp_path):
    """GPT-3 1.3B ties its embeddings: from its shape and params_b the guess is an untied GELU
    model of 1.41 B parameters, and the model column names the built-in (1.32 B): a warning
    says they disagree."""
    path = tmp_path / "runs.csv"
    row = "A100-SXM4-80GB,8,2,1,4,2,16,ZeRO-1,none,bf16,0.5"
    path.write_text(HEADER + "\n"
                    f"gpt3-1.3b,1.3,24,2048,16,16,8192,50257,128,{row}\n")
    (run,), _ = load_table(path, resolve_gpu=_resolver)
    assert run.model.tie_word_embeddings is False and run.model.num_params == 1413912576
    (line,) = run.extra["warnings"]
    assert "disagrees with the built-in 'gpt3-1.3b'" in line and "model_spec" in line
    assert "gelu MLP, untied embeddings, 1.41 B" in line and "tied embeddings, 1.32 B" in line


def test_moe_rows_name_their_model_and_expert_parallelism(table):
    """Megatron-Bridge 26.04.01, Qwen3-235B-A22B on 256 H100 (FP8, TP 2 PP 8 VP 4 EP 32):
    the model_spec column gives the MoE spec (22.2B active of 235.1B), the ep column a pin."""
    runs, _ = table
    run = next(r for r in runs.values() if r.source_id == "megatron_bridge_moe"
               and r.model.name == "qwen3-235b-a22b" and r.cluster.gpu.name.startswith("H100"))
    assert run.model.num_experts == 128 and run.pins["ep"] == 32
    assert run.pins["tp"] == 2 and run.pins["pp"] == 8 and run.pins["vpp"] == 4
    # 8192 sequences of 4096 tokens at 1712 tokens/s/GPU on 256 GPUs
    assert run.measured_step_time_s == pytest.approx(8192 * 4096 / (1712 * 256), rel=1e-5)


def test_moe_rows_carry_the_recipe_their_notes_state(table):
    """The notes set the MoE recipe: every vendor row routes force-balanced (Megatron-Bridge's
    footnote, AutoModel's fake balanced gate); Megatron-Bridge 26.06's Qwen3-235B on GB300
    overlaps the EP communication with HybridEP (v0.5.0's QWEN3_235B_A22B_PRETRAIN_CONFIG_
    GB300_FP8_MX_V2); 26.04's (26.04-alpha branch) runs HybridEP without the overlap; dgxc's
    routing is not stated (a trained router's default)."""
    import pandas as pd

    from planner.measured.runs import PUBLISHED_RUNS_CSV, moe_recipe_of
    from planner.specs import JobSpec

    runs, _ = table
    by_id = {r.run_id: r for r in runs.values()}
    notes = pd.read_csv(PUBLISHED_RUNS_CSV).set_index("row_id")["notes"]
    base = JobSpec(seq_len=4096, global_batch=8)
    gb300_2606, gb300_2604 = (moe_recipe_of(base, notes[i]) for i in (855, 892))
    assert (gb300_2606.moe_routing, gb300_2606.moe_dispatcher, gb300_2606.moe_ep_overlap) == \
        ("force_balanced", "deepep", True)
    assert (gb300_2604.moe_routing, gb300_2604.moe_dispatcher, gb300_2604.moe_ep_overlap) == \
        ("force_balanced", "deepep", False)
    auto = by_id["nemo_automodel_moe:967"]
    assert auto.job.moe_routing == "force_balanced"
    assert auto.job.moe_dispatcher == "deepep" and not auto.job.moe_ep_overlap
    dgxc = by_id["dgxc_benchmarking_moe:960"]
    assert dgxc.job.moe_routing == "aux_loss" and not dgxc.job.moe_ep_overlap
    on = moe_recipe_of(base, "routing force-balanced. Recipe (per release): EP communication "
                             "overlapped (...); token dispatcher HybridEP (...).")
    assert (on.moe_routing, on.moe_dispatcher, on.moe_ep_overlap) == \
        ("force_balanced", "deepep", True)
    off = moe_recipe_of(base, "Routing not stated (not force-balanced). EP communication not "
                              "overlapped (...).")
    assert off == base


def test_moe_row_without_model_spec_is_refused():
    """The shape columns of Qwen3-235B-A22B build a dense 22B model: predicting the row as that
    model would count a tenth of its parameters; the row must name its model."""
    import pandas as pd

    frame = pd.read_csv(PUBLISHED_RUNS_CSV)
    row = frame[frame.row_id == 872].iloc[0].to_dict()
    assert row["model_spec"] == "qwen3-235b-a22b"
    row["model_spec"] = None
    with pytest.raises(SpecError, match="model_spec"):
        model_from_row(row)


def test_source_cluster_network_reaches_the_runs():
    """planner/data/source_clusters.yaml: DLPerf's nodes have one NIC per 8 GPUs (its README's
    nvidia-smi topology); the rows carry it, and a benchmark swapping the profile keeps it."""
    from planner.registry import load_gpu

    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    dlperf = [r for r in runs if r.source_id == "dlperf_megatron_v100"]
    assert len(dlperf) == 18
    tp16 = next(r for r in dlperf if r.pins.get("tp") == 16)
    assert tp16.cluster.num_nodes == 2 and tp16.cluster.nics_per_gpu == 1 / 8
    assert tp16.with_gpu(load_gpu("V100-SXM2-32GB")).cluster.nics_per_gpu == 1 / 8
    # Jean Zay's A100 nodes: 4 Omni-Path links of 100 Gb/s, the bandwidth of 2 HDR-200 NICs
    # (bigscience train/tr11-176B-ml/README.md "Hardware"), against the DGX A100's 8
    bloom = next(r for r in runs if r.source_id == "bloom_prequel")
    assert bloom.cluster.nics_per_node == 2 and bloom.cluster.nics_per_gpu == 2 / 8
    other = next(r for r in runs if r.source_id == "dgxc_benchmarking")
    assert other.cluster.nics_per_node is None
    assert other.cluster.nics_per_gpu == other.cluster.gpu.nics_per_gpu

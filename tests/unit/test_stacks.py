"""planner.stacks: presets, free-text resolution, recipe and efficiency factors."""

from __future__ import annotations

import pytest
from calib_fixtures import a100_like

from planner.errors import SpecError
from planner.layout import Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec
from planner.stacks import StackFactors, builtin_stacks, resolve_stack

# The issue's examples, as people write them, and the stack each one is (by the stacks' history:
# PTD-P is Narayanan et al. 2021; NeMo 24.07 runs Megatron-Core with Transformer Engine)
WRITTEN = {
    "Megatron-LM (PTD-P)": "megatron-lm-2021",
    "NeMo 24.07 (Megatron-Core)": "nemo",
    "torchtitan (PyTorch FSDP2/TP/PP/CP)": "torchtitan",
    "DeepSpeed ZeRO-3": "deepspeed",
    "Megatron-DeepSpeed": "megatron-deepspeed",
    "MosaicML Composer/llm-foundry (PyTorch FSDP)": "pytorch-fsdp",
    "Megatron-LM (commit 8aa4619, 2021)": "megatron-lm-2021",
    "Megatron-LM 2022": "megatron-lm-2022",
    "Megatron-Bridge / NeMo 26.02.01 (Megatron-Core)": "nemo",
    "MaxText (JAX/XLA on GPU)": "maxtext",
    "PAXML (JAX/XLA on GPU)": "maxtext",
    "Megatron-Core": "megatron-core",
    "": "megatron-core",
    "NEMO": "nemo",
}


@pytest.mark.parametrize(("text", "name"), list(WRITTEN.items()))
def test_free_text_resolves_to_its_stack(text, name):
    assert resolve_stack(text).name == name


def test_the_stacks_the_issue_names_are_covered():
    names = set(builtin_stacks())
    assert {"megatron-lm-2021", "megatron-lm-2022", "megatron-core", "nemo",
            "megatron-deepspeed", "deepspeed", "torchtitan", "pytorch-fsdp", "maxtext"} <= names
    for preset in builtin_stacks().values():  # every preset is found by its own name
        assert resolve_stack(preset.name) is preset
        assert preset.fitted == (preset.provenance.runs > 0)
        if not preset.fitted:  # no runs behind it: stock factors
            assert preset.factors == StackFactors()


def test_unknown_text_lists_the_presets():
    with pytest.raises(SpecError) as exc:
        resolve_stack("Horovod 0.19")
    message = str(exc.value)
    assert "unknown software stack 'Horovod 0.19'" in message
    assert all(name in message for name in builtin_stacks())


def test_recipe_and_text_rules():
    bridge = resolve_stack("Megatron-Bridge / NeMo 25.09 (Megatron-Core)")
    assert bridge.recipe_fields("Megatron-Bridge / NeMo 25.09") == {
        "attention": "cudnn", "tp_comm_overlap": True, "grad_dtype": "half"}
    assert bridge.recipe_fields("NeMo 24.09") == {"attention": "cudnn", "tp_comm_overlap": True,
                                                  "grad_dtype": "half"}
    assert bridge.recipe_fields("NeMo 25.02", "Recipe: gradients in fp32 (...)")[
        "grad_dtype"] == "auto"
    ds = resolve_stack("Megatron-DeepSpeed")
    assert ds.recipe_fields("", "BF16 with new BF16_Optimizer")["grad_dtype"] == "half+fp32"
    job = ds.job(JobSpec(seq_len=2048, global_batch=512))
    assert (job.attention, job.grad_overlap, job.p2p_overlap, job.software) == (
        "unfused", False, False, "deepspeed-2022")
    assert ds.layout_defaults == {"vpp": 1, "sp": False}


def _tiny() -> ModelSpec:
    return ModelSpec(name="t", num_hidden_layers=4, hidden_size=1024, num_attention_heads=8,
                     num_key_value_heads=8, intermediate_size=4096, vocab_size=32000,
                     seq_len=1024, global_batch=16, activation="gelu")


def test_factors_reach_the_cost_model():
    """A layer-pass overhead of 1 ms adds layers x (1 forward + 2 backward passes) x micro-batches
    per step on one pipeline stage with no recompute: 4 x 3 x 16 x 1 ms = 0.192 s. A GEMM scale
    of 0.5 halves every point of the curve."""
    from planner.costmodel import estimate

    gpu = a100_like()
    cluster = ClusterSpec(gpu=gpu, num_nodes=1, gpus_per_node=1)
    job = JobSpec(seq_len=1024, global_batch=16)
    layout = Layout(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none")
    preset = resolve_stack("megatron-core")
    slow = preset.model_copy(update={"factors": StackFactors(layer_overhead_us=1000.0)})
    base = estimate(_tiny(), cluster, job, layout).step_time_s
    over = estimate(_tiny(), cluster.model_copy(update={"gpu": slow.apply(gpu)}), job,
                    layout).step_time_s
    assert over - base == pytest.approx(4 * 3 * 16 * 1e-3, rel=1e-6)
    half = preset.model_copy(update={"factors": StackFactors(gemm_scale=0.5)}).apply(gpu)
    assert [y for _, y in half.gemm_efficiency.points] == pytest.approx(
        [0.5 * y for _, y in gpu.gemm_efficiency.points])
    assert "software_stack" in half.sources
    # stock factors leave the profile as it is; a calibrated profile keeps its own fit
    assert preset.apply(gpu) is gpu
    calibrated = gpu.model_copy(update={"provenance": {"calibrated_by": "planner calibrate"}})
    assert slow.profile_for(calibrated) is calibrated


def test_a_broken_preset_file_is_one_clear_error(tmp_path):
    from planner.registry import validate_as
    from planner.stacks import StackPreset

    data = resolve_stack("nemo").model_dump()
    data["factors"]["gemm_scale"] = "fast"
    with pytest.raises(SpecError, match="nemo.yaml: field 'factors.gemm_scale'"):
        validate_as(StackPreset, data, "software_stacks/nemo.yaml")


def test_table_rows_carry_their_stack():
    from planner.measured.runs import PUBLISHED_RUNS_CSV, load_table

    runs, _ = load_table(PUBLISHED_RUNS_CSV)
    by_source = {}
    for run in runs:
        by_source.setdefault(run.source_id, set()).add(run.stack)
    assert by_source["bloom_prequel"] == {"megatron-deepspeed"}
    assert by_source["dlperf_megatron_v100"] == {"megatron-lm-2021"}
    assert by_source["llmfoundry_mpt_bench"] == {"pytorch-fsdp"}
    assert by_source["megatron_bridge_perf_archive"] == {"nemo"}
    assert by_source["dgxc_benchmarking"] == {"nemo", "maxtext"}


def test_a_row_without_notes_gets_the_stacks_plain_recipe():
    """A runs row whose notes cell is empty (None, as pandas gives it) takes the stack's recipe
    without its notes rules (the fuzzer found a TypeError in the notes rule's search)."""
    from planner.specs import JobSpec
    from planner.stacks import resolve_stack

    preset = resolve_stack("Megatron-DeepSpeed")
    assert any(rule.where == "notes" for rule in preset.text_rules)
    job = JobSpec(seq_len=2048, global_batch=8)
    assert preset.job(job, "Megatron-DeepSpeed", None) == preset.job(job, "Megatron-DeepSpeed", "")
    assert preset.job(job, None, "BF16_Optimizer").grad_dtype == "half+fp32"


def test_llmfoundry_rows_that_say_triton_run_the_triton_kernel():
    """llm-foundry's MPT table ran attn_impl triton (its sweep.sh passes no --attn_impl and
    submit_benchmarks.py defaulted to triton, b2a43a147); the rows' notes say so and select the
    triton kernel. The stack named without that note keeps flash (llm-foundry's default since
    v0.7.0)."""
    preset = resolve_stack("llm-foundry")
    job = JobSpec(seq_len=2048, global_batch=8)
    notes = "MPT architecture (no biases, FlashAttention/triton); 12-step benchmark runs."
    assert preset.job(job, "MosaicML Composer/llm-foundry (PyTorch FSDP)", notes).attention == (
        "triton")
    assert preset.job(job, "llm-foundry", "").attention == "flash"
    assert preset.job(job, "llm-foundry", None).attention == "flash"

"""Launcher exports and imports (planner.launchers): every export uses only the launcher's own
keys, three published configurations are reproduced field by field, and export -> import ->
estimate gives the same layout and step time for every launcher."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
import yaml

from planner import JobSpec, Layout, estimate, load_model, parse_cluster
from planner.cli.solve_config import current_layout
from planner.errors import LayoutError
from planner.launchers import LAUNCHERS, LaunchPlan, export_plan, read_config, resolve
from planner.launchers.common import known_keys, unknown_keys
from planner.launchers.megatron import parse_args_text

DATA = Path(__file__).resolve().parents[1] / "data" / "launchers"


def plan(model: str, cluster: str, job: JobSpec, layout: Layout) -> LaunchPlan:
    m, c = load_model(model), parse_cluster(cluster)
    return LaunchPlan(m, c, job, layout, estimate(m, c, job, layout).step_time_s)


def test_known_key_lists_hold_the_launchers_names():
    assert "--tensor-model-parallel-size" in known_keys("megatron_lm")
    assert "--num-virtual-stages-per-pipeline-rank" in known_keys("megatron_lm")
    assert "--virtual-pipeline-model-parallel-size" not in known_keys("megatron_lm")
    assert "model.virtual_pipeline_model_parallel_size" in known_keys("megatron_bridge")
    assert "parallelism.data_parallel_shard_degree" in known_keys("torchtitan")
    assert "toml.training.local_batch_size" in known_keys("torchtitan")
    assert "training.local_batch_size" not in known_keys("torchtitan")  # moved to tokens in 2026
    assert "zero_optimization.stage" in known_keys("deepspeed")
    assert "--zero-stage" in known_keys("megatron_deepspeed")
    assert unknown_keys("megatron_lm", ["--tp", "--bf16"]) == ["--tp"]


LAYOUTS = [
    ("llama3-70b", "8x8xH100",
     JobSpec(seq_len=8192, global_batch=256, tp_comm_overlap=True, attention="cudnn",
             grad_dtype="half"),
     Layout(tp=4, pp=4, dp=2, cp=2, vpp=5, mbs=1, zero=1, recompute="none", sp=True)),
    ("gpt3-175b", "16x8xA100", JobSpec(seq_len=2048, global_batch=1536, precision="fp16",
                                       grad_overlap=False),
     Layout(tp=8, pp=16, dp=1, mbs=1, zero=0, recompute="full", sp=False)),
    ("llama3.1-405b", "16x8xH100",
     JobSpec(seq_len=8192, global_batch=256, precision="fp8", tp_comm_overlap=True),
     Layout(tp=8, pp=1, dp=16, mbs=2, zero=3, recompute="full", sp=True)),
    ("mixtral-8x7b", "8x8xH100", JobSpec(seq_len=4096, global_batch=512),
     Layout(tp=2, pp=4, dp=8, ep=8, mbs=1, zero=2, recompute="selective", sp=True)),
    ("llama2-7b", "1x8xA100", JobSpec(seq_len=4096, global_batch=64, p2p_overlap=False),
     Layout(tp=2, pp=2, dp=2, vpp=2, mbs=2, zero=1, recompute="selective", sp=True)),
    # MoE with leading dense layers and shared experts, MLA (Megatron: --moe-layer-freq pattern)
    ("deepseek-v3", "32x8xH100", JobSpec(seq_len=4096, global_batch=1024),
     Layout(tp=2, pp=8, dp=16, ep=16, mbs=1, zero=1, recompute="full", sp=True)),
]


def expressible(launcher: str, job: JobSpec, layout: Layout,
                form: str | None = None) -> tuple[JobSpec, Layout]:
    """The job and layout as the launcher can state them (what it cannot is warned about and
    written as a comment; those knobs are outside the round trip)."""
    if launcher == "deepspeed":  # DeepSpeed's recipe: 16-bit grads, no overlaps, no interleave
        job = job.model_copy(update=dict(
            grad_dtype="half", grad_overlap=False, p2p_overlap=False, tp_comm_overlap=False,
            p2p_scatter_gather=True, attention="flash",
            precision="bf16" if job.precision == "fp8" else job.precision))
        layout = Layout(**{**layout.as_dict(), "vpp": 1, "cp": 1, "dp": layout.dp * layout.cp,
                           "zero": min(layout.zero, 1) if layout.pp > 1 else layout.zero})
    if launcher == "torchtitan":  # FSDP2: ZeRO 0, 2, 3; bf16/fp8; FlashAttention-class kernels
        job = job.model_copy(update=dict(
            attention="flash", grad_dtype="auto", grad_overlap=True, p2p_overlap=True,
            precision="bf16" if job.precision == "fp16" else job.precision))
        layout = Layout(**{**layout.as_dict(), "zero": max(layout.zero, 2) if layout.zero else 0})
        if form == "toml":  # torchtitan <= v0.2.2 always pairs TP with sequence parallelism
            layout = Layout(**{**layout.as_dict(), "sp": layout.tp > 1})
    return job, layout


# every written form: each launcher's own, Megatron-Bridge recipe lines, torchtitan <= v0.2.2 TOML
FORMS = [(name, None) for name in LAUNCHERS] + [("nemo", "python"), ("torchtitan", "toml")]


@pytest.mark.parametrize(("launcher", "form"), FORMS, ids=[f"{n}-{f or 'default'}"
                                                           for n, f in FORMS])
@pytest.mark.parametrize("case", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_round_trip_export_import_estimate(launcher, form, case, tmp_path):
    name, cluster, job, layout = case
    job, layout = expressible(launcher, job, layout, form)
    if launcher == "deepspeed":  # the stages DeepSpeed's PipelineModule makes
        from planner.launchers.deepspeed import with_own_split

        layout = with_own_split(layout, load_model(name).num_hidden_layers)
    source = plan(name, cluster, job, layout)
    exported = export_plan(launcher, source, form)
    assert unknown_keys({"megatron": "megatron_lm", "nemo": "megatron_bridge",
                         "torchtitan": "torchtitan"}.get(launcher, "deepspeed"),
                        [k for k in exported.keys if not k.startswith("--")]
                        if launcher == "deepspeed" else exported.keys) == []
    path = tmp_path / "config"
    path.write_text(exported.text)
    if launcher in ("megatron", "deepspeed"):  # a script bash accepts
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    if launcher == "deepspeed":  # its ds_config heredoc is JSON with DeepSpeed's batch identity
        from planner.launchers.deepspeed import _heredoc_json

        config = _heredoc_json(exported.text)
        assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                              * config["gradient_accumulation_steps"]
                                              * layout.dp)
    imported = read_config(path)
    assert imported.launcher == launcher
    resolved = resolve(imported, None, source.cluster.gpu.name)  # a bare GPU name
    assert str(resolved.cluster) == str(source.cluster)
    assert resolved.model.model_dump() == source.model.model_dump()
    assert resolved.job == job
    back = current_layout(resolved.pins, resolved.cluster.num_gpus)
    if resolved.imported.stage_layers:  # a split other than the even rule (DeepSpeed's own)
        from dataclasses import replace

        back = replace(back, stage_layers=resolved.imported.stage_layers)
    assert back == layout
    again = estimate(resolved.model, resolved.cluster, resolved.job, back)
    assert again.step_time_s == source.step_time_s
    assert again.peak_mem_gb == estimate(source.model, source.cluster, job, layout).peak_mem_gb


def test_what_a_launcher_cannot_express_is_warned_and_commented():
    source = plan("gpt3-175b", "16x8xA100", JobSpec(seq_len=2048, global_batch=1536,
                                                    precision="fp16"),
                  Layout(tp=8, pp=16, dp=1, vpp=2, mbs=1, zero=1, recompute="none"))
    titan = export_plan("torchtitan", source)
    assert any("fp16" in w for w in titan.warnings)
    assert any("ZeRO-1" in w for w in titan.warnings)
    for warning in titan.warnings:
        assert f"# WARNING: {warning}" in titan.text
    # what DeepSpeed's pipeline engine cannot run is refused, not written with a warning
    with pytest.raises(LayoutError, match="no interleaved schedule"):
        export_plan("deepspeed", source)
    ds = export_plan("deepspeed", LaunchPlan(source.model, source.cluster, source.job,
                                             Layout(**{**source.layout.as_dict(), "vpp": 1})))
    assert any("fp16" in w or "grad_dtype" in w for w in ds.warnings)
    for warning in ds.warnings:
        assert f"# WARNING: {warning}" in ds.text


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_reduction_width_no_launcher_writes_is_warned(launcher):
    """JobSpec.grad_reduce_dtype (the megatron-lm-2021 stack's fp16 all-reduce) has no switch
    apart from the gradient buffer's dtype in any launcher: every export says so; auto, nothing."""
    job = JobSpec(seq_len=2048, global_batch=64, precision="fp16")
    lay = Layout(tp=8, pp=1, dp=2, mbs=1, zero=0, recompute="none")
    plain = export_plan(launcher, plan("gpt3-175b", "2x8xA100", job, lay))
    assert not any("grad_reduce_dtype" in w for w in plain.warnings)
    half = export_plan(launcher, plan("gpt3-175b", "2x8xA100",
                                      job.model_copy(update={"grad_reduce_dtype": "half"}), lay))
    [warning] = [w for w in half.warnings if "grad_reduce_dtype half" in w]
    assert f"# WARNING: {warning}" in half.text


# ---- golden: Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh ----
# tests/data/launchers/train_gpt3_175b_distributed.sh is the file of NVIDIA/Megatron-LM at
# d98e8a64ddf3 (last changed in 779c5b748dbc, 2026-07-10). Its layout: TP 8, PP 16, micro-batch 1,
# global batch 1536, fp16, seq 2048, GPT-3 175B (96 layers, hidden 12288, 96 heads); 128 GPUs
# (the script's NUM_NODES=1 is a placeholder, "Change for multinode config").
GPT3_FIELDS = {
    "--num-layers": "96", "--hidden-size": "12288", "--num-attention-heads": "96",
    "--seq-length": "2048", "--max-position-embeddings": "2048", "--micro-batch-size": "1",
    "--global-batch-size": "1536", "--fp16": True, "--tensor-model-parallel-size": "8",
    "--pipeline-model-parallel-size": "16",
}


def test_golden_megatron_gpt3_175b_script():
    published = parse_args_text((DATA / "train_gpt3_175b_distributed.sh").read_text())
    assert {k: published[k] for k in GPT3_FIELDS} == GPT3_FIELDS  # the file says what we typed
    source = plan("gpt3-175b", "16x8xA100", JobSpec(seq_len=2048, global_batch=1536,
                                                    precision="fp16", grad_overlap=False),
                  Layout(tp=8, pp=16, dp=1, mbs=1, zero=0, recompute="none", sp=False))
    ours = parse_args_text(export_plan("megatron", source).text)
    for key, value in GPT3_FIELDS.items():
        assert ours[key] == value, key
    assert ours["--ffn-hidden-size"] == "49152"  # the script leaves Megatron's default 4h
    assert ours["--nnodes"] == "16" or "NUM_NODES=16" in export_plan("megatron", source).text
    # and the published script read back: the same layout and model
    imported = read_config(DATA / "train_gpt3_175b_distributed.sh")
    resolved = resolve(imported, None, "16x8xA100")
    assert resolved.model.name == "gpt3-175b"
    assert current_layout(resolved.pins, 128) == source.layout
    assert (resolved.job.seq_len, resolved.job.global_batch, resolved.job.precision) == (
        2048, 1536, "fp16")


# ---- golden: Megatron-Bridge Llama 3 70B H100 performance recipe ----
# NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b,
# src/megatron/bridge/perf_recipes/llama/h100/llama3.py
# llama3_70b_pretrain_64gpu_h100_bf16_config on recipes/llama/h100/llama3.py
# llama3_70b_pretrain_32gpu_h100_bf16_config (values typed from those functions; the YAML form is
# tests/data/launchers/megatron_bridge_llama3_70b_64gpu_h100_bf16.yaml).
LLAMA70B_RECIPE = {
    "model.tensor_model_parallel_size": 4, "model.pipeline_model_parallel_size": 4,
    "model.context_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 5,
    "model.sequence_parallel": True, "model.seq_length": 8192, "model.vocab_size": 128256,
    "model.num_layers": 80, "model.hidden_size": 8192, "model.ffn_hidden_size": 28672,
    "model.num_attention_heads": 64, "model.num_query_groups": 8,
    "model.recompute_granularity": None, "train.global_batch_size": 256,
    "train.micro_batch_size": 1, "dataset.seq_length": 8192,
    "ddp.use_distributed_optimizer": True, "ddp.overlap_grad_reduce": True,
    "ddp.overlap_param_gather": True, "ddp.grad_reduce_in_fp32": False,
    "mixed_precision": "bf16_mixed", "comm_overlap.tp_comm_overlap": True,
}


def flat(data: dict) -> dict:
    """SECTION.FIELD -> value, the model's fields by their recipe names (cfg.model.FIELD): the
    YAML nests TransformerConfig's under model.transformer, as BridgeGPTModelConfig holds them
    (its __setattr__ forwards cfg.model.FIELD there)."""
    out = {}
    for section, body in data.items():
        if isinstance(body, dict):
            body = dict(body)
            body.update(body.pop("transformer", None) or {})
            body.pop("_target_", None)
            out.update({f"{section}.{k}": v for k, v in body.items()})
        else:
            out[section] = body
    return out


def test_golden_megatron_bridge_llama3_70b_recipe():
    source = plan("llama3-70b", "8x8xH100",
                  JobSpec(seq_len=8192, global_batch=256, tp_comm_overlap=True,
                          attention="cudnn", grad_dtype="half"),
                  Layout(tp=4, pp=4, dp=2, cp=2, vpp=5, mbs=1, zero=1, recompute="none",
                         sp=True))
    text = export_plan("nemo", source).text
    ours = flat(yaml.safe_load(text))
    for key, value in LLAMA70B_RECIPE.items():
        assert ours[key] == value, key
    assert "--nodes 8 --gpus-per-node 8" in text  # 64 GPUs
    # the recipe's own YAML reads back to the same layout, job and model
    resolved = resolve(read_config(DATA / "megatron_bridge_llama3_70b_64gpu_h100_bf16.yaml"),
                       None, "H100")
    assert str(resolved.cluster) == "8x8xH100-SXM"
    assert resolved.model.name == "llama3-70b"
    assert current_layout(resolved.pins, 64) == source.layout
    assert resolved.job == source.job
    # the recipe function itself (verbatim copy; its base recipe gives the 70B shape, seq 8192
    # and the distributed optimizer: --model and estimate's default zero 1 stand for them)
    recipe = read_config(DATA / "megatron_bridge_llama3_70b_64gpu_h100_bf16_recipe.py")
    from_recipe = resolve(recipe, "llama3-70b", "8x8xH100")
    assert current_layout(from_recipe.pins, 64) == source.layout
    assert from_recipe.job == source.job  # bf16, grads reduced in bf16, TP overlap, cuDNN


def test_megatron_bridge_python_form_round_trips(tmp_path):
    source = plan("llama3-70b", "8x8xH100",
                  JobSpec(seq_len=8192, global_batch=256, tp_comm_overlap=True,
                          attention="cudnn", grad_dtype="half"),
                  Layout(tp=4, pp=4, dp=2, cp=2, vpp=5, mbs=1, zero=1, recompute="full",
                         sp=True))
    text = export_plan("nemo", source, form="python").text
    ast.parse(text)
    assert "    cfg.model.tensor_model_parallel_size = 4" in text
    path = tmp_path / "overrides.py"
    path.write_text(text)
    resolved = resolve(read_config(path), None, "H100")
    assert current_layout(resolved.pins, 64) == source.layout
    assert resolved.job == source.job


# ---- golden: torchtitan's Llama 3 405B ----
# pytorch/torchtitan @ b5bcd76c66d0, torchtitan/models/llama3/config_registry.py
# llama3_405b:
# model_registry("405B", converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"])]),
# TrainingConfig(num_tokens_per_microbatch_per_dp_rank=2 * 8192, max_context_length=8192),
# ParallelismConfig(tensor_parallel_degree=8) (FSDP over the rest: data_parallel_shard_degree -1),
# activation_checkpoint=FullAC.Config(), CompileConfig(enable=True,
# enable_async_tensor_parallel=True). Its TOML ancestor (llama3_405b.toml at 9810191bbb03^, in
# tests/data/launchers) is "a preset for 128 H100 GPUs": 16 data-parallel shards.
TITAN_405B = {
    "training.num_tokens_per_microbatch_per_dp_rank": 2 * 8192,
    "training.max_context_length": 8192,
    "parallelism.tensor_parallel_degree": 8, "parallelism.pipeline_parallel_degree": 1,
    "parallelism.context_parallel_degree": 1, "parallelism.data_parallel_replicate_degree": 1,
    "parallelism.enable_sequence_parallel": True,  # ParallelismConfig's default
    "compile.enable": True, "compile.enable_async_tensor_parallel": True,
}


def titan_fields(text: str) -> tuple[dict, dict]:
    from planner.launchers.torchtitan import _python_sections

    sections, facts = _python_sections(text, "export")
    return flat(sections), facts


def test_golden_torchtitan_llama3_405b():
    source = plan("llama3.1-405b", "16x8xH100",
                  JobSpec(seq_len=8192, global_batch=32, precision="fp8", tp_comm_overlap=True),
                  Layout(tp=8, pp=1, dp=16, mbs=2, zero=3, recompute="full", sp=True))
    text = export_plan("torchtitan", source).text
    ast.parse(text)  # a valid Python module
    ours, facts = titan_fields(text)
    for key, value in TITAN_405B.items():
        assert ours[key] == value, key
    assert ours["parallelism.data_parallel_shard_degree"] == 16  # -1 = the rest of 128
    assert facts["flavor"] == "405B" and facts["family"] == "llama3"
    assert facts["ac"] == "FullAC" and facts["fp8"]
    assert 'filter_fqns=["lm_head"]' in text
    # the TOML form against the published TOML preset (torchtitan <= v0.2.2), field by field
    import tomllib

    published = tomllib.loads((DATA / "torchtitan_llama3_405b.toml").read_text())
    ours_toml = tomllib.loads(export_plan("torchtitan", source, "toml").text)
    for section, key in (("model", "name"), ("model", "flavor"), ("model", "converters"),
                         ("training", "local_batch_size"), ("training", "seq_len"),
                         ("parallelism", "data_parallel_replicate_degree"),
                         ("parallelism", "tensor_parallel_degree"),
                         ("parallelism", "enable_async_tensor_parallel"),
                         ("parallelism", "pipeline_parallel_degree"),
                         ("parallelism", "context_parallel_degree"),
                         ("activation_checkpoint", "mode"), ("compile", "enable")):
        assert ours_toml[section][key] == published[section][key], (section, key)
    assert published["parallelism"]["data_parallel_shard_degree"] == -1  # the rest: 128 / 8
    assert ours_toml["parallelism"]["data_parallel_shard_degree"] == 16
    assert ours_toml["quantize"]["linear"]["float8"]["filter_fqns"] == \
        published["quantize"]["linear"]["float8"]["filter_fqns"]
    # torchtitan's own llama3_405b (verbatim copy) and the TOML preset of torchtitan <= v0.2.2
    # read to the same layout and job on 128 H100
    for name in ("torchtitan_llama3_405b_config_registry.py", "torchtitan_llama3_405b.toml"):
        resolved = resolve(read_config(DATA / name), None, "16x8xH100")
        assert resolved.model.name == "llama3.1-405b", name
        assert current_layout(resolved.pins, 128) == source.layout, name
        assert resolved.job == source.job, name


def test_megatron_script_reader_resolves_variables_and_arrays():
    text = """GPUS=4
TP=${TP:-2}
ARGS=(
  --num-layers 2 --hidden-size 256 --num-attention-heads 4 --vocab-size 1000
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size 2
)
torchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py ${ARGS[@]} --bf16 --swiglu
"""
    args = parse_args_text(text)
    assert args["--tensor-model-parallel-size"] == "2"
    assert args["--nproc_per_node"] == "4"
    assert args["--bf16"] is True and args["--swiglu"] is True


def test_detection_refuses_other_files(tmp_path):
    from planner.errors import SpecError

    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(SpecError, match="not a launcher config"):
        read_config(path)


def test_moe_layer_pattern_round_trips_and_evaluates_nothing_else():
    from planner.launchers.megatron import layer_pattern, read_layer_pattern

    pattern = [0] * 3 + [1] * 58  # DeepSeek-V3: first_k_dense_replace 3
    assert layer_pattern(pattern) == "([0]*3+[1]*58)"
    assert read_layer_pattern("([0]*3+[1]*58)", 61) == (3, 1)
    assert read_layer_pattern("([0]+[1,0]*4+[1])", 10) == (1, 2)
    assert read_layer_pattern("2", 10) == (0, 2)  # one expert layer every 2
    assert read_layer_pattern("9**9**9", 61) is None
    assert read_layer_pattern("[0]*10000000000", 61) is None
    assert read_layer_pattern("__import__('os')", 61) is None


def test_megatron_default_ffn_follows_megatrons_rule():
    from planner.launchers.common import Imported
    from planner.launchers.megatron import read_args

    def ffn(text: str) -> int:
        return read_args(parse_args_text(text), Imported("megatron", "x")).shape[
            "intermediate_size"]

    # arguments.py validate_args: 4h; with SwiGLU int(4h * 2/3 / 64) * 64
    assert ffn("--num-layers 2 --hidden-size 4096 --num-attention-heads 32") == 16384
    assert ffn("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --swiglu") == 10880


def test_megatron_2021_fp32_allreduce_is_read_as_the_reduction_width():
    """Megatron-LM 2021's --fp32-allreduce casts the fp16 gradients to fp32 for the DP all-reduce
    only (8aa4619 distributed.py): the reduction's width, not the gradient buffer's; a script
    without it keeps auto (Megatron-LM 2021's fp16 all-reduce is the stack's recipe)."""
    from planner.launchers.common import Imported
    from planner.launchers.megatron import read_args

    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --fp16"
    job = read_args(parse_args_text(base + " --fp32-allreduce"), Imported("megatron", "x")).job
    assert job.get("grad_reduce_dtype") == "fp32" and "grad_dtype" not in job
    plain = read_args(parse_args_text(base), Imported("megatron", "x")).job
    assert "grad_reduce_dtype" not in plain


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_attention_variants_no_export_writes_are_warned(launcher):
    """gpt-oss-120b's sinks and sliding windows and Qwen3's q/k norms are not launcher
    arguments yet: every export says so in its warnings and as a comment, never silently."""
    oss = plan("gpt-oss-120b", "8x8xH100", JobSpec(seq_len=4096, global_batch=64),
               Layout(tp=1, pp=1, dp=64, ep=8, mbs=1, zero=1, recompute="none", sp=False))
    result = export_plan(launcher, oss)
    assert any("sinks" in w for w in result.warnings)
    assert any("sliding-window attention (18 of 36 layers, 128 tokens)" in w
               for w in result.warnings)
    for warning in result.warnings:
        assert f"# WARNING: {warning}" in result.text
    if result.text.startswith("#!"):
        assert result.text.split("\n")[1].startswith("#")
    qwen = plan("qwen3-8b", "1x8xH100", JobSpec(seq_len=4096, global_batch=64),
                Layout(tp=1, pp=1, dp=8, mbs=1, zero=1, recompute="none", sp=False))
    assert any("qk_norm" in w for w in export_plan(launcher, qwen).warnings)
    llama = plan("llama2-7b", "1x8xA100", JobSpec(seq_len=4096, global_batch=64),
                 Layout(tp=1, pp=1, dp=8, mbs=1, zero=1, recompute="none", sp=False))
    assert not any("not written" in w for w in export_plan(launcher, llama).warnings)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_triton_attention_is_exported_with_a_warning(launcher):
    """No launcher has llm-foundry's Triton FlashAttention kernel: a plan made with
    attention="triton" exports (as flash / FlashAttention-2) and says so, never silently."""
    p = plan("llama2-7b", "1x8xA100", JobSpec(seq_len=4096, global_batch=64, attention="triton"),
             Layout(tp=1, pp=1, dp=8, mbs=1, zero=1, recompute="none", sp=False))
    result = export_plan(launcher, p)
    assert any("triton" in w.lower() for w in result.warnings), result.warnings

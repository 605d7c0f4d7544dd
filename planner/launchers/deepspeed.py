"""DeepSpeed: a Megatron-DeepSpeed launch script that writes its ds_config.json (a heredoc, as the
repository's own examples_deepspeed/pretrain_llama2_distributed.sh does) and passes TP/PP and the
model as pretrain_gpt.py arguments; and reading such a script or a bare ds_config.json.

Names: ds_config keys of github.com/deepspeedai/DeepSpeed at commit
edaa7221267243c7be7fb49c5d5f5c4fb97b4641
(deepspeed/runtime/constants.py, zero/config.py, activation_checkpointing/config.py,
precision_config.py; known_keys/deepspeed.txt) and Megatron-DeepSpeed's arguments at
deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b (megatron/arguments.py;
known_keys/megatron_deepspeed.txt).

What DeepSpeed runs differs from Megatron-Core, and the planner's job recipe says so
(planner/stacks.py recipe_of, JobSpec): 16-bit gradients (grad_dtype half), gradient reduction after
the backward under its pipeline engine, no interleaved schedule, no TP-communication overlap.
"""

from __future__ import annotations

import json
import re
from typing import Any

from planner.launchers import megatron
from planner.launchers.common import (
    Export,
    Imported,
    LaunchPlan,
    apply_chunks,
    as_bool,
    as_int,
    unknown_keys,
)

NAME = "deepspeed"
# What DeepSpeed's pipeline engine runs (a plan it cannot run is re-planned by `export --to
# deepspeed`, refused when pinned): one chunk per stage (runtime/pipe/schedule.py TrainSchedule,
# plain 1F1B) and ZeRO 0-1 with pp > 1 (runtime/pipe/engine.py @ edaa7221267: "ZeRO-2 and ZeRO-3
# are incompatible with pipeline parallelism").
LAYOUT_PINS = {"vpp": 1}


def own_split(layers: int, pp: int) -> list[int]:
    """Layers per stage as Megatron-DeepSpeed's PipelineModule splits them
    (partition_method='type:transformer', megatron/model/gpt_model.py @ 4efb479d5317: DeepSpeed's
    runtime/utils.py partition_balanced over one unit per transformer layer): the first
    L mod pp stages hold one layer more."""
    base, extra = divmod(layers, pp)
    return [base + 1] * extra + [base] * (pp - extra)


def with_own_split(layout: Any, layers: int) -> Any:
    """`layout` with the stages DeepSpeed makes (own_split) where the plan splits otherwise."""
    from dataclasses import replace

    from planner.costmodel.pipeline import stage_counts

    if layout.pp == 1 or layout.vpp > 1:
        return layout
    split = own_split(layers, layout.pp)
    if stage_counts(layers, layout.pp, 1, layout.stage_layers) == split:
        return layout
    return replace(layout, stage_layers=tuple(split))


def layout_problems(layout: Any, layers: int | None = None) -> list[str]:
    """Why DeepSpeed's pipeline engine cannot run `layout` as planned (empty when it can); with
    the model's `layers`, a split other than its own (own_split) too."""
    from planner.costmodel.pipeline import stage_counts
    from planner.layout import format_stage_layers

    out = []
    if layers and layout.pp > 1 and layout.vpp == 1:
        planned = stage_counts(layers, layout.pp, 1, layout.stage_layers)
        if planned != own_split(layers, layout.pp):
            out.append(f"layers per stage {format_stage_layers(planned)}: DeepSpeed's "
                       f"PipelineModule splits {format_stage_layers(own_split(layers, layout.pp))}")
    if layout.vpp > 1:
        out.append(f"vpp {layout.vpp}: DeepSpeed's pipeline engine has no interleaved schedule")
    if layout.pp > 1 and layout.zero > 1:
        out.append(f"ZeRO-{layout.zero} with pp {layout.pp}: DeepSpeed's pipeline engine takes "
                   "ZeRO 0-1 only")
    return out
SOURCE = ("deepspeedai/DeepSpeed deepspeed/runtime/constants.py @ edaa7221267 (2026-08-22); "
          "deepspeedai/Megatron-DeepSpeed megatron/arguments.py @ 4efb479d5317 (2025-07-16)")


def ds_config(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any]:
    """The ds_config.json mapping."""
    lay, job = plan.layout, plan.job
    config: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": plan.grad_accum,
        "steps_per_print": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": lay.zero, "overlap_comm": job.grad_overlap,
                              "contiguous_gradients": True},
    }
    if job.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    else:
        config["bf16"] = {"enabled": True}
    if job.precision == "fp8":
        warnings.append("FP8 (Transformer Engine) is not wired into Megatron-DeepSpeed: "
                        "exported as bf16")
    if job.grad_dtype == "half+fp32":
        config["data_types"] = {"grad_accum_dtype": "fp32"}  # BF16_Optimizer's fp32 accumulator
    elif job.grad_dtype not in ("half",):
        warnings.append(f"grad_dtype {job.grad_dtype}: DeepSpeed keeps 16-bit gradients "
                        "(planner grad_dtype half); the prediction assumed otherwise")
    if lay.recompute in ("full", "selective", "offload"):
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False,
            "cpu_checkpointing": lay.recompute == "offload",
        }
    return config


def launch_args(plan: LaunchPlan, warnings: list[str]) -> list[tuple[str, Any]]:
    """Megatron-DeepSpeed pretrain_gpt.py arguments."""
    m, lay, job = plan.model, plan.layout, plan.job
    args: list[tuple[str, Any]] = [
        ("--num-layers", m.num_hidden_layers), ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.intermediate_size),
        ("--num-attention-heads", m.num_attention_heads),
    ]
    if m.kv_heads != m.num_attention_heads:
        args.append(("--num-key-value-heads", m.kv_heads))
    if m.head_dim and m.head_dim != m.hidden_size // m.num_attention_heads:
        args.append(("--kv-channels", m.head_dim))
    args += [("--seq-length", job.seq_len),
             ("--max-position-embeddings", max(job.seq_len, m.max_position_embeddings or 0)),
             ("--vocab-size", m.vocab_size), ("--tokenizer-type", "NullTokenizer")]
    if m.activation == "swiglu":
        args.append(("--swiglu", True))
    args.append(("--normalization", m.norm))
    if m.position_embedding == "rope":
        args.append(("--use-rotary-position-embeddings", True))
    if not m.tie_word_embeddings:
        args.append(("--untie-embeddings-and-output-weights", True))
    if not m.linear_bias:
        args.append(("--disable-bias-linear", True))
    if m.is_moe:
        args += [("--num-experts", m.num_experts), ("--topk", m.num_experts_per_tok)]
        if m.expert_ffn != m.intermediate_size or m.num_shared_experts or m.first_k_dense_replace:
            warnings.append("Megatron-DeepSpeed MoE has no expert FFN size, shared experts or "
                            "leading dense layers: the exported MoE is the plain one")
    if m.is_mla:
        warnings.append("Megatron-DeepSpeed has no multi-latent attention")
    args += [("--tensor-model-parallel-size", lay.tp),
             ("--pipeline-model-parallel-size", lay.pp)]
    if lay.pp == 1:
        args.append(("--no-pipeline-parallel", True))
    if lay.cp > 1:
        args.append(("--ds-sequence-parallel-size", lay.cp))
        warnings.append("cp is exported as DeepSpeed-Ulysses sequence parallelism "
                        "(all-to-all over heads), not ring context parallelism")
    if lay.ep > 1:
        args.append(("--moe-expert-parallel-size", lay.ep))
    args += [("--micro-batch-size", lay.mbs), ("--global-batch-size", job.global_batch)]
    if lay.sp:
        args.append(("--sequence-parallel", True))  # needs DeepSpeed >= 0.10.2
    args += [("--zero-stage", lay.zero), ("--deepspeed", True),
             ("--deepspeed_config", "$DS_CONFIG")]
    if lay.recompute in ("full", "offload"):
        args += [("--deepspeed-activation-checkpointing", True),
                 ("--recompute-granularity", "full"), ("--recompute-method", "uniform")]
        if lay.recompute == "offload":
            args.append(("--checkpoint-in-cpu", True))
            warnings.append("recompute=offload is exported as DeepSpeed's cpu_checkpointing: "
                            "full recomputation with the checkpoints kept in host memory")
    elif lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    args.append(("--fp16" if job.precision == "fp16" else "--bf16", True))
    if job.attention in ("flash", "cudnn", "triton"):
        args.append(("--use-flash-attn-v2", True))
        if job.attention == "cudnn":
            warnings.append("cuDNN fused attention is exported as FlashAttention-2")
        if job.attention == "triton":
            warnings.append("FlashAttention in Triton is exported as FlashAttention-2")
    if job.tp_comm_overlap:
        warnings.append("TP communication overlap (Transformer Engine userbuffers) is not "
                        "available in Megatron-DeepSpeed")
    if job.software != "current":
        warnings.append(f"software {job.software}: the memory model of 2022 DeepSpeed 0.5-0.6")
    return args


def export(plan: LaunchPlan) -> Export:
    """The launch script; LayoutError for a layout DeepSpeed's pipeline engine cannot run."""
    from planner.errors import LayoutError

    problems = layout_problems(plan.layout, plan.model.num_hidden_layers)
    if problems:
        raise LayoutError(f"{plan.layout} cannot run on DeepSpeed: {'; '.join(problems)} "
                          "(`planner export --to deepspeed` re-plans when the knob is not pinned)")
    warnings: list[str] = []
    config = ds_config(plan, warnings)
    args = launch_args(plan, warnings)
    cluster = plan.cluster
    config_keys = [k for k in config] + [f"{k}.{sub}" for k, v in config.items()
                                         if isinstance(v, dict) for sub in v]
    arg_keys = [k for k, _ in args]
    bad = unknown_keys("deepspeed", config_keys) + unknown_keys("megatron_deepspeed", arg_keys)
    if bad:
        raise RuntimeError(f"DeepSpeed export uses keys its schema lacks: {bad}")
    lines = [
        "#!/bin/bash", *plan.header(),
        f"# DeepSpeed + Megatron-DeepSpeed (names: {SOURCE}).",
        "# NullTokenizer with --vocab-size benchmarks the layout: replace with your tokenizer, "
        "data and optimizer arguments.",
        *[f"# WARNING: {w}" for w in warnings],
        "set -euo pipefail",
        "# Megatron-DeepSpeed's validate_args (megatron/arguments.py @ 4efb479d5317) refuses "
        "sequence parallelism",
        "# and its async TP all-reduce on CUDA unless this is 1",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "DS_CONFIG=${DS_CONFIG:-./ds_config.json}",
        "cat <<EOT > $DS_CONFIG",
        json.dumps(config, indent=2),
        "EOT",
        f"GPUS_PER_NODE={cluster.gpus_per_node}",
        f"NUM_NODES={cluster.num_nodes}",
        "NODE_RANK=${NODE_RANK:-0}",
        "MASTER_ADDR=${MASTER_ADDR:-localhost}",
        "MASTER_PORT=${MASTER_PORT:-6000}",
        "",
        "torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES --node_rank $NODE_RANK "
        "--master_addr $MASTER_ADDR --master_port $MASTER_PORT \\",
        "  pretrain_gpt.py \\",
        *megatron.format_args(args),
        '    "$@"', "",
    ]
    text = "\n".join(lines).replace("'$DS_CONFIG'", "$DS_CONFIG")
    return Export(NAME, text, config_keys + arg_keys, warnings)


# ---- reading ----------------------------------------------------------------------------------

def looks_like(text: str, path: str) -> bool:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "train_micro_batch_size_per_gpu" in text or "zero_optimization" in text or \
            "train_batch_size" in text
    return "deepspeed" in text.lower() and ("--num-layers" in text or "ds_config" in text.lower()
                                            or "zero_optimization" in text)


def _heredoc_json(text: str) -> dict[str, Any] | None:
    for m in re.finditer(r"<<-?\s*'?(\w+)'?[^\n]*\n(.*?)\n\1\s*$", text, flags=re.S | re.M):
        body = m.group(2).strip()
        if body.startswith("{"):
            try:
                data = json.loads(body)
            except json.JSONDecodeError:
                continue  # e.g. unexpanded $VARS: read what the arguments say instead
            if isinstance(data, dict):
                return data
    return None


def read_ds_config(config: dict[str, Any], imported: Imported) -> None:
    """Batch, ZeRO stage, precision and activation checkpointing from a ds_config mapping."""
    pins, job = imported.pins, imported.job
    mbs = as_int(config.get("train_micro_batch_size_per_gpu"))
    if mbs:
        pins.setdefault("mbs", mbs)
    gbs = as_int(config.get("train_batch_size"))
    if gbs:
        job.setdefault("global_batch", gbs)
    ga = as_int(config.get("gradient_accumulation_steps"))
    if gbs and mbs and ga:
        pins.setdefault("dp", gbs // (mbs * ga))
    elif mbs and not gbs and "global_batch" not in job:
        # DeepSpeedConfig._set_batch_related_parameters (runtime/config.py @ edaa7221267):
        # train_batch_size = micro x gradient_accumulation_steps (default 1) x data-parallel size
        imported.deferred["local_batch_size"] = mbs * (ga or 1)
    zero = config.get("zero_optimization") or {}
    if as_int(zero.get("stage")) is not None:
        pins["zero"] = as_int(zero["stage"])
    if "overlap_comm" in zero:
        job["grad_overlap"] = bool(as_bool(zero["overlap_comm"]))
    if (config.get("fp16") or {}).get("enabled") in (True, "true", "auto"):
        job["precision"] = "fp16"
    elif (config.get("bf16") or config.get("bfloat16") or {}).get("enabled") in (True, "true",
                                                                                   "auto"):
        job["precision"] = "bf16"
    grad_accum = (config.get("data_types") or {}).get("grad_accum_dtype")
    job["grad_dtype"] = "half+fp32" if grad_accum == "fp32" else "half"
    ac = config.get("activation_checkpointing") or {}
    if as_bool(ac.get("cpu_checkpointing")):
        pins["recompute"] = "offload"


def apply_recipe(imported: Imported, args: dict[str, Any]) -> None:
    """What Megatron-DeepSpeed runs whatever its arguments say (shared with the log reader)."""
    imported.pins["vpp"] = 1  # the pipeline engine has no interleaving
    if imported.pins.get("recompute") == "full" and megatron._flag(args, "--checkpoint-in-cpu"):
        imported.pins["recompute"] = "offload"
    # its pipeline engine reduces gradients after the backward, blocks on its sends, has no TP
    # overlap; attention is unfused unless flash is asked for; 16-bit gradients
    imported.job["tp_comm_overlap"] = False
    imported.job["p2p_overlap"] = False
    # under TP it sends each rank's 1/tp of an activation or gradient and all-gathers it on
    # receipt (runtime/pipe/engine.py is_pipe_partitioned / is_grad_partitioned, v0.3-0.6)
    imported.job["p2p_scatter_gather"] = True
    if imported.pins.get("pp", 1) > 1:
        imported.job["grad_overlap"] = False
    imported.job.setdefault("attention", "unfused")
    imported.job.setdefault("grad_dtype", "half")


def read(text: str, path: str) -> Imported:
    from planner.errors import SpecError

    imported = Imported(NAME, path, framework="DeepSpeed")
    if text.lstrip().startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: invalid JSON: {exc.msg}") from None
        read_ds_config(config, imported)
        imported.job.setdefault("attention", "unfused")
        imported.notes.append("a bare ds_config.json states no model and no TP/PP: give "
                              "--model and the degrees (--tp, --pp)")
        return imported
    args = megatron.parse_args_text(text)
    megatron.read_args(args, imported)
    config = _heredoc_json(text)
    if config:
        read_ds_config(config, imported)
    else:
        imported.job.setdefault("grad_dtype", "half")
    if args.get("--zero-stage") not in (None, True) and "zero" not in imported.pins:
        imported.pins["zero"] = as_int(args["--zero-stage"]) or 0
    if as_int(args.get("--ds-sequence-parallel-size")):
        imported.pins["cp"] = as_int(args["--ds-sequence-parallel-size"])
    if as_int(args.get("--moe-expert-parallel-size")):
        imported.pins["ep"] = as_int(args["--moe-expert-parallel-size"])
    if as_int(args.get("--topk")) and imported.shape.get("num_experts"):
        imported.shape["num_experts_per_tok"] = as_int(args["--topk"])
    apply_recipe(imported, args)
    layers, pp = imported.shape.get("num_hidden_layers"), imported.pins.get("pp", 1)
    if layers and pp > 1:  # the stages its PipelineModule makes
        apply_chunks(imported, layers, imported.pins, own_split(layers, pp),
                     "DeepSpeed's PipelineModule (partition_method type:transformer)")
    return imported

"""What every launcher module shares: the plan being exported, the result of an export, what a
launcher config says when read back, the checked-in known-key lists, and the model-shape rules.

A launcher module (megatron, nemo, torchtitan, deepspeed) has:

    export(plan: LaunchPlan) -> Export          its own configuration text, the keys it set
    read(text: str, path: str) -> Imported      model shape, layout, job recipe and GPU counts
    looks_like(text: str, path: str) -> bool    content detection for `--config`
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from planner.errors import SpecError
from planner.layout import Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec

# ModelSpec fields a launcher config states (HuggingFace names); the rest keep ModelSpec defaults.
SHAPE_FIELDS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "activation", "norm", "tie_word_embeddings",
    "position_embedding", "linear_bias", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "num_shared_experts", "first_k_dense_replace", "moe_layer_freq",
    "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)
# JobSpec recipe fields an export can carry; each launcher says which it expresses.
RECIPE_FIELDS = ("precision", "attention", "grad_dtype", "grad_overlap", "tp_comm_overlap",
                 "p2p_overlap")


@dataclass(frozen=True)
class LaunchPlan:
    """One layout of one model on one cluster for one job: what an export writes."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    layout: Layout
    step_time_s: float | None = None  # the prediction, quoted in the header comment

    @property
    def grad_accum(self) -> int:
        """Micro-batches per DP rank per step."""
        return self.layout.grad_accum(self.job.global_batch)

    def header(self, comment: str = "#") -> list[str]:
        """Comment lines that say what was planned (model, cluster, layout, prediction)."""
        lines = [
            f"{comment} planner export: {self.model.name} on {self.cluster} "
            f"({self.cluster.num_gpus} GPUs), seq {self.job.seq_len}, global batch "
            f"{self.job.global_batch}, {self.job.precision}",
            f"{comment} layout {self.layout} (grad_accum {self.grad_accum})"
            + (f", predicted step time {self.step_time_s:.3f} s" if self.step_time_s else ""),
        ]
        return lines


@dataclass
class Export:
    """A launcher configuration: its text, the launcher keys it sets (validated against the
    checked-in list), and what the launcher cannot express (also written as comments)."""

    launcher: str
    text: str
    keys: list[str]
    warnings: list[str] = field(default_factory=list)


def unexported_model_fields(model: ModelSpec) -> list[str]:
    """What of the model no export writes yet (issue 22's attention variants, MTP modules): the
    launched model would lack it. Megatron-Core's names for them: --qk-layernorm,
    --softmax-type learnable, --window-size / --window-attn-skip-freq, --mtp-num-layers
    (transformer_config.py, Megatron-LM d98e8a6; Megatron-Bridge gpt_oss_bridge.py:
    window_size = (sliding_window - 1, 0))."""
    out = []
    if model.qk_norm:
        out.append("per-head q/k RMSNorm (qk_norm) is not written (Megatron: --qk-layernorm)")
    if model.attention_out_bias and not model.linear_bias:
        out.append("the attention output-projection bias is not written")
    if model.attention_sinks:
        out.append("attention sinks are not written (Megatron: --softmax-type learnable)")
    if model.sliding_window is not None and model.num_sliding_layers:
        out.append(f"sliding-window attention ({model.num_sliding_layers} of "
                   f"{model.num_hidden_layers} layers, {model.sliding_window} tokens) is not "
                   "written (Megatron: --window-size, --window-attn-skip-freq)")
    if model.num_nextn_predict_layers:
        out.append(f"{model.num_nextn_predict_layers} multi-token-prediction module(s) not "
                   "written (Megatron: --mtp-num-layers)")
    return out


# JobSpec.attention -> Megatron-Core's AttnBackend (megatron/core/transformer/enums.py), which
# Megatron-LM's --attention-backend and NeMo / Megatron-Bridge's attention_backend name; there is
# no Triton FlashAttention backend, so "triton" goes out as flash (with a warning)
MCORE_ATTENTION_BACKEND = {"flash": "flash", "cudnn": "fused", "unfused": "unfused",
                           "triton": "flash"}


def mcore_attention_backend(attention: str, warnings: list[str]) -> str:
    """The AttnBackend name of a JobSpec.attention kind; warns where it is not the same kernel."""
    if attention == "triton":
        warnings.append("attention triton (FlashAttention in Triton) is exported as flash")
    return MCORE_ATTENTION_BACKEND[attention]


def unexported_job_fields(job: JobSpec) -> list[str]:
    """What of the job no export writes: a DP reduction width named apart from the gradients'
    (JobSpec.grad_reduce_dtype). The launchers' switches set the gradient buffer and its
    reduction together (Megatron-Core grad_reduce_in_fp32 / --grad-reduce-in-bf16, grad_dtype);
    Megatron-LM 2021's --fp32-allreduce is gone from today's Megatron-LM (not in d98e8a6)."""
    if job.grad_reduce_dtype == "auto":
        return []
    return [f"grad_reduce_dtype {job.grad_reduce_dtype} is not written: the launcher reduces "
            "the gradients in their buffer's dtype (grad_dtype); the prediction assumed "
            f"{job.grad_reduce_dtype} in the DP reduction"]


def with_warnings(result: Export, warnings: list[str]) -> Export:
    """`result` with more warnings, each also a '# WARNING:' comment line at the top of its
    text (after a '#!' line)."""
    if not warnings:
        return result
    lines = result.text.split("\n")
    at = 1 if lines and lines[0].startswith("#!") else 0
    lines[at:at] = [f"# WARNING: {w}" for w in warnings]
    return Export(result.launcher, "\n".join(lines), result.keys, [*result.warnings, *warnings])


@dataclass
class Imported:
    """What a launcher config says. `shape` holds ModelSpec fields, `pins` layout knobs, `job`
    JobSpec fields; a key absent is not stated. `model_name` is a built-in name the config
    names (torchtitan flavors); GPU counts come from the launch line when it has one."""

    launcher: str
    path: str
    shape: dict[str, Any] = field(default_factory=dict)
    pins: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    num_gpus: int | None = None
    notes: list[str] = field(default_factory=list)
    # facts that need the model or the GPU count to become pins (layers_per_stage: virtual
    # stages = layers / (pp x it); local_batch_size: global batch = it x dp)
    deferred: dict[str, int] = field(default_factory=dict)
    # the software that wrote it ("Megatron-LM", "NeMo/Megatron-Bridge", ...): the seam where the
    # stack presets (planner/stacks.py) can pick their stack from a config or a log
    framework: str = ""
    # layers per pipeline stage when the config splits them otherwise than the planner's even
    # rule (vpp 1); () = the even rule
    stage_layers: tuple[int, ...] = ()
    # decoder layers of each pipeline chunk where the config lists its chunks' modules
    # (torchtitan module_fqns_per_model_part); () = not listed
    chunks: tuple[int, ...] = ()

    def world_size(self) -> int | None:
        """GPUs of the launch: the launch line's nodes x GPUs per node, else the degrees'
        product when tp, pp, dp and cp are all stated."""
        if self.num_gpus:
            return self.num_gpus
        if self.num_nodes and self.gpus_per_node:
            return self.num_nodes * self.gpus_per_node
        if all(k in self.pins for k in ("tp", "pp", "dp")):
            return math.prod(self.pins.get(k, 1) for k in ("tp", "pp", "dp", "cp"))
        return None


# ---- known keys -------------------------------------------------------------------------------

@cache
def known_keys(name: str) -> frozenset[str]:
    """The checked-in key list planner/launchers/known_keys/NAME.txt (comments say its source)."""
    text = resources.files("planner.launchers").joinpath("known_keys", f"{name}.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.startswith("#"))


def unknown_keys(name: str, keys: list[str]) -> list[str]:
    """Keys the launcher's list does not hold (an export must have none)."""
    known = known_keys(name)
    return [k for k in keys if k not in known]


# ---- model shape ------------------------------------------------------------------------------

def states_as(model: ModelSpec, key: str, value: Any) -> bool:
    """Whether the model states `key` as `value` (KV heads, head size, expert FFN by effect)."""
    if key == "num_key_value_heads":
        return model.kv_heads == (value or model.num_attention_heads)
    if key == "moe_intermediate_size":
        return model.expert_ffn == (value or model.intermediate_size)
    if key == "head_dim":
        return model.head_size == (value or model.hidden_size // model.num_attention_heads)
    return getattr(model, key) == value


def model_from_shape(shape: dict[str, Any], name: str, seq_len: int | None = None,
                     global_batch: int | None = None) -> ModelSpec:
    """The built-in model whose every stated field matches `shape` (so names and sources carry
    over), else a ModelSpec built from the shape. SpecError when the shape lacks what a model
    needs (layers, hidden, heads, FFN, vocabulary)."""
    from planner.registry import builtin_models, validate_as

    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
            "vocab_size")
    missing = [k for k in need if not shape.get(k)]
    if missing:
        raise SpecError(f"{name}: the config does not state {', '.join(missing)}; give --model")
    for model in builtin_models().values():
        if all(states_as(model, k, v) for k, v in shape.items()):
            return model
    data = {k: v for k, v in shape.items() if v is not None}
    data.update(name=name, seq_len=seq_len or 2048, global_batch=global_batch or 1)
    return validate_as(ModelSpec, data, f"model shape read from {name}")


def shape_of(model: ModelSpec) -> dict[str, Any]:
    """The SHAPE_FIELDS of a model, as it states them."""
    return {k: getattr(model, k) for k in SHAPE_FIELDS}


# ---- small text helpers -----------------------------------------------------------------------

def as_int(value: Any) -> int | None:
    """An int from a config value ('8', 8, 8.0), None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def as_bool(value: Any) -> bool | None:
    """A bool from a config value (true/false/True/1/0/yes/no), None otherwise."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "none", "null"):
        return False
    return None


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def select_functions(path: str, function: str | None, functions: dict[str, Any],
                     module: Any) -> list[Any]:
    """The AST nodes whose statements say the config of a Python file with config functions
    (`functions`: name -> FunctionDef): the named function, preceded by the file's config
    functions it calls (a recipe that starts from another, e.g. llama3_8b_mxfp8 from llama3_8b),
    the only one, or the whole `module` when there is none. SpecError when several are there
    and none is named, or the named one is not there (the choices listed)."""
    import ast

    if function is None:
        if len(functions) > 1:
            raise SpecError(f"{path} defines {len(functions)} config functions "
                            f"({', '.join(functions)}): name one as {path}:FUNCTION")
        if not functions:
            return [module]
        function = next(iter(functions))
    if function not in functions:
        raise SpecError(f"{path} has no config function {function!r}; it has "
                        f"{', '.join(functions) or 'none'}")
    order: list[Any] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        for call in ast.walk(functions[name]):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
                    call.func.id in functions and call.func.id not in seen:
                visit(call.func.id, (*seen, call.func.id))
        order.append(functions[name])

    visit(function, (function,))
    return order


def walk_in_order(node: Any):
    """Every AST node under `node` in source order (later statements override earlier ones)."""
    import ast

    yield node
    for child in ast.iter_child_nodes(node):
        yield from walk_in_order(child)


def apply_chunks(imported: Imported, layers: int, pins: dict[str, Any],
                 chunks: list[int], what: str) -> None:
    """A config's pipeline split (`chunks`: decoder layers of each of the pp x vpp chunks, in
    layer order) as the planner's: nothing when it is the planner's even rule
    (costmodel.pipeline.stage_layer_counts), else Imported.stage_layers: one count per stage
    with vpp 1 (a layer or more each), one per virtual stage with vpp > 1 (a chunk may hold
    none, every stage but the end ones a layer: checks.stage_layers_violations). SpecError
    naming the split otherwise. `what` names the config's statement of the split."""
    from planner.costmodel.checks import stage_layers_violations
    from planner.costmodel.pipeline import stage_layer_counts
    from planner.layout import Layout, format_stage_layers

    pp, vpp = pins.get("pp", 1), pins.get("vpp", 1)
    if list(chunks) == stage_layer_counts(layers, pp * vpp):
        return
    problems = stage_layers_violations(layers, Layout(pp=pp, vpp=vpp,
                                                      stage_layers=tuple(chunks)))
    if problems:
        raise SpecError(f"{imported.path}: {what} gives layers per pipeline chunk "
                        f"{format_stage_layers(chunks)} (pp {pp} x vpp {vpp}): "
                        f"{problems[0].removeprefix('--stage-layers: ')}")
    imported.stage_layers = tuple(chunks)

"""Measured training runs, one type for every origin: rows of a table with the columns of
planner/data/published_runs.csv (the published runs, or a user's own training logs) and
the JSON-lines records `planner validate` appends.

A MeasuredRun holds what a prediction needs (ModelSpec, ClusterSpec, JobSpec), the layout knobs
the run states (`pins`; a missing knob is unknown, not a default) and what was measured: the step
time in seconds, or `oom` when the layout did not fit in memory.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner import limits
from planner.errors import PlannerError, SpecError
from planner.io import require_file
from planner.layout import KNOBS, RECOMPUTE_LEVELS, Layout
from planner.specs import ClusterSpec, GpuProfile, JobSpec, ModelSpec
from planner.stacks import DEFAULT_STACK, resolve_stack

# The project's calibration set (published measured runs, with its README of columns, sources and
# caveats) is package data: planner/data/published_runs.csv; PLANNER_PUBLISHED_RUNS overrides it.
PUBLISHED_RUNS_CSV = Path(os.environ.get(
    "PLANNER_PUBLISHED_RUNS", Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"))
# GPT-2/GPT-3 BPE vocabulary (Brown et al. 2020, which reuses GPT-2's tokenizer): the published
# tables of GPT-3-style runs often omit the vocabulary.
GPT_VOCAB = 50257


@dataclass(frozen=True)
class MeasuredRun:
    """One measured configuration. `measured_step_time_s` is seconds per optimizer step (None for
    an out-of-memory label); `pins` maps layout knob names to the values the run states."""

    run_id: str
    source_id: str
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    pins: dict[str, Any]
    measured_step_time_s: float | None
    oom: bool = False
    quality: str = "A"
    gpu_type: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    stack: str = DEFAULT_STACK  # software stack preset name (planner.stacks)
    stage_layers: tuple[int, ...] = ()  # layers per stage where the software's split is not even

    @property
    def layout(self) -> Layout | None:
        """The full layout when every knob is known (or has a single possible value), else None."""
        pins = dict(self.pins)
        if not self.model.is_moe:
            pins.setdefault("ep", 1)
        if pins.get("pp", 1) == 1:
            pins.setdefault("vpp", 1)
        if pins.get("tp", 1) == 1:
            pins.setdefault("sp", False)
        if any(k not in pins for k in KNOBS):
            return None
        return Layout(**{k: pins[k] for k in KNOBS}, stage_layers=self.stage_layers)

    def with_gpu(self, gpu: GpuProfile) -> MeasuredRun:
        """The same run predicted with another GPU profile (node shape kept)."""
        from dataclasses import replace

        return replace(self, cluster=self.cluster.model_copy(update={"gpu": gpu}))


@dataclass(frozen=True)
class Skipped:
    """A row that cannot be predicted, and why (one line)."""

    run_id: str
    source_id: str
    reason: str


# ---- published_runs.csv columns ---------------------------------------------------------------

# Whole-number columns (of tables and validate records) and their physical bounds; a value
# outside them is the reason a row is skipped, never a fit input.
COUNT_BOUNDS: dict[str, tuple[int, int]] = {
    "layers": (1, limits.MAX_LAYERS), "hidden": (1, limits.MAX_HIDDEN),
    "heads": (1, limits.MAX_HEADS), "kv_heads": (1, limits.MAX_HEADS),
    "ffn_hidden": (1, limits.MAX_FFN), "vocab": (1, limits.MAX_VOCAB),
    "seq_len": (1, limits.MAX_SEQ_LEN), "global_batch": (1, limits.MAX_GLOBAL_BATCH),
    "num_gpus": (1, limits.MAX_GPUS), "world_size": (1, limits.MAX_GPUS),
    "nnodes": (1, limits.MAX_GPUS), "nproc_per_node": (1, limits.MAX_GPUS_PER_NODE),
    "tp": (1, limits.MAX_GPUS), "pp": (1, limits.MAX_LAYERS), "dp": (1, limits.MAX_GPUS),
    "cp": (1, limits.MAX_GPUS), "ep": (1, limits.MAX_EXPERTS), "vpp": (1, limits.MAX_LAYERS),
    "micro_batch": (1, limits.MAX_GLOBAL_BATCH), "mbs": (1, limits.MAX_GLOBAL_BATCH),
    "zero": (0, 3),
}


def _num(value: Any, col: str = "value") -> float | None:
    """A finite float, or None for an empty cell (pandas reads 'NaN'/'NA' cells as empty).
    SpecError (the row's skip reason) for text that is no number, a boolean, a list or mapping,
    or an infinite value."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        shown = str(value).lower() if isinstance(value, bool) else type(value).__name__
        raise SpecError(f"{col}: {shown} is not a number")
    try:
        x = float(value)
    except ValueError:
        raise SpecError(f"{col}: '{str(value).strip()[:40]}' is not a number") from None
    except OverflowError:
        raise SpecError(f"{col}: {str(value)[:20]}... is too large") from None
    if math.isnan(x):
        return None
    if not math.isfinite(x):
        raise SpecError(f"{col}: {value} is not a finite number")
    return x


def _int(value: Any, col: str) -> int | None:
    """A whole number in the column's bounds (COUNT_BOUNDS), or None for an empty cell;
    SpecError naming the column and the bound otherwise."""
    x = _num(value, col)
    if x is None:
        return None
    lower, upper = COUNT_BOUNDS[col]
    if x != int(x):
        raise SpecError(f"{col} {x:g} is not a whole number")
    if x < lower:
        raise SpecError(f"{col} {x:g} must be at least {lower}")
    if x > upper:
        raise SpecError(f"{col} {x:g} is more than {upper}, the largest accepted")
    return int(x)


def _seconds(value: Any, col: str) -> float | None:
    """A measured duration in (0, MAX_STEP_TIME_S] seconds, or None for an empty cell."""
    x = _num(value, col)
    if x is None:
        return None
    if x <= 0:
        raise SpecError(f"{col} {x:g} s is not a positive time")
    if x > limits.MAX_STEP_TIME_S:
        raise SpecError(f"{col} {x:g} s is more than {limits.MAX_STEP_TIME_S:g} s (a day) per step")
    return x


def is_cpu_profile(gpu: GpuProfile) -> bool:
    """Whether a profile describes CPU processes (`planner profile` on a CPU: loopback fabric,
    its provenance's device 'cpu ...')."""
    device = str((gpu.provenance or {}).get("device") or "")
    return device.lower().startswith("cpu") or gpu.intra_node_fabric == "loopback"


def profile_device_mismatch(gpu: GpuProfile, device: str) -> str | None:
    """'DEVICE, but profile P describes OTHER' when `device` as torch names it ('cpu ...' for
    CPU processes, else the GPU's name) is not the device `gpu` describes; None when they agree
    or nothing can be said (an unknown GPU name, an empty device)."""
    from planner.registry import builtin_gpus, gpu_of_device

    if not device:
        return None
    prov_device = str((gpu.provenance or {}).get("device") or "")
    profile_cpu = is_cpu_profile(gpu)
    device_cpu = device.lower().startswith("cpu")
    if device_cpu != profile_cpu:
        return (f"{'a CPU' if device_cpu else device}, but profile {gpu.name} describes "
                f"{'CPU processes' if profile_cpu else 'a GPU'}")
    if device_cpu:
        return None
    profile_gpu = gpu_of_device(prov_device) if prov_device else None
    if profile_gpu is None:
        base = str((gpu.provenance or {}).get("base_profile") or "")
        profile_gpu = next((g for g in builtin_gpus().values() if g.name in (gpu.name, base)),
                           None)
    device_gpu = gpu_of_device(device)
    if device_gpu is not None and profile_gpu is not None and device_gpu.name != profile_gpu.name:
        return f"{device} ({device_gpu.name}), but profile {gpu.name} describes " \
               f"{profile_gpu.name}"
    return None


def device_mismatch(runs: Iterable[MeasuredRun], gpu: GpuProfile) -> str | None:
    """One line when a validate record was measured on another kind of device than `gpu`
    describes (CPU records against a GPU profile, or the reverse, or one GPU model's records
    against another's profile); None when they agree or the records name no device."""
    for run in runs:
        if run.source_id == "validate":
            why = profile_device_mismatch(gpu, run.gpu_type)
            if why:
                return f"{run.run_id} was measured on {why}"
    return None


# Networks of the clusters some published sources ran on, where they differ from the node design
# of the GPU's profile (each with its citation): planner/data/source_clusters.yaml
SOURCE_CLUSTERS_YAML = Path(__file__).resolve().parents[1] / "data" / "source_clusters.yaml"


@lru_cache(maxsize=1)
def source_clusters() -> dict[str, dict[str, Any]]:
    """source_id -> what is stated of its cluster (nics_per_node, source)."""
    import yaml

    return yaml.safe_load(SOURCE_CLUSTERS_YAML.read_text()) or {}


def gpu_name_of(gpu_type: str) -> str:
    """Registry lookup name of a table's GPU label: 'A100-SXM4-80GB (Jean Zay)' -> 'A100-SXM4-80GB',
    'GB200 NVL72 (B200-class GPU)' -> 'GB200', 'B200 (DGX B200)' -> 'B200'."""
    return gpu_type.strip().split()[0] if gpu_type.strip() else gpu_type


def precision_of(text: str) -> str | None:
    """The matmul precision a table's label means (bf16, fp16, fp8), None when unsupported (FP4,
    FP32/TF32). Sources' own words for a 16-bit run that does not say which ('mixed (not
    stated)', 'mixed (16-bit, not specified)') read as BF16, like 'fp16 or bf16 (not
    stated)': the two have the same tensor peak on every GPU from the A100 on."""
    t = text.lower()
    if "fp4" in t:
        return None
    if "fp8" in t:
        return "fp8"
    if "bf16" in t:  # includes "fp16 or bf16 (not stated)": BF16 is the A100-era default
        return "bf16"
    if "fp16" in t:  # includes "mixed fp16 (not stated)"
        return "fp16"
    if "16-bit" in t or "16 bit" in t or re.match(r"\s*(amp|mixed)\b", t):
        return "bf16"
    return None


def zero_of(text: str | None) -> int | None:
    """ZeRO stage of a table's sharding label; None when the table does not say; SpecError for
    a stage that does not exist (ZeRO-7)."""
    if not text:
        return None
    t = text.lower()
    if "shard_grad_op" in t:
        return 2  # FSDP SHARD_GRAD_OP shards gradients and optimizer state: ZeRO-2
    if "fsdp" in t or "full_shard" in t or "zero-3" in t:
        return 3
    m = re.search(r"zero-(\d+)", t)
    if m:
        if int(m.group(1)) > 3:
            raise SpecError(f"zero_or_fsdp '{text}': ZeRO has stages 0-3")
        return int(m.group(1))
    return None  # e.g. "DDP + (Megatron distributed optimizer likely; not stated)"


def recompute_of(text: str | None) -> str | None:
    """Recompute level of a table's label ('full (activation checkpointing)' -> full); None
    for an empty cell; SpecError for a label that names no level."""
    if not text or not text.strip():
        return None
    t = text.strip().lower()
    for value in RECOMPUTE_LEVELS:
        if t.startswith(value):
            return value
    raise SpecError(f"recompute '{text.strip()[:40]}' is not one of {', '.join(RECOMPUTE_LEVELS)}")


# Columns that state the model exactly (issue 16): `model_spec` names a built-in model or a model
# spec YAML / HuggingFace config.json (what --model takes; a relative path is read from the
# table's folder); else the shape columns, where `activation` (swiglu, gelu, ...) and
# `tie_word_embeddings` say what the parameter count can only guess.
MODEL_SPEC_COLUMN = "model_spec"
# A row's params_b more than this factor from the dense model its shape columns build is another
# architecture (every published dense row is within 0.93-1.36x: the tables' rounding, MPT's and
# BLOOM's size labels); such a row needs model_spec.
PARAMS_MISMATCH = 2.0
# shape columns -> ModelSpec attributes (kv_heads: the effective key/value heads)
SHAPE_COLUMNS = {"layers": "num_hidden_layers", "hidden": "hidden_size",
                 "heads": "num_attention_heads", "kv_heads": "kv_heads",
                 "ffn_hidden": "intermediate_size", "vocab": "vocab_size"}


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    t = _text(value)
    if t is None:
        return None if _num(value) is None else bool(_num(value))
    if t.lower() in ("true", "yes", "1", "tied"):
        return True
    if t.lower() in ("false", "no", "0", "untied"):
        return False
    raise SpecError(f"tie_word_embeddings '{t}' is not a boolean")


def _named_model(row: dict[str, Any], base: Path | None) -> ModelSpec | None:
    """The model the row's model_spec column names exactly (None when the column is empty)."""
    from planner.registry import _looks_like_path, load_model

    ref = _text(row.get(MODEL_SPEC_COLUMN))
    if ref is None:
        return None
    if base is not None and _looks_like_path(ref) and not Path(ref).is_absolute():
        ref = str(base / ref)
    return load_model(ref)


def _builtin_named(text: str | None) -> ModelSpec | None:
    """The built-in model a free-text `model` cell names, if it names one (no error)."""
    from planner.registry import load_model

    if not text:
        return None
    try:
        return load_model(text.split("(")[0].strip())
    except PlannerError:
        return None


def _same_shape(a: ModelSpec, b: ModelSpec) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in SHAPE_COLUMNS.values())


def _mlp_text(model: ModelSpec) -> str:
    tied = "tied" if model.tie_word_embeddings else "untied"
    return f"{model.activation} MLP, {tied} embeddings, {model.num_params / 1e9:.2f} B params"


def model_warnings(row: dict[str, Any], model: ModelSpec, guessed: bool) -> list[str]:
    """Lines saying where the model used for a row and the model it states disagree: the shape
    columns against a model_spec, or the MLP type / tied embeddings guessed from params_b against
    the built-in model the `model` column names."""
    out = []
    where = f"row {row.get('row_id', '?')}"
    if _text(row.get(MODEL_SPEC_COLUMN)) is not None:
        stated = {f: _int(row.get(c), c) for c, f in SHAPE_COLUMNS.items()
                  if _int(row.get(c), c) is not None}
        wrong = [f"{f} {v} != {getattr(model, f)}" for f, v in stated.items()
                 if getattr(model, f) != v]
        if wrong:
            out.append(f"{where}: its shape columns disagree with model_spec "
                       f"'{row.get(MODEL_SPEC_COLUMN)}' ({', '.join(wrong)}); model_spec is used")
        return out
    named = _builtin_named(_text(row.get("model")))
    if guessed and named is not None and _same_shape(named, model) and (
            named.activation != model.activation
            or named.tie_word_embeddings != model.tie_word_embeddings):
        out.append(
            f"{where}: the MLP type guessed from params_b ({_mlp_text(model)}) disagrees with "
            f"the built-in '{named.name}' its model column names ({_mlp_text(named)}); the "
            "guess is used: add a model_spec column (or activation and tie_word_embeddings) to "
            "state the model exactly")
    return out


def model_from_row(row: dict[str, Any], base: Path | None = None) -> ModelSpec:
    """A ModelSpec from a table row: the model its `model_spec` column names, else the shape
    columns. With an `activation` column (and `tie_word_embeddings`) the shape is exact; without
    one the MLP type is guessed: both candidates (SwiGLU, 3 matrices; GELU, 2) are built and the
    one whose parameter count is closer to the row's `params_b` is kept (a 4h FFN with 2
    matrices is GPT/MPT/BLOOM/Nemotron); model_warnings says when the guess contradicts the
    built-in model the `model` column names."""
    named = _named_model(row, base)
    if named is not None:
        return named
    hidden, layers = _int(row.get("hidden"), "hidden"), _int(row.get("layers"), "layers")
    ffn = _int(row.get("ffn_hidden"), "ffn_hidden")
    # a GPT-style row (the model's name says GPT) that omits ffn_hidden has GPT's 4 x hidden
    # (Radford et al. 2019; Brown et al. 2020, Table 2.1: d_ff = 4 d_model)
    gpt_style = "gpt" in str(row.get("model", "")).lower()
    if ffn is None and hidden and gpt_style:
        ffn = 4 * hidden
    if not hidden or not layers or not ffn:
        raise SpecError("row lacks hidden, layers or ffn_hidden")
    heads = _int(row.get("heads"), "heads")
    if heads is None:
        m = re.search(r"NHEADS=(\d{1,9})\b", str(row.get("notes", "")))
        heads = _int(m.group(1), "heads") if m else None
    if heads is None:
        raise SpecError("row lacks the number of attention heads")
    kv = _int(row.get("kv_heads"), "kv_heads") or heads
    vocab = _int(row.get("vocab"), "vocab")
    if vocab is None and gpt_style:
        vocab = GPT_VOCAB
    if vocab is None:
        raise SpecError("row lacks the vocabulary size")
    seq = _int(row.get("seq_len"), "seq_len") or 2048
    spec = dict(
        name=str(row.get("model") or "model").strip(),
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=ffn, vocab_size=vocab, seq_len=seq,
        global_batch=_int(row.get("global_batch"), "global_batch") or 1,
    )
    tied = _bool(row.get("tie_word_embeddings"))
    if tied is not None:
        spec["tie_word_embeddings"] = tied
    activation = _text(row.get("activation"))
    from planner.registry import validate_as

    try:
        if activation is not None:
            return validate_as(ModelSpec, dict(spec, activation=activation), "row's architecture")
        candidates = [validate_as(ModelSpec, dict(spec, activation=a), "row's architecture")
                      for a in ("swiglu", "gelu")]
    except SpecError as exc:
        raise SpecError(str(exc).replace("Value error, ", "")) from None
    params_b = _num(row.get("params_b"), "params_b")
    if params_b is None:
        return candidates[1] if ffn == 4 * hidden else candidates[0]
    model = min(candidates, key=lambda m: abs(m.num_params / 1e9 - params_b))
    ratio = params_b / (model.num_params / 1e9)
    if not 1 / PARAMS_MISMATCH < ratio < PARAMS_MISMATCH:
        # an MoE row (Qwen3-235B-A22B: 235B against the 22B dense model of its shape columns)
        # would otherwise be predicted as that dense model
        raise SpecError(
            f"params_b {params_b:g} is {ratio:.3g}x the {model.num_params / 1e9:.3g}B dense "
            "model its shape columns give (an MoE or another architecture the columns cannot "
            f"state): name the model in a {MODEL_SPEC_COLUMN} column")
    return model


def step_time_of(row: dict[str, Any]) -> float | None:
    """Measured seconds per optimizer step: the reported iteration time, else the derived one,
    else global_batch x seq_len / (tokens/s/GPU x GPUs)."""
    for col in ("iteration_time_s", "iteration_time_s_derived"):
        value = _seconds(row.get(col), col)
        if value:
            return value
    tps = _num(row.get("tokens_per_s_per_gpu"), "tokens_per_s_per_gpu")
    gbs, seq, n = (_int(row.get(c), c) for c in ("global_batch", "seq_len", "num_gpus"))
    if tps is not None and tps <= 0:
        raise SpecError(f"tokens_per_s_per_gpu {tps:g} is not a positive throughput")
    if tps and gbs and seq and n:
        return _seconds(gbs * seq / (tps * n), "step time from tokens_per_s_per_gpu")
    return None


def physics_reason(run: MeasuredRun) -> str | None:
    """Why a measured step time cannot be true, or None: model FLOPs (causal attention, no
    recompute: the least work the step must do) faster than the GPUs' dense peak, MFU > 1."""
    if run.measured_step_time_s is None:
        return None
    job = run.job
    flops = run.model.train_flops_per_token(job.seq_len, causal=True) * job.tokens_per_step
    peak = run.cluster.gpu.peak_flops(job.precision) * run.cluster.num_gpus
    mfu = flops / (run.measured_step_time_s * peak)
    if mfu > 1:
        return (f"step time {run.measured_step_time_s:g} s implies MFU {mfu:.3g} > 1 on "
                f"{run.cluster.num_gpus} {run.cluster.gpu.name}: faster than the dense "
                f"{job.precision} peak")
    return None


# What a row's notes say of its MoE recipe, in the words planner/data/README.md asks for:
# "routing force-balanced" (Megatron-Core moe_router_force_load_balancing, NeMo AutoModel's
# fake_balanced_gate), "token dispatcher DeepEP" (or HybridEP, DeepEP's NVLink-domain
# successor in Megatron-Core's flex dispatcher) and "EP communication overlapped"
# (overlap_moe_expert_parallel_comm; the Megatron-Bridge rows say so per release).
_FORCE_BALANCED = re.compile(r"routing force-balanced", re.IGNORECASE)
_DEEPEP = re.compile(r"token dispatcher (DeepEP|HybridEP)", re.IGNORECASE)
_EP_OVERLAP = re.compile(r"EP communication overlapped", re.IGNORECASE)


def moe_recipe_of(job: JobSpec, notes: str | None) -> JobSpec:
    """The job with the MoE routing, dispatcher and EP overlap a row's notes state; unchanged
    otherwise."""
    update: dict[str, Any] = {}
    if notes and _FORCE_BALANCED.search(notes):
        update["moe_routing"] = "force_balanced"
    if notes and _DEEPEP.search(notes):
        update["moe_dispatcher"] = "deepep"
    if notes and _EP_OVERLAP.search(notes):
        update["moe_ep_overlap"] = True
    return job.model_copy(update=update) if update else job


# What a row's notes say of its gradient buffer, in the words planner/data/README.md asks for:
# "gradients in bf16" (16-bit gradient buffer and reduction: JobSpec.grad_dtype half). The dgxc
# NeMo rows say so where the release's own recipe does (planner/data/README.md "Gradients").
_HALF_GRADS = re.compile(r"gradients in (bf16|fp16|16-bit)", re.IGNORECASE)


def grad_recipe_of(job: JobSpec, notes: str | None) -> JobSpec:
    """The job with the 16-bit gradients a row's notes state (grad_dtype half); unchanged
    otherwise."""
    if notes and _HALF_GRADS.search(notes):
        return job.model_copy(update={"grad_dtype": "half"})
    return job


def is_oom_row(row: dict[str, Any]) -> bool:
    """Rows whose notes say OOM are memory-infeasible labels (published_runs README)."""
    return bool(re.search(r"\bOOM\b", str(row.get("notes", ""))))


def run_from_row(row: dict[str, Any], resolve_gpu: Callable[[str], GpuProfile] | None = None,
                 models: dict[str, ModelSpec] | None = None,
                 base: Path | None = None) -> MeasuredRun:
    """One table row -> MeasuredRun; SpecError with the reason when it cannot be predicted.
    `models` interns equal ModelSpecs across rows (so predictions can be batched per model);
    `base` is the table's folder (relative model_spec paths). Lines saying where the row's
    model and the model it states disagree go to extra["warnings"] (model_warnings)."""
    from planner.registry import load_gpu, parse_cluster

    resolve_gpu = resolve_gpu or load_gpu
    gpu_type = str(row.get("gpu_type", ""))
    gpu = resolve_gpu(gpu_name_of(gpu_type))
    precision = precision_of(str(row.get("precision", "bf16")))
    if precision is None:
        raise SpecError(f"precision '{row.get('precision')}' is not modelled")
    if precision == "fp8" and gpu.peak_fp8_tflops is None:
        raise SpecError(f"{gpu.name} has no FP8 peak")
    model = model_from_row(row, base)
    guessed = _text(row.get(MODEL_SPEC_COLUMN)) is None and _text(row.get("activation")) is None
    warnings = model_warnings(row, model, guessed)
    if models is not None:
        model = models.setdefault(model.model_dump_json(), model)
    num_gpus = _int(row.get("num_gpus"), "num_gpus")
    if not num_gpus:
        raise SpecError("row lacks num_gpus")
    cluster = parse_cluster(f"{num_gpus}x{gpu.name}", profile=gpu)
    nics = source_clusters().get(str(row.get("source_id", "")), {}).get("nics_per_node")
    if nics is not None:
        cluster = cluster.model_copy(update={"nics_per_node": float(nics)})
    seq, gbs = _int(row.get("seq_len"), "seq_len"), _int(row.get("global_batch"), "global_batch")
    if not seq or not gbs:
        raise SpecError("row lacks seq_len or global_batch")
    # the `stack` column names the software; the `framework` column feeds it (same rules)
    stack_text = _text(row.get("stack")) or _text(row.get("framework"))
    stack = resolve_stack(stack_text)
    job = stack.job(JobSpec(seq_len=seq, global_batch=gbs, precision=precision), stack_text,
                    _text(row.get("notes")))
    job = grad_recipe_of(moe_recipe_of(job, _text(row.get("notes"))), _text(row.get("notes")))
    pins: dict[str, Any] = {}
    for col, knob in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("vpp", "vpp"),
                      ("micro_batch", "mbs"), ("ep", "ep")):
        value = _int(row.get(col), col)
        if value is not None:
            pins[knob] = value
    _check_world(pins, cluster.num_gpus)
    if "vpp" in pins and pins.get("pp", 1) == 1:
        pins["vpp"] = 1
    zero = zero_of(row.get("zero_or_fsdp") if isinstance(row.get("zero_or_fsdp"), str) else None)
    if zero is not None:
        pins["zero"] = zero
    rc = row.get("recompute")
    recompute = recompute_of(rc if isinstance(rc, str) else None)
    if recompute is not None:
        pins["recompute"] = recompute
    sp = row.get("sp")
    if isinstance(sp, str) and sp.strip().lower() in ("yes", "no", "true", "false"):
        pins["sp"] = sp.strip().lower() in ("yes", "true")
    elif sp is not None and not (isinstance(sp, str) and not sp.strip()):
        raise SpecError(f"sp '{str(sp)[:40]}' is not yes/no")
    for knob, value in stack.layout_defaults.items():
        # what the software cannot do (Megatron-DeepSpeed: no interleaving, no SP; Megatron-LM
        # 2021: no distributed optimizer), unless the row says otherwise
        pins.setdefault(knob, value)
    split: tuple[int, ...] = ()
    if stack.stage_split == "nanotron" and pins.get("pp", 1) > 1 and pins.get("vpp", 1) == 1:
        from planner.costmodel.pipeline import nanotron_stage_counts

        split = tuple(nanotron_stage_counts(model, pins["pp"]))
    oom = is_oom_row(row)
    step = None if oom else step_time_of(row)
    if step is None and not oom:
        raise SpecError("row has no step time, throughput or OOM label")
    return _physical(MeasuredRun(
        run_id=f"{row.get('source_id', 'csv')}:{row.get('row_id', '?')}",
        source_id=str(row.get("source_id", "csv")),
        model=model, cluster=cluster, job=job, pins=pins, measured_step_time_s=step, oom=oom,
        quality=str(row.get("quality", "A")), gpu_type=gpu_type, notes=str(row.get("notes", "")),
        stack=stack.name, stage_layers=split,
        extra={"warnings": warnings} if warnings else {},
    ))


def _physical(run: MeasuredRun) -> MeasuredRun:
    reason = physics_reason(run)
    if reason:
        raise SpecError(reason)
    return run


def _check_world(pins: dict[str, Any], num_gpus: int) -> None:
    """The stated degrees tp x pp x dp x cp must be the run's GPU count when all are stated."""
    if all(k in pins for k in ("tp", "pp", "dp", "cp")):
        world = math.prod(pins[k] for k in ("tp", "pp", "dp", "cp"))
        if world != num_gpus:
            raise SpecError(f"tp*pp*dp*cp = {pins['tp']}*{pins['pp']}*{pins['dp']}*{pins['cp']} "
                            f"= {world} is not the run's {num_gpus} GPUs")


def load_table(path: str | Path = PUBLISHED_RUNS_CSV,
               resolve_gpu: Callable[[str], GpuProfile] | None = None,
               ) -> tuple[list[MeasuredRun], list[Skipped]]:
    """Every row of a CSV with the published_runs.csv columns: the usable runs and the skipped
    rows with their reason."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read runs table {path}: {str(exc).splitlines()[0]}") from None
    missing = {"gpu_type", "num_gpus", "tp", "pp", "dp", "seq_len", "global_batch"} - set(frame)
    if missing:
        raise SpecError(f"{path}: not a runs table, missing columns {', '.join(sorted(missing))}")
    frame = frame.astype(object).where(frame.notna(), None)
    runs, skipped = [], []
    models: dict[str, ModelSpec] = {}
    for i, row in enumerate(frame.to_dict("records")):
        row.setdefault("row_id", i + 1)
        if row.get("row_id") is None:
            row["row_id"] = i + 1
        row.setdefault("cp", 1)
        try:
            runs.append(run_from_row(row, resolve_gpu, models, Path(path).parent))
        except PlannerError as exc:
            skipped.append(Skipped(f"{row.get('source_id', 'csv')}:{row['row_id']}",
                                   str(row.get("source_id", "csv")), str(exc)))
    return runs, skipped


# ---- planner validate records -----------------------------------------------------------------

# validate's scale-down overrides (record keys) -> ModelSpec fields
_OVERRIDES = {
    "layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size",
    "ffn": "intermediate_size", "vocab": "vocab_size",
}


def _record_model(record: dict[str, Any]) -> ModelSpec:
    from planner.registry import load_model, validate_as

    spec = record.get("model_spec")
    if isinstance(spec, dict):
        return validate_as(ModelSpec, spec, "record model_spec")
    if isinstance(spec, str) and spec.strip():  # a built-in name or a spec / config.json path
        return load_model(spec.strip())
    name = record.get("model")
    if not isinstance(name, str):
        raise SpecError("record names no model")
    model = load_model(name)
    overrides = record.get("overrides") if isinstance(record.get("overrides"), dict) else record
    update = {f: overrides[k] for k, f in _OVERRIDES.items() if overrides.get(k) is not None}
    if update:
        model = validate_as(ModelSpec, {**model.model_dump(), **update}, f"model {name} overrides")
    return model


def record_pins(record: dict[str, Any]) -> dict[str, Any]:
    """The layout knobs a record states, checked: degrees whole numbers in their bounds, zero a
    stage 0-3, recompute a level, sp a boolean; SpecError (the skip reason) otherwise."""
    pins: dict[str, Any] = {}
    for knob in KNOBS:
        value = record.get(knob)
        if value is None:
            continue
        if knob == "recompute":
            if not isinstance(value, str) or value not in RECOMPUTE_LEVELS:
                raise SpecError(f"recompute {str(value)[:40]!r} is not one of "
                                f"{', '.join(RECOMPUTE_LEVELS)}")
        elif knob == "sp":
            if not isinstance(value, bool):
                raise SpecError(f"sp {str(value)[:40]!r} is not true or false")
        else:
            value = _int(value, knob)
            if value is None:
                continue
        pins[knob] = value
    return pins


def run_from_record(record: dict[str, Any], gpu: GpuProfile, run_id: str) -> MeasuredRun:
    """One `planner validate` record -> MeasuredRun predicted on `gpu` (one node of world_size
    processes unless the record names its cluster)."""
    from planner.registry import parse_cluster, validate_as

    if not isinstance(record, dict):
        raise SpecError(f"a record is a JSON object, got {type(record).__name__}")
    if record.get("ok", False) is not True:
        raise SpecError(f"run failed: {str(record.get('error') or 'ok is not true')[:200]}")
    step = _seconds(record.get("measured_step_time_s"), "measured_step_time_s")
    if not step:
        raise SpecError("record has no measured_step_time_s")
    model = _record_model(record)
    pins = record_pins(record)
    world = _int(record.get("world_size"), "world_size") or math.prod(
        pins.get(k, 1) for k in ("tp", "pp", "dp", "cp"))
    cluster_text = record.get("cluster")
    nnodes = _int(record.get("nnodes"), "nnodes") or 1
    if isinstance(cluster_text, str) and cluster_text:
        cluster = parse_cluster(cluster_text, profile=gpu)
    else:  # validate's launcher: nnodes x nproc_per_node processes
        per_node = _int(record.get("nproc_per_node"), "nproc_per_node") or max(1, world // nnodes)
        cluster = validate_as(ClusterSpec, dict(gpu=gpu, num_nodes=nnodes, gpus_per_node=per_node),
                              "record's cluster")
    _check_world(pins, cluster.num_gpus)
    precision = record.get("precision")
    if precision not in ("bf16", "fp16", "fp8"):
        precision = "bf16"
    seq, gbs = (_int(record.get(c), c) for c in ("seq_len", "global_batch"))
    if not seq or not gbs:
        raise SpecError("record lacks seq_len or global_batch")
    stack = resolve_stack(_text(record.get("stack")))
    job = stack.job(JobSpec(seq_len=seq, global_batch=gbs, precision=precision))
    return _physical(MeasuredRun(
        run_id=run_id, source_id=str(record.get("source_id") or "validate"), model=model,
        cluster=cluster, job=job, pins=pins, measured_step_time_s=step,
        gpu_type=str(record.get("device", "")),
        extra={"predicted_step_time_s": record.get("predicted_step_time_s")},
        stack=stack.name,
    ))


def load_records(path: str | Path, gpu: GpuProfile) -> tuple[list[MeasuredRun], list[Skipped]]:
    """The runs of a validate JSON-lines file (failed runs skipped with their reason)."""
    from planner.io import read_jsonl_lines

    path = Path(path)
    require_file(path, "runs file")
    runs, skipped = [], []
    for i, record in read_jsonl_lines(path):  # a line that is not JSON: one warning, skipped
        run_id = f"{path.name}:{i}"
        try:
            runs.append(run_from_record(record, gpu, run_id))
        except PlannerError as exc:
            skipped.append(Skipped(run_id, "validate", str(exc).splitlines()[0] if str(exc) else
                                   type(exc).__name__))
    return runs, skipped


def run_from_log(path: str | Path, gpu: GpuProfile, model: str | None = None) -> MeasuredRun:
    """A training log as MeasuredRun predicted on `gpu` (the log does not name
    its GPU type): layout and model from the log, the median steady step time."""
    from planner.launchers import resolve
    from planner.measured.logs import read_log

    log = read_log(path)
    imported = log.imported
    world = imported.world_size()
    if not world:
        raise SpecError(f"{path}: the log does not say how many GPUs ran")
    per_node = min(world, gpu.gpus_per_node)
    if world % per_node:
        per_node = 1
    cluster = ClusterSpec(gpu=gpu, num_nodes=world // per_node, gpus_per_node=per_node)
    imported.num_nodes = imported.gpus_per_node = None
    imported.num_gpus = world
    resolved = resolve(imported, model, cluster, gpu)
    stack = resolve_stack(imported.framework)  # the log's software: its recipe where unstated
    fields = {k: v for k, v in stack.recipe_fields(imported.framework).items()
              if k not in imported.job}
    return MeasuredRun(
        run_id=Path(path).name, source_id=f"log:{imported.framework or imported.launcher}",
        model=resolved.model, cluster=resolved.cluster,
        job=resolved.job.model_copy(update=fields) if fields else resolved.job, stack=stack.name,
        pins=resolved.pins, measured_step_time_s=log.median_step_time_s,
        gpu_type=gpu.name, notes="; ".join(resolved.notes),
        extra={"framework": imported.framework, "steady_steps": len(log.step_times_s),
               "logged_steps": log.all_points, "measured_step_times_s": log.step_times_s},
    )


def load_runs(path: str | Path, gpu: GpuProfile) -> tuple[list[MeasuredRun], list[Skipped]]:
    """Runs from a validate JSON-lines file (.jsonl/.json) or a runs table (.csv). Table rows
    keep their own GPU; records are predicted on `gpu`."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        require_file(path, "runs file")
        return load_table(path)
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return load_records(path, gpu)
    if path.suffix.lower() in (".log", ".txt", ".out"):
        # a Megatron-LM / NeMo / torchtitan training log (planner.measured.logs)
        require_file(path, "runs file")
        try:
            # the same bounds as a runs table's rows: a step time within a day, the stated
            # degrees the GPU count, no faster than the GPUs' dense peak (physics_reason)
            run = run_from_log(path, gpu)
            _seconds(run.measured_step_time_s, "step time of the log")
            _check_world(run.pins, run.cluster.num_gpus)
            return [_physical(run)], []
        except PlannerError as exc:
            return [], [Skipped(path.name, "log", str(exc))]
    raise SpecError(f"runs file {path}: expected .jsonl (planner validate records), .csv "
                    "(published_runs.csv columns) or .log (a training log)")


def by_source(runs: Iterable[MeasuredRun]) -> dict[str, list[MeasuredRun]]:
    """Runs grouped by source_id, in first-seen order."""
    out: dict[str, list[MeasuredRun]] = {}
    for run in runs:
        out.setdefault(run.source_id, []).append(run)
    return out

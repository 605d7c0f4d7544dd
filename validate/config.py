"""What one validate run is: the (scaled-down) model, the layout, the job and the step counts.

The launcher writes a RunConfig as JSON and every torchrun worker reads it (`--config PATH`), so
the run can also be started by hand on each node. No torch here: the launcher imports this."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from planner.errors import LayoutError, SpecError
from planner.layout import Layout
from planner.registry import validate_as
from planner.specs import ModelSpec


class ScaleDown(BaseModel):
    """Overrides that shrink a model spec's shape so that it runs small (None keeps the spec's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: PositiveInt | None = Field(default=None, description="num_hidden_layers.")
    hidden: PositiveInt | None = Field(default=None, description="hidden_size, elements.")
    heads: PositiveInt | None = Field(default=None, description="num_attention_heads.")
    kv_heads: PositiveInt | None = Field(default=None, description="num_key_value_heads.")
    ffn: PositiveInt | None = Field(default=None, description="intermediate_size, elements.")
    vocab: PositiveInt | None = Field(default=None, description="vocab_size.")


def scaled_spec(spec: ModelSpec, scale: ScaleDown) -> ModelSpec:
    """The spec with the overrides applied, as the validate model builds it.

    head_dim follows hidden / heads when either is overridden. An MoE spec with SwiGLU experts and
    no biases keeps its routed experts (validate.moe; --ffn sets the expert and the dense ffn,
    shared experts are left out); any other MoE spec, and an MLA one, becomes its dense,
    ordinary-attention shape (expert ffn as the MLP)."""
    data = spec.model_dump()
    if scale.layers is not None:
        data["num_hidden_layers"] = scale.layers
        data["first_k_dense_replace"] = 0
        if spec.layer_types is not None:  # the per-layer attention pattern, from its start
            types = spec.layer_types
            data["layer_types"] = [types[i % len(types)] for i in range(scale.layers)]
    if scale.hidden is not None:
        data["hidden_size"] = scale.hidden
    if scale.heads is not None:
        data["num_attention_heads"] = scale.heads
        if scale.kv_heads is None and spec.num_key_value_heads is not None:
            # keep the GQA ratio when it still divides
            ratio = spec.num_attention_heads // spec.kv_heads
            data["num_key_value_heads"] = max(1, scale.heads // ratio)
    if scale.kv_heads is not None:
        data["num_key_value_heads"] = scale.kv_heads
    if scale.hidden is not None or scale.heads is not None:
        data["head_dim"] = None
    if scale.ffn is not None:
        data["intermediate_size"] = scale.ffn
    if scale.vocab is not None:
        data["vocab_size"] = scale.vocab
    if spec.is_moe and spec.activation == "swiglu" and not spec.linear_bias:
        # intermediate_size is the spec's or already scale.ffn (above)
        data.update(moe_intermediate_size=scale.ffn or spec.expert_ffn, num_shared_experts=0)
    elif spec.is_moe:
        data["intermediate_size"] = scale.ffn or spec.expert_ffn
        data.update(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=None,
                    num_shared_experts=0, first_k_dense_replace=0, moe_layer_freq=1)
    if spec.is_mla:
        data.update(q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None,
                    qk_rope_head_dim=None, v_head_dim=None)
    if any(v is not None for v in scale.model_dump().values()):
        data["name"] = f"{spec.name}-scaled"
        data["aliases"] = []
        data["published_params_b"] = data["published_active_params_b"] = None
    return validate_as(ModelSpec, data, f"model {spec.name} scaled down")


class RunConfig(BaseModel):
    """One validate run, as every worker reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(description="Unique id of the run; the record carries it.")
    model: ModelSpec = Field(description="The model as it runs (already scaled down).")
    layout: dict[str, Any] = Field(description="planner.layout.Layout fields.")
    seq_len: PositiveInt = Field(description="Tokens per sequence.")
    global_batch: PositiveInt = Field(description="Sequences per optimizer step.")
    steps: PositiveInt = Field(description="Measured optimizer steps.")
    warmup: NonNegativeInt = Field(description="Unmeasured optimizer steps before them.")
    seed: int = Field(default=0, description="Seed of the initial weights and the synthetic data.")
    lr: float = Field(default=1e-3, gt=0, description="AdamW learning rate.")
    pp_schedule: Literal["1f1b", "gpipe"] = Field(
        default="1f1b", description="Pipeline schedule with vpp=1 (vpp>1 is interleaved 1F1B)."
    )
    collective_timeout_s: PositiveInt = Field(
        default=600, description="torch.distributed timeout of one collective, s."
    )
    check: bool = Field(
        default=True,
        description="Also run step 1 in one process on the full model and record its loss and "
        "gradient norm (the correctness reference).",
    )
    out: Path = Field(description="JSON-lines file rank 0 appends the record to.")
    run_dir: Path = Field(description="Folder for this run's per-rank error files.")
    base_record: dict[str, Any] = Field(
        default_factory=dict, description="Fields the launcher computed (plan columns, prediction)."
    )

    @property
    def plan_layout(self) -> Layout:
        return Layout(**self.layout)


def check_supported(model: ModelSpec, layout: Layout, global_batch: int, seq_len: int,
                    backend: str | None = None) -> list[str]:
    """What the validate worker cannot run for this model and layout, readable; empty when it can.

    These are the validate model's own limits on top of the cost model's structural checks.
    `backend` None skips the checks that depend on it."""
    out = []
    if layout.cp > 1 and backend == "gloo":
        out.append(f"cp={layout.cp}: torch's context parallelism (ring attention) has no CPU "
                   "kernel; run cp > 1 on GPUs")
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        out.append(f"cp={layout.cp} needs seq_len ({seq_len}) divisible by 2*cp (torch's "
                   "head-tail load balancing)")
    if layout.ep > 1 and not model.is_moe:
        out.append(f"ep={layout.ep} needs a mixture-of-experts model ({model.name} is dense)")
    elif model.is_moe:
        # experts over the DP ranks only (validate.moe: expert-TP 1, no CP in the expert groups)
        if layout.tp > 1 or layout.cp > 1:
            out.append("a mixture-of-experts model runs with tp=1 and cp=1 in validate (its "
                       "experts are laid out over the DP ranks)")
        if layout.dp % layout.ep or model.num_experts % layout.ep:
            out.append(f"ep={layout.ep} must divide dp ({layout.dp}) and the "
                       f"{model.num_experts} experts")
    if model.num_attention_heads % layout.tp or model.kv_heads % layout.tp:
        out.append(f"tp={layout.tp} must divide the heads ({model.num_attention_heads}) and the "
                   f"KV heads ({model.kv_heads}) of the model as it runs")
    if model.intermediate_size % layout.tp or model.vocab_size % layout.tp:
        out.append(f"tp={layout.tp} must divide the ffn ({model.intermediate_size}) and the "
                   f"vocabulary ({model.vocab_size})")
    if layout.sp and (seq_len // layout.cp) % layout.tp:
        out.append(f"sequence parallelism needs tp={layout.tp} to divide the {seq_len // layout.cp}"
                   " tokens per sequence on a rank")
    stages = layout.pp * layout.vpp
    from planner.costmodel.checks import stage_layers_violations

    out += stage_layers_violations(model.num_hidden_layers, layout)
    if stages > model.num_hidden_layers:
        out.append(f"pp*vpp={stages} stages need at least as many layers "
                   f"({model.num_hidden_layers})")
    if global_batch % (layout.mbs * layout.dp):
        out.append(f"global batch {global_batch} is not divisible by mbs*dp = "
                   f"{layout.mbs}*{layout.dp}")
    else:
        micro = global_batch // (layout.mbs * layout.dp)
        if layout.pp > 1 and micro < layout.pp:
            out.append(f"{micro} micro-batches per DP rank are fewer than pp={layout.pp} stages "
                       "(1F1B needs at least pp)")
        if layout.vpp > 1 and micro % layout.pp:
            out.append(f"interleaved 1F1B needs the micro-batches ({micro}) to be a multiple of "
                       f"pp={layout.pp}")
    if layout.vpp > 1 and layout.pp == 1:
        out.append("vpp > 1 needs pp > 1")
    if layout.sp and layout.tp == 1:
        out.append("sp needs tp > 1")
    return out


def require_supported(model: ModelSpec, layout: Layout, global_batch: int, seq_len: int,
                      backend: str | None = None) -> None:
    """Raise LayoutError listing what validate cannot run."""
    problems = check_supported(model, layout, global_batch, seq_len, backend)
    if problems:
        raise LayoutError(f"layout {layout} cannot be validated: " + "; ".join(problems))


def read_config(path: str | Path) -> RunConfig:
    """The RunConfig a launcher wrote."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"run config not found: {p}")
    return validate_as(RunConfig, json.loads(p.read_text()), str(p))

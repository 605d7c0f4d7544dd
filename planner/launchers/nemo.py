"""NeMo 2 / Megatron-Bridge: recipe overrides as a YAML file in ConfigContainer's structure,
and reading one (or a full saved ConfigContainer YAML, or a NeMo 1 megatron_gpt_config YAML).

Names: Megatron-Bridge at NVIDIA-NeMo/Megatron-Bridge commit
067f987df03b8355b03192d88d70f1709fedf51a
(2026-08-22): src/megatron/bridge/training/config.py (ConfigContainer: model, train, dataset, ddp,
optimizer, mixed_precision, comm_overlap), models/gpt_provider.py (GPTModelProvider, whose fields
are Megatron-Core's TransformerConfig and ModelParallelConfig), training/mixed_precision.py (the
recipe names bf16_mixed, fp16_mixed, bf16_with_fp8_current_scaling_mixed) and
training/comm_overlap.py (CommOverlapConfig). The override file's form is the repository's own
examples/*/conf/*_override_example.yaml ("ensure the structure matches the ConfigContainer");
scripts/training/train.sh takes the same overrides as KEY=VALUE. NeMo 2's llm recipes moved to
Megatron-Bridge (same Megatron-Core field names). Every key is checked against
known_keys/megatron_bridge.txt.

Where the model's fields live: a recipe whose model comes from AutoBridge.get_model_config() (the
llama family and every GPT-style bridge whose MODEL_CONFIG_CLASS is BridgeGPTModelConfig,
models/conversion/model_bridge.py) holds Megatron-Core's TransformerConfig under
`model.transformer` and only GPTModelConfig's own fields (OUTER_MODEL_FIELDS) at `model.`.
Overrides are merged into that structure (training/utils/omegaconf_utils.py
process_config_with_overrides: OmegaConf struct mode for KEY=VALUE, whose unknown keys are
refused; a YAML key the structure lacks is skipped with a warning), so the YAML and KEY=VALUE
forms write `model.transformer.FIELD`; the Python form writes `cfg.model.FIELD`, which
BridgeGPTModelConfig.__setattr__ forwards to the transformer (and a GPTModelProvider holds flat).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from planner.launchers.common import (
    Export,
    Imported,
    LaunchPlan,
    as_bool,
    as_int,
    mcore_attention_backend,
    select_functions,
    unknown_keys,
    walk_in_order,
)

NAME = "nemo"
KEYS = "megatron_bridge"
SOURCE = ("NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py @ 067f987df03b "
          "(2026-08-22)")
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                   "fp8": "bf16_with_fp8_current_scaling_mixed"}
# the fields of Megatron-LM megatron/training/models/gpt.py GPTModelConfig @ d98e8a64ddf3 (the
# base of Bridge's BridgeGPTModelConfig): at `model.`; every other model field is
# TransformerConfig's, at `model.transformer.`
OUTER_MODEL_FIELDS = frozenset((
    "builder", "transformer", "transformer_layer_spec", "vocab_size",
    "make_vocab_size_divisible_by", "should_pad_vocab", "seq_length", "fp16_lm_cross_entropy",
    "logit_dtype", "parallel_output", "share_embeddings_and_output_weights",
    "position_embedding_type", "rotary_percent", "rotary_base", "rope_scaling",
    "rope_scaling_factor", "scatter_embedding_sequence_parallel", "seq_len_interpolation_factor",
    "tp_comm_overlap_cfg", "use_arbitrary_attention_mask", "restore_modelopt_state",
    "extra_checkpoint_metadata", "pre_wrap_hooks", "post_wrap_hooks"))
COMM_OVERLAP_TARGET = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
# TransformerConfig's split fields, by the Megatron-LM argument that sets each
SPLIT_FIELDS = {
    "--account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
    "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
}


def overrides(plan: LaunchPlan, warnings: list[str]) -> dict[str, dict[str, Any]]:
    """ConfigContainer sections -> field -> value."""
    m, lay, job = plan.model, plan.layout, plan.job
    model: dict[str, Any] = {
        "num_layers": m.num_hidden_layers, "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.intermediate_size, "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.kv_heads,
    }
    if m.head_dim and m.head_dim != m.hidden_size // m.num_attention_heads:
        model["kv_channels"] = m.head_dim
    model.update(
        seq_length=job.seq_len, vocab_size=m.vocab_size,
        gated_linear_unit=m.activation in ("swiglu", "geglu"),
        normalization="RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        position_embedding_type={"rope": "rope", "learned": "learned_absolute"}.get(
            m.position_embedding, "none"),
        share_embeddings_and_output_weights=m.tie_word_embeddings,
        add_bias_linear=m.linear_bias,
    )
    if m.is_moe:
        model.update(num_moe_experts=m.num_experts, moe_router_topk=m.num_experts_per_tok,
                     moe_ffn_hidden_size=m.expert_ffn)
        if m.num_shared_experts:
            model["moe_shared_expert_intermediate_size"] = m.num_shared_experts * m.expert_ffn
        if m.first_k_dense_replace or m.moe_layer_freq != 1:
            # TransformerConfig.moe_layer_freq: an int or one 0/1 entry per layer
            model["moe_layer_freq"] = [int(m.is_moe_layer(i)) for i in range(m.num_hidden_layers)]
    if m.is_mla:
        warnings.append("MLA dimensions are not exported: start from the model's own recipe "
                        "(its provider sets q_lora_rank, kv_lora_rank, ...)")
    model.update(
        tensor_model_parallel_size=lay.tp, pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        context_parallel_size=lay.cp, expert_model_parallel_size=lay.ep,
        sequence_parallel=lay.sp,
        recompute_granularity=lay.recompute if lay.recompute in ("selective", "full") else None,
    )
    # the split by Megatron's own rule (megatron.split_args), every split field written so that
    # none the recipe sets (its account-for flags, its layout) is left to contradict it
    from planner.launchers.megatron import chunk_counts, split_args

    split = dict(split_args(m.num_hidden_layers, lay.pp, lay.vpp, chunk_counts(plan)))
    for flag, name in SPLIT_FIELDS.items():
        model[name] = split.get(flag, False if name.startswith("account") else None)
    if lay.recompute == "full":
        model.update(recompute_method="uniform", recompute_num_layers=1)
    if lay.recompute == "offload":
        # Megatron-Core TransformerConfig.cpu_offloading: activations of all but the last layer
        model.update(cpu_offloading=True, cpu_offloading_activations=True,
                     cpu_offloading_weights=False,
                     cpu_offloading_num_layers=m.num_hidden_layers // lay.pp - 1)
        if lay.pp > 1:
            warnings.append("Megatron-Core's cpu_offloading refuses pipeline parallelism "
                            "(TransformerConfig check); this layout needs another offload path")
    model["attention_backend"] = mcore_attention_backend(job.attention, warnings)
    ddp: dict[str, Any] = {
        "use_distributed_optimizer": lay.zero >= 1 and lay.zero < 2,
        "use_megatron_fsdp": lay.zero >= 2,
        "data_parallel_sharding_strategy": {0: "no_shard", 1: "no_shard", 2: "optim_grads",
                                            3: "optim_grads_params"}[lay.zero],
        "overlap_grad_reduce": job.grad_overlap,
        "overlap_param_gather": job.grad_overlap and lay.zero >= 1,
        "grad_reduce_in_fp32": job.grad_dtype != "half",
    }
    if job.grad_dtype == "half+fp32":
        warnings.append("grad_dtype half+fp32 is DeepSpeed's BF16_Optimizer; exported as fp32 "
                        "gradient reduction")
    if job.software != "current":
        warnings.append(f"software {job.software} is not Megatron-Bridge")
    return {
        "model": model,
        "train": {"micro_batch_size": lay.mbs, "global_batch_size": job.global_batch},
        "dataset": {"seq_length": job.seq_len},
        "ddp": ddp,
        "optimizer": {"use_distributed_optimizer": ddp["use_distributed_optimizer"]},
        "mixed_precision": MIXED_PRECISION[job.precision],
        # a recipe may leave comm_overlap None: the YAML form builds one (_target_, instantiated
        # by omegaconf_utils._apply_overrides), the Python form creates it when missing
        "comm_overlap": {"tp_comm_overlap": job.tp_comm_overlap,
                         "overlap_p2p_comm": job.p2p_overlap if lay.vpp > 1 else False},
    }


def nested(sections: dict[str, Any]) -> dict[str, Any]:
    """The sections as a builder-backed recipe's ConfigContainer holds them: TransformerConfig
    fields under model.transformer, comm_overlap as an instantiable CommOverlapConfig."""
    out = dict(sections)
    model = sections["model"]
    outer = {k: v for k, v in model.items() if k in OUTER_MODEL_FIELDS}
    out["model"] = {**outer, "transformer": {k: v for k, v in model.items()
                                             if k not in OUTER_MODEL_FIELDS}}
    out["comm_overlap"] = {"_target_": COMM_OVERLAP_TARGET, **sections["comm_overlap"]}
    return out


def _override_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it once the shell has passed the word on:
    null, true/false, a list without spaces (a space would split the KEY=VALUE word) in double
    quotes (no glob), a string with grammar characters (a pipeline layout) single-quoted for
    Hydra inside double quotes for the shell."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return '"[' + ",".join(_override_value(v) for v in value) + ']"'
    text = str(value)
    if any(c in text for c in " ,()[]{}=*|'\"$`\\"):
        return "\"'" + text + "'\""
    return text


def _flat_deep(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """DOTTED.KEY -> value of every leaf of a nested mapping."""
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _flat_deep(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _flat(sections: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for section, body in sections.items():
        if isinstance(body, dict):
            out += [(f"{section}.{k}", v) for k, v in body.items()]
        else:
            out.append((section, body))
    return out


def export(plan: LaunchPlan, form: str = "yaml") -> Export:
    """The overrides as YAML (form 'yaml') or as the Python lines a Megatron-Bridge recipe
    writes, `cfg.model.tensor_model_parallel_size = 4` (form 'python', as the performance
    recipes in src/megatron/bridge/perf_recipes do)."""
    warnings: list[str] = []
    sections = overrides(plan, warnings)
    flat = _flat(sections)
    keys = [k for k, _ in flat if "." in k]
    bad = unknown_keys(KEYS, keys)
    if bad:
        raise RuntimeError(f"Megatron-Bridge export uses keys ConfigContainer lacks: {bad}")
    cluster = plan.cluster
    tree = nested(sections)
    cli_pairs = [(k, v) for k, v in _flat_deep(tree) if not k.endswith("._target_")]
    lines = [
        *plan.header(),
        f"# Megatron-Bridge ConfigContainer overrides (names: {SOURCE}).",
        "# Apply on top of your model's recipe (e.g. llama3_70b_pretrain_config); launch on",
        f"# {cluster.num_nodes} node(s) x {cluster.gpus_per_node} GPUs:",
        f"#   ./scripts/training/train.sh --nodes {cluster.num_nodes} --gpus-per-node "
        f"{cluster.gpus_per_node} --recipe RECIPE [KEY=VALUE overrides below]",
        "# the same overrides as KEY=VALUE (the model's TransformerConfig fields under "
        "model.transformer, as",
        "# a builder-backed recipe holds them; a recipe still on GPTModelProvider takes "
        "model.FIELD):",
        "#   " + " ".join(f"{k}={_override_value(v)}" for k, v in cli_pairs),
        *[f"# WARNING: {w}" for w in warnings],
    ]
    if form == "python":
        lines += [
            "from megatron.bridge.training.config import ConfigContainer",
            "",
            "",
            "def planner_overrides(cfg: ConfigContainer) -> ConfigContainer:",
            '    """Apply the planned layout to a recipe\'s ConfigContainer."""',
            *[f"    cfg.{k} = {v!r}" for k, v in flat if not k.startswith("comm_overlap.")],
            "    if cfg.comm_overlap is None:  # the recipe has none: make one",
            "        from megatron.bridge.training.comm_overlap import CommOverlapConfig",
            "",
            "        cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap="
            f"{sections['comm_overlap']['tp_comm_overlap']!r})",
            *[f"    cfg.{k} = {v!r}" for k, v in flat if k.startswith("comm_overlap.")],
            "    return cfg",
            "",
        ]
    else:
        lines += [yaml.safe_dump(tree, sort_keys=False, default_flow_style=False).rstrip(), ""]
    return Export(NAME, "\n".join(lines), keys, warnings)


# ---- reading ----------------------------------------------------------------------------------

_PY_ASSIGN = re.compile(r"^\s*cfg\.(model|train|ddp|dataset|comm_overlap|mixed_precision)\b", re.M)


def looks_like(text: str, path: str) -> bool:
    if _PY_ASSIGN.search(text):
        return True  # a Megatron-Bridge recipe function (cfg.model.x = ...)
    return bool(re.search(r"^(model|train|trainer):\s*$", text, re.M)) and (
        "tensor_model_parallel_size" in text or "num_layers" in text
        or "global_batch_size" in text)


def _recipe_functions(tree: Any) -> dict[str, Any]:
    """The module's top-level functions that set a ConfigContainer (`cfg.SECTION... = ...`)."""
    import ast

    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(n, ast.Assign) and any(ast.unparse(t).startswith("cfg.")
                                                  for t in n.targets)
                for n in ast.walk(node)):
            out[node.name] = node
    return out


def python_sections(text: str, path: str, function: str | None = None) -> dict[str, Any]:
    """ConfigContainer sections from a recipe's Python (one recipe function of a file with
    several: common.select_functions): `cfg.SECTION.FIELD = literal` (and
    `cfg.model.transformer.FIELD`), `cfg.mixed_precision = NAME()` / `_perf_precision("bf16")`,
    CommOverlapConfig(...) keywords and a `cfg.comm_overlap.tp_comm_overlap_cfg = ...`
    (userbuffers: TP overlap on)."""
    import ast

    from planner.errors import SpecError

    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise SpecError(f"{path}: not valid Python: {exc.msg} (line {exc.lineno})") from None
    data: dict[str, Any] = {}
    precision_names = {"bf16": "bf16_mixed", "fp16": "fp16_mixed"}
    bodies = select_functions(path, function, _recipe_functions(tree), tree)
    for node in (n for body in bodies for n in walk_in_order(body)):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            chain: list[str] = []
            t: ast.AST = target
            while isinstance(t, ast.Attribute):
                chain.append(t.attr)
                t = t.value
            if not (isinstance(t, ast.Name) and t.id == "cfg") or not chain:
                continue
            chain.reverse()
            if chain[:2] == ["model", "transformer"] and len(chain) == 3:
                chain = ["model", chain[2]]  # a builder-backed model's TransformerConfig field
            value = node.value
            if chain == ["mixed_precision"] and isinstance(value, ast.Call):
                name = getattr(value.func, "id", getattr(value.func, "attr", ""))
                arg = value.args[0].value if value.args and isinstance(
                    value.args[0], ast.Constant) else None
                data["mixed_precision"] = (precision_names.get(arg, f"{arg}_mixed")
                                           if arg else name)
                if name == "_perf_precision":
                    # perf_recipes/_common.py: "Always sets grad_reduce_in_fp32=False"
                    data.setdefault("ddp", {})["grad_reduce_in_fp32"] = False
                continue
            if chain == ["comm_overlap"] and isinstance(value, ast.Call):
                section = data.setdefault("comm_overlap", {})
                for kw in value.keywords:
                    if kw.arg == "tp_comm_overlap" and isinstance(kw.value, ast.Constant):
                        section["tp_comm_overlap"] = kw.value.value
                continue
            if chain == ["mixed_precision"] and isinstance(value, ast.Constant):
                data["mixed_precision"] = value.value  # a recipe name: "bf16_mixed"
                continue
            if len(chain) != 2:
                continue
            if chain == ["comm_overlap", "tp_comm_overlap_cfg"]:
                data.setdefault("comm_overlap", {}).setdefault("tp_comm_overlap", True)
                continue
            try:
                literal = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError):
                continue  # e.g. torch.bfloat16, a function call: not a layout fact
            section = data.setdefault(chain[0], {})
            if isinstance(section, dict):  # (a precision set by name takes no fields here)
                section[chain[1]] = literal
    return data


def read(text: str, path: str, function: str | None = None) -> Imported:
    """A recipe's Python (`function`: which recipe function of a file with several) or a YAML
    (overrides, a printed ConfigContainer, NeMo 1's config with its interpolations resolved)."""
    from planner.errors import SpecError

    if _PY_ASSIGN.search(text):
        return from_data(python_sections(text, path, function), text, path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    notes: list[str] = []
    data = resolve_interpolations(data, notes)
    imported = from_data(data, text, path)
    imported.notes += notes
    return imported


_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def resolve_interpolations(data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """OmegaConf interpolations as NeMo's configs use them: `${.key}` (the same mapping),
    `${a.b}` (from the root) and NeMo 1's `${multiply:x, y}` resolver (nemo/core/config
    registers it: the product), innermost first. What stays unresolved is dropped with a note
    (an unread field, never a string read as a number)."""

    def lookup(ref: str, parent: dict[str, Any]) -> Any:
        node: Any = parent if ref.startswith(".") else data
        for part in ref.lstrip(".").split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def resolve(value: str, parent: dict[str, Any]) -> Any:
        for _ in range(8):
            m = _INTERPOLATION.search(value)
            if not m:
                break
            inner = m.group(1).strip()
            if inner.startswith("multiply:"):
                factors = [as_int(resolve(x.strip(), parent)) for x in inner[9:].split(",")]
                result: Any = None if None in factors else __import__("math").prod(factors)
            elif ":" in inner:
                result = None  # another resolver
            else:
                result = lookup(inner, parent)
            if result is None or isinstance(result, (dict, list)):
                return None
            if m.group(0) == value:
                return result
            value = value.replace(m.group(0), str(result))
        return None if "${" in value else value

    def walk(node: Any, key: str) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if isinstance(v, str) and "${" in v:
                    got = resolve(v, node)
                    if got is None:
                        notes.append(f"{key}{k}: {v} is not resolved (an OmegaConf resolver "
                                     "this reader does not know)")
                        continue
                    out[k] = got
                else:
                    out[k] = walk(v, f"{key}{k}.")
            return out
        return node

    return walk(data, "")


def from_data(data: dict[str, Any], text: str, path: str) -> Imported:
    """Model, layout and recipe from a ConfigContainer mapping (or NeMo 1's); shared by the
    config reader and the log reader (a printed ConfigContainer YAML)."""
    imported = Imported(NAME, path, framework="NeMo/Megatron-Bridge")
    model = dict(data.get("model") or {})
    transformer = model.pop("transformer", None)
    if isinstance(transformer, dict):  # a builder-backed model: TransformerConfig nested
        model.update(transformer)
    train = data.get("train") or {}
    dataset = data.get("dataset") or data.get("data") or {}
    ddp = data.get("ddp") or {}
    comm = data.get("comm_overlap") or {}
    trainer = data.get("trainer") or {}  # NeMo 1 megatron_gpt_config.yaml
    shape, pins, job = imported.shape, imported.pins, imported.job
    for src, key in (("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                     ("ffn_hidden_size", "intermediate_size"),
                     ("num_attention_heads", "num_attention_heads"),
                     ("num_query_groups", "num_key_value_heads"), ("kv_channels", "head_dim"),
                     ("vocab_size", "vocab_size"), ("num_moe_experts", "num_experts"),
                     ("moe_router_topk", "num_experts_per_tok"),
                     ("moe_ffn_hidden_size", "moe_intermediate_size")):
        if as_int(model.get(src)):
            shape[key] = as_int(model[src])
    if "num_layers" in model:
        glu = as_bool(model.get("gated_linear_unit"))
        act = str(model.get("activation", ""))
        shape["activation"] = "swiglu" if glu or "swiglu" in act else "gelu"
        norm = str(model.get("normalization", "LayerNorm")).lower()
        shape["norm"] = "rmsnorm" if "rms" in norm else "layernorm"
        pos = str(model.get("position_embedding_type", "learned_absolute"))
        shape["position_embedding"] = {"rope": "rope", "learned_absolute": "learned"}.get(
            pos, "none")
        share = as_bool(model.get("share_embeddings_and_output_weights"))
        shape["tie_word_embeddings"] = True if share is None else share
        bias = as_bool(model.get("add_bias_linear", model.get("bias")))
        shape["linear_bias"] = True if bias is None else bias
        freq = model.get("moe_layer_freq")
        if shape.get("num_experts") and freq is not None:
            from planner.launchers.megatron import read_layer_pattern

            freq_text = str(freq) if not isinstance(freq, list) else str([int(b) for b in freq])
            read = read_layer_pattern(freq_text, shape.get("num_hidden_layers", 0))
            if read:
                shape["first_k_dense_replace"], shape["moe_layer_freq"] = read
        if shape.get("num_experts") and as_int(model.get("moe_shared_expert_intermediate_size")) \
                and shape.get("moe_intermediate_size"):
            shape["num_shared_experts"] = (as_int(model["moe_shared_expert_intermediate_size"])
                                           // shape["moe_intermediate_size"])
    seq = (as_int(dataset.get("seq_length")) or as_int(model.get("seq_length"))
           or as_int(model.get("encoder_seq_length")))
    if seq:
        job["seq_len"] = seq
    gbs = as_int(train.get("global_batch_size")) or as_int(model.get("global_batch_size"))
    mbs = as_int(train.get("micro_batch_size")) or as_int(model.get("micro_batch_size"))
    if gbs:
        job["global_batch"] = gbs
    if mbs:
        pins["mbs"] = mbs
    for src, knob in (("tensor_model_parallel_size", "tp"),
                      ("pipeline_model_parallel_size", "pp"),
                      ("context_parallel_size", "cp"), ("expert_model_parallel_size", "ep")):
        if as_int(model.get(src)):
            pins[knob] = as_int(model[src])
    if "tensor_model_parallel_size" in model or "num_layers" in model:
        for knob in ("tp", "pp", "cp", "ep"):
            pins.setdefault(knob, 1)
        pins["vpp"] = as_int(model.get("virtual_pipeline_model_parallel_size")) or 1
        pins["sp"] = bool(as_bool(model.get("sequence_parallel")))
        if as_bool(model.get("cpu_offloading")):
            pins["recompute"] = "offload"
        else:
            gran = (model.get("recompute_granularity")
                    or model.get("activations_checkpoint_granularity"))  # NeMo 1
            pins["recompute"] = gran if gran in ("selective", "full") else "none"
    if pins.get("pp", 1) > 1 and shape.get("num_hidden_layers"):
        # TransformerConfig's split fields, read by Megatron's rules (megatron.read_split)
        from planner.launchers.megatron import read_split

        args = {flag: model[name] for flag, name in SPLIT_FIELDS.items()
                if model.get(name) not in (None, False)}
        read_split(args, shape, pins, imported)
    optimizer = data.get("optimizer") or {}
    dist = ddp.get("use_distributed_optimizer", optimizer.get("use_distributed_optimizer"))
    if as_bool(ddp.get("use_megatron_fsdp")):
        strategy = str(ddp.get("data_parallel_sharding_strategy", "optim_grads_params"))
        pins["zero"] = {"no_shard": 0, "optim": 1, "optim_grads": 2}.get(strategy, 3)
    elif dist is not None:
        pins["zero"] = 1 if as_bool(dist) else 0
    if "overlap_grad_reduce" in ddp:
        job["grad_overlap"] = bool(as_bool(ddp["overlap_grad_reduce"]))
    if "grad_reduce_in_fp32" in ddp:
        job["grad_dtype"] = "auto" if as_bool(ddp["grad_reduce_in_fp32"]) else "half"
    optim = model.get("optim")
    if "zero" not in pins and isinstance(optim, dict) and optim.get("name"):
        # NeMo 1: optim.name distributed_fused_adam (Apex's ZeRO-style sharded Adam) is ZeRO 1;
        # fused_adam and the others keep the whole optimizer state on every rank
        pins["zero"] = 1 if "distributed" in str(optim["name"]) else 0
    mixed = data.get("mixed_precision")
    if isinstance(mixed, dict):  # a printed MixedPrecisionConfig: its fields, not its key names
        fp8 = mixed.get("fp8") not in (None, False)
        precision = ("fp8" if fp8 else "fp16" if as_bool(mixed.get("fp16")) else
                     "bf16" if as_bool(mixed.get("bf16")) else "")
    else:
        precision = str(mixed or trainer.get("precision") or "")
    if "fp8" in precision or model.get("fp8") not in (None, False):
        job["precision"] = "fp8"
    elif "fp16" in precision or precision == "16":
        job["precision"] = "fp16"
    elif "bf16" in precision:
        job["precision"] = "bf16"
    backend = model.get("attention_backend")
    if "num_layers" in model or "tensor_model_parallel_size" in model:
        # None/auto: Transformer Engine picks cuDNN fused attention on Hopper and later
        job["attention"] = {"flash": "flash", "unfused": "unfused"}.get(str(backend), "cudnn")
    if comm:
        job["tp_comm_overlap"] = bool(as_bool(comm.get("tp_comm_overlap")))
        if "overlap_p2p_comm" in comm and pins.get("vpp", 1) > 1:
            job["p2p_overlap"] = bool(as_bool(comm["overlap_p2p_comm"]))
    elif "ub_tp_comm_overlap" in model:  # NeMo 1
        job["tp_comm_overlap"] = bool(as_bool(model["ub_tp_comm_overlap"]))
    launch = re.search(r"--nodes (\d+) --gpus-per-node (\d+)", text)
    if launch:
        imported.num_nodes, imported.gpus_per_node = int(launch.group(1)), int(launch.group(2))
    if as_int(trainer.get("num_nodes")):
        imported.num_nodes = as_int(trainer["num_nodes"])
    if as_int(trainer.get("devices")):
        imported.gpus_per_node = as_int(trainer["devices"])
    return imported

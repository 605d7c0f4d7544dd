"""torchtitan: a config-registry function (the current Python form) or the TOML job file of the
released versions, and reading either.

Forms (github.com/pytorch/torchtitan):
- TOML job files (`--job.config_file llama3_405b.toml`): releases v0.1.0 to v0.2.2 (v0.2.2 is
  73a0e6979dd1, 2026-02-20) and main before 9810191bbb03 (2026-02-23, "Config System Refactor:
  TOML to Python Dataclass Registry"). Read, and written with form 'toml' (`--out x.toml`).
- Python config registries (`--module M --config FUNCTION` returning `Trainer.Config`): main
  since 9810191bbb03. Since 73aed7f6c09c ("fold batch dim", 2026-08-20) TrainingConfig takes
  tokens (num_tokens_per_microbatch_per_dp_rank, num_tokens_per_train_step,
  max_context_length) instead of local_batch_size/global_batch_size/seq_len. Written here in the
  form of commit b5bcd76c66d0 (2026-08-21): torchtitan/config/configs.py (TrainingConfig,
  ParallelismConfig, CompileConfig), torchtitan/trainer.py (Trainer.Config),
  torchtitan/distributed/activation_checkpoint.py (FullAC, SelectiveAC; None = off, SelectiveAC
  the default), torchtitan/models/llama3/config_registry.py (llama3_405b, the layout the golden
  test reproduces). Both forms are read. Keys: known_keys/torchtitan.txt.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from planner.errors import SpecError
from planner.launchers.common import (
    Export,
    Imported,
    LaunchPlan,
    apply_chunks,
    as_bool,
    as_int,
    select_functions,
    shape_of,
    unknown_keys,
    walk_in_order,
)

NAME = "torchtitan"
KEYS = "torchtitan"
SOURCE = "pytorch/torchtitan torchtitan/config/configs.py @ b5bcd76c66d0 (2026-08-21)"
# torchtitan model flavors (torchtitan/models/<family>/__init__.py *_configs) -> built-in models
FLAVORS: dict[tuple[str, str], str] = {
    ("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b",
    ("llama3", "405B"): "llama3.1-405b",
}
_SHAPE_COMMENT = "# planner model shape: "


def titan_chunks(layers: int, stages: int, first_less: int = 1,
                 last_less: int = 1) -> list[int] | None:
    """Decoder layers of each pipeline chunk as torchtitan splits them
    (distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part @ b5bcd76c66d0, the same
    in v0.2.2 and 0.3.0): the embedding counts as `first_less` layers and the head as
    `last_less`, (L + both) // stages a chunk, the remainder one each to the first chunks; None
    where torchtitan refuses (an empty chunk, a weight above the chunk size) or drops layers."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    counts, placed = [], 0
    for i in range(stages):
        n = per + (1 if i < extra else 0) - (first_less if i == 0 else 0) - \
            (last_less if i == stages - 1 else 0)
        n = max(0, min(n, layers - placed))
        counts.append(n)
        placed += n
    return counts if placed == layers else None


def titan_stages(layers: int, pp: int, interleaved: bool, per_stage: int | None,
                 first_less: int = 1, last_less: int = 1) -> int:
    """Pipeline chunks torchtitan builds (pipeline_parallel.py _get_pipeline_metadata):
    ceil((L + first_less + last_less) / layers_per_stage), else pp (1F1B, GPipe) or 2 x pp
    (looped schedules such as Interleaved1F1B)."""
    if per_stage:
        return -(-(layers + first_less + last_less) // per_stage)
    return pp * (2 if interleaved else 1)


def split_fields(plan: LaunchPlan, head: str) -> dict[str, Any]:
    """ParallelismConfig fields that make torchtitan build the plan's chunks (the planner's
    split, Layout.chunk_counts: layers per virtual stage or per stage, else its even rule): the
    first/last-stage weights and layers per stage where torchtitan's own split gives them,
    else the modules of every chunk (module_fqns_per_model_part; `head` is the output
    projection's name: 'lm_head' since 2026, 'output' in v0.2.2)."""

    m, lay = plan.model, plan.layout
    layers, n = m.num_hidden_layers, lay.pp * lay.vpp
    want = lay.chunk_counts(layers)
    for first, last in ((1, 1), (0, 0), (1, 0), (0, 1)):
        if titan_chunks(layers, n, first, last) != want:
            continue
        effective = layers + first + last
        for per_stage in (None, -(-effective // n)):
            if titan_stages(layers, lay.pp, lay.vpp > 1, per_stage, first, last) == n:
                out: dict[str, Any] = {}
                if (first, last) != (1, 1):
                    out["pipeline_parallel_first_stage_less_layers"] = first
                    out["pipeline_parallel_last_stage_less_layers"] = last
                if per_stage:
                    out["pipeline_parallel_layers_per_stage"] = per_stage
                return out
    parts, start = [], 0
    for i, count in enumerate(want):
        part = [f"layers.{j}" for j in range(start, start + count)]
        start += count
        parts.append((["tok_embeddings"] if i == 0 else []) + part +
                     (["norm", head] if i == n - 1 else []))
    return {"module_fqns_per_model_part": parts}


def flavor_of(model_name: str, aliases: list[str]) -> tuple[str, str] | None:
    names = {model_name, *aliases}
    for key, builtin in FLAVORS.items():
        if builtin in names:
            return key
    return None


def export(plan: LaunchPlan, form: str = "python") -> Export:
    """The current config-registry function (form 'python'), or the TOML job file of torchtitan
    v0.1.0-v0.2.2 (form 'toml': the released versions before the 2026 refactor)."""
    if form == "toml":
        return export_toml(plan)
    m, lay, job = plan.model, plan.layout, plan.job
    warnings: list[str] = []
    flavor = flavor_of(m.name, m.aliases)
    if lay.zero == 1:
        warnings.append("ZeRO-1 has no FSDP2 form: exported as ZeRO-2 (FSDP sharding with "
                        "fsdp_reshard_after_forward='never'), which also shards gradients")
    if lay.zero == 0:
        replicate, shard, reshard = lay.dp, 1, None
    else:
        replicate, shard, reshard = 1, lay.dp, ("never" if lay.zero in (1, 2) else None)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
    }
    if reshard:
        parallelism["fsdp_reshard_after_forward"] = reshard
    parallelism.update(tensor_parallel_degree=lay.tp, enable_sequence_parallel=lay.sp,
                       pipeline_parallel_degree=lay.pp)
    if lay.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
        parallelism.update(split_fields(plan, "lm_head"))
    parallelism.update(context_parallel_degree=lay.cp, expert_parallel_degree=lay.ep)
    # the batch: main since 73aed7f6c09c counts tokens, release 0.3.0 sequences (local_batch_size
    # per DP rank and step: every pipeline micro-batch of the step with PP)
    training: dict[str, Any] = {
        "num_tokens_per_microbatch_per_dp_rank": f"{lay.mbs} * {job.seq_len}",
        "num_tokens_per_train_step": f"{job.global_batch} * {job.seq_len}",
        "max_context_length": job.seq_len,
    }
    release: dict[str, Any] = {
        "local_batch_size": lay.mbs * plan.grad_accum if lay.pp > 1 else lay.mbs,
        "global_batch_size": job.global_batch, "seq_len": job.seq_len,
    }
    if lay.pp > 1 or lay.ep > 1:
        # Trainer.Config._validate_cuda_graphs (trainer.py @ b5bcd76c66d0 and 0.3.0): CUDA graphs
        # (on by default) refuse pipeline parallelism and the default expert-parallel dispatcher
        training["disable_cuda_graphs"] = release["disable_cuda_graphs"] = True
    micro = {"num_pp_microbatches": plan.grad_accum} if lay.pp > 1 else {}
    release_micro = {"pipeline_parallel_microbatch_size": lay.mbs} if lay.pp > 1 else {}
    if lay.recompute == "offload":
        warnings.append("recompute=offload (activations to host) has no torchtitan config "
                        "(training.enable_cpu_offload offloads FSDP parameters and optimizer "
                        "state); exported with full activation checkpointing instead")
    ac = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()",
          "offload": "FullAC.Config()"}[lay.recompute]
    if job.precision == "fp16":
        warnings.append("torchtitan trains in bf16 (training.mixed_precision_param); fp16 is "
                        "not offered: exported as bf16")
    if job.attention != "flash":
        warnings.append(f"attention {job.attention}: torchtitan's attention (flex/sdpa) is "
                        "FlashAttention-2 class")
    if job.grad_dtype not in ("auto",):
        warnings.append(f"grad_dtype {job.grad_dtype}: torchtitan reduces gradients as "
                        "training.mixed_precision_reduce says (float32)")
    if not job.grad_overlap:
        warnings.append("grad_overlap off: FSDP2 always overlaps its reduce-scatters")
    if lay.vpp > 1 and not job.p2p_overlap:
        warnings.append("p2p_overlap off has no torchtitan switch")
    if job.software != "current":
        warnings.append(f"software {job.software} is not torchtitan")
    compile_kw = ({"enable": True, "enable_async_tensor_parallel": True}
                  if job.tp_comm_overlap else {})
    if job.tp_comm_overlap and not lay.sp:
        warnings.append("async TP needs sequence parallelism")
    converters = ""
    if job.precision == "fp8":
        # as torchtitan's llama3_405b: Float8 linears except the output projection
        converters = ', converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"])]'
    family, flavor_name = flavor or ("llama3", "CUSTOM")
    lines = [
        *plan.header(),
        f"# torchtitan config registry (names: {SOURCE}); the TOML form of torchtitan <= v0.2.2",
        "# is not written (it is read by `planner estimate --config`).",
        f"# launch on each of the {plan.cluster.num_nodes} node(s): torchrun --nnodes "
        f"{plan.cluster.num_nodes} --nproc_per_node {plan.cluster.gpus_per_node} "
        "-m torchtitan.train --module THIS_MODULE --config planner_plan",
        f"# (NGPU={plan.cluster.num_gpus}: the degrees' product)",
    ]
    if flavor is None:
        warnings.append(f"{m.name} has no torchtitan flavor here: register its shape as a "
                        "flavor (the line below) and replace CUSTOM")
        shape = {k: v for k, v in shape_of(m).items() if v is not None}
        lines.append(_SHAPE_COMMENT + repr(shape))
    lines += [f"# WARNING: {w}" for w in warnings]
    lines += [
        "",
        *(["from torchtitan.components.quantization import Float8LinearConverter"]
          if converters else []),
        "import dataclasses",
        "",
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        f"from torchtitan.models.{family} import model_registry",
        "from torchtitan.trainer import Trainer",
        "",
        "# torchtitan main since 73aed7f6c09c (2026-08-20) counts the batch in tokens; release "
        "0.3.0",
        "# (PyPI) in sequences: the fields of this TrainingConfig say which",
        "TOKENS = \"num_tokens_per_train_step\" in {f.name for f in "
        "dataclasses.fields(TrainingConfig)}",
        "",
        "",
        "def planner_plan() -> Trainer.Config:",
        f'    model_spec = model_registry("{flavor_name}"{converters})',
        "    if TOKENS:",
        "        training = TrainingConfig(",
        *[f"            {k}={v}," for k, v in training.items()],
        "        )",
        f"        microbatches = dict({', '.join(f'{k}={v!r}' for k, v in micro.items())})",
        "    else:  # release 0.3.0",
        "        training = TrainingConfig(",
        *[f"            {k}={v!r}," for k, v in release.items()],
        "        )",
        "        microbatches = dict("
        + ", ".join(f"{k}={v!r}" for k, v in release_micro.items()) + ")",
        "    return Trainer.Config(",
        "        model_spec=model_spec,",
        "        training=training,",
        "        parallelism=ParallelismConfig(",
        *[f"            {k}={v!r}," for k, v in parallelism.items()],
        "            **microbatches,",
        "        ),",
        f"        activation_checkpoint={ac},",
        "        compile=CompileConfig("
        + ", ".join(f"{k}={v!r}" for k, v in compile_kw.items()) + "),",
        "    )",
        "",
    ]
    keys = ([f"training.{k}" for k in training] + [f"parallelism.{k}" for k in parallelism]
            + [f"parallelism.{k}" for k in micro]
            + [f"v0.3.0.training.{k}" for k in release]
            + [f"v0.3.0.parallelism.{k}" for k in [*parallelism, *release_micro]]
            + [f"compile.{k}" for k in compile_kw]
            + ["trainer.model_spec", "trainer.training", "trainer.parallelism",
               "trainer.activation_checkpoint", "trainer.compile"])
    bad = unknown_keys(KEYS, keys)
    if bad:
        raise RuntimeError(f"torchtitan export uses keys its config lacks: {bad}")
    return Export(NAME, "\n".join(lines), keys, warnings)


def export_toml(plan: LaunchPlan) -> Export:
    """The TOML job file (`--job.config_file`) of torchtitan <= v0.2.2: names of
    torchtitan/config/job_config.py at 9810191bbb03^, layout as its llama3_405b.toml writes it."""
    m, lay, job = plan.model, plan.layout, plan.job
    warnings: list[str] = []
    flavor = flavor_of(m.name, m.aliases)
    family, flavor_name = flavor or ("llama3", "CUSTOM")
    if flavor is None:
        warnings.append(f"{m.name} has no torchtitan flavor here: register its shape as a "
                        "flavor (the line below) and replace CUSTOM")
    sections: dict[str, dict[str, Any]] = {
        "job": {"description": f"planner export: {m.name} {lay}"},
        "model": {"name": family, "flavor": flavor_name},
    }
    if job.precision == "fp8":
        sections["model"]["converters"] = ["float8"]
    if lay.pp > 1:  # one pipeline step per optimizer step: every micro-batch of the DP rank
        local = lay.mbs * plan.grad_accum
    else:
        local = lay.mbs
    sections["training"] = {"local_batch_size": local, "global_batch_size": job.global_batch,
                            "seq_len": job.seq_len}
    if lay.zero == 1:
        warnings.append("ZeRO-1 has no FSDP2 form: exported as ZeRO-2 (FSDP sharding with "
                        "fsdp_reshard_after_forward='never'), which also shards gradients")
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": lay.dp if lay.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if lay.zero == 0 else lay.dp,
    }
    if lay.zero in (1, 2):
        par["fsdp_reshard_after_forward"] = "never"
    par["tensor_parallel_degree"] = lay.tp
    if job.tp_comm_overlap:
        par["enable_async_tensor_parallel"] = True
    par["pipeline_parallel_degree"] = lay.pp
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
        par.update(split_fields(plan, "output"))  # v0.2.2 names the head 'output'
        par["pipeline_parallel_microbatch_size"] = lay.mbs
    par.update(context_parallel_degree=lay.cp, expert_parallel_degree=lay.ep)
    sections["parallelism"] = par
    sections["activation_checkpoint"] = {"mode": {"none": "none", "selective": "selective",
                                                  "full": "full", "offload": "full"}[lay.recompute]}
    if job.tp_comm_overlap:
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}
    if job.precision == "fp8":
        sections["quantize.linear.float8"] = {"filter_fqns": ["output"]}  # as llama3_405b.toml
    if lay.tp > 1 and not lay.sp:
        warnings.append("torchtitan <= v0.2.2 always runs sequence parallelism with TP")
    for cond, text in ((lay.recompute == "offload", "recompute=offload has no torchtitan "
                        "config: exported with full activation checkpointing"),
                       (job.precision == "fp16", "fp16 is not offered: trains in bf16"),
                       (job.attention != "flash", f"attention {job.attention}: torchtitan's "
                        "attention is FlashAttention-2 class"),
                       (job.grad_dtype != "auto", f"grad_dtype {job.grad_dtype}: gradients "
                        "reduced as training.mixed_precision_reduce says (float32)")):
        if cond:
            warnings.append(text)
    keys = [f"toml.{sec}.{k}" for sec, body in sections.items() for k in body]
    bad = unknown_keys(KEYS, keys)
    if bad:
        raise RuntimeError(f"torchtitan TOML export uses keys job_config.py lacks: {bad}")

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return str(v)

    lines = [*plan.header(),
             "# torchtitan TOML job file (torchtitan v0.1.0 to v0.2.2, main before 9810191bbb03 "
             "of 2026-02-23): --job.config_file THIS.toml",
             f"# launch on each of the {plan.cluster.num_nodes} node(s): torchrun --nnodes "
             f"{plan.cluster.num_nodes} --nproc_per_node {plan.cluster.gpus_per_node} "
             "-m torchtitan.train --job.config_file THIS.toml"]
    if flavor is None:
        lines.append(_SHAPE_COMMENT + repr({k: v for k, v in shape_of(m).items()
                                            if v is not None}))
    lines += [f"# WARNING: {w}" for w in warnings]
    for section, body in sections.items():
        lines += ["", f"[{section}]", *[f"{k} = {value(v)}" for k, v in body.items()]]
    lines.append("")
    return Export(NAME, "\n".join(lines), keys, warnings)


# ---- reading ----------------------------------------------------------------------------------

def looks_like(text: str, path: str) -> bool:
    if "torchtitan" in text and ("ParallelismConfig" in text or "TrainingConfig" in text):
        return True
    return bool(re.search(r"^\[parallelism\]", text, re.M)) and \
        bool(re.search(r"^\[training\]", text, re.M))


def _value(node: ast.AST) -> Any:
    """A literal, or simple arithmetic on literals (2 * 8192)."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, int) and isinstance(right, int):
            ops = {ast.Mult: lambda a, b: a * b, ast.Add: lambda a, b: a + b,
                   ast.Sub: lambda a, b: a - b, ast.FloorDiv: lambda a, b: a // b}
            op = ops.get(type(node.op))
            return op(left, right) if op else None
    return None


def _call_name(node: ast.Call) -> str:
    parts = []
    func: ast.AST = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _config_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's top-level functions that build a config (torchtitan's `--config FUNCTION`
    of a config registry): those that return Trainer.Config or set its sections."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        returns = ast.unparse(node.returns) if node.returns else ""
        body = ast.unparse(node)
        if "Config" in returns or any(k in body for k in ("TrainingConfig(",
                                                          "ParallelismConfig(",
                                                          ".parallelism.", ".training.")):
            out[node.name] = node
    return out


def _python_sections(text: str, path: str, function: str | None = None
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Section -> key -> value from the calls TrainingConfig(...), ParallelismConfig(...),
    CompileConfig(...) and assignments config.SECTION.KEY = value of one config function
    (_selected); and facts (family, flavor, activation checkpointing, float8)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise SpecError(f"{path}: not valid Python: {exc.msg} (line {exc.lineno})") from None
    bodies = select_functions(path, function, _config_functions(tree), tree)
    sections: dict[str, dict[str, Any]] = {"training": {}, "parallelism": {}, "compile": {}}
    facts: dict[str, Any] = {}
    names = {"TrainingConfig": "training", "ParallelismConfig": "parallelism",
             "CompileConfig": "compile"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("torchtitan.models.") and \
                any(a.name == "model_registry" for a in node.names):
            facts["family"] = node.module.split(".")[2]
    for node in (n for body in bodies for n in walk_in_order(body)):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            short = name.split(".")[-1]
            if short in names:
                for kw in node.keywords:
                    if kw.arg:
                        sections[names[short]][kw.arg] = _value(kw.value)
            elif short == "model_registry" and node.args:
                facts["flavor"] = _value(node.args[0])
            elif name.endswith(("FullAC.Config", "SelectiveAC.Config", "MemoryBudgetAC.Config")):
                facts.setdefault("ac", name.split(".")[-2])
            elif "Float8" in name or "MXFP8" in name:
                facts["fp8"] = True
            for kw in node.keywords:
                if kw.arg == "activation_checkpoint":
                    if isinstance(kw.value, ast.Constant) and kw.value.value is None:
                        facts["ac"] = "None"
                    elif isinstance(kw.value, ast.Call):
                        facts["ac"] = _call_name(kw.value).split(".")[-2]
        if isinstance(node, ast.Assign):
            for target in node.targets:
                chain = []
                t: ast.AST = target
                while isinstance(t, ast.Attribute):
                    chain.append(t.attr)
                    t = t.value
                chain.reverse()
                if len(chain) >= 2 and chain[-2] in sections:
                    sections[chain[-2]][chain[-1]] = _value(node.value)
                elif chain and chain[-1] == "activation_checkpoint":
                    if isinstance(node.value, ast.Call):
                        facts["ac"] = _call_name(node.value).split(".")[-2]
                    elif isinstance(node.value, ast.Constant) and node.value.value is None:
                        facts["ac"] = "None"
    family = re.search(r"models/(\w+)/config_registry\.py$", path.replace("\\", "/"))
    if "family" not in facts and family:
        facts["family"] = family.group(1)
    if "family" not in facts:
        # a config_registry.py inside torchtitan/models/<family>/ imports `from . import
        # model_registry` and its model class (Llama3Model, ...)
        m = re.search(r"\b(Llama3|Qwen3|DeepSeekV3)Model\b", text)
        if m:
            facts["family"] = {"Llama3": "llama3", "Qwen3": "qwen3",
                               "DeepSeekV3": "deepseek_v3"}[m.group(1)]
    shape = re.search(re.escape(_SHAPE_COMMENT) + r"(\{.*\})", text)
    if shape:
        facts["shape"] = ast.literal_eval(shape.group(1))
    return sections, facts


def _toml_sections(text: str, path: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: invalid TOML: {exc}") from None
    training = dict(data.get("training") or {})
    parallelism = dict(data.get("parallelism") or {})
    compile_ = dict(data.get("compile") or {})
    model = data.get("model") or {}
    facts: dict[str, Any] = {"family": model.get("name"), "flavor": model.get("flavor")}
    mode = (data.get("activation_checkpoint") or {}).get("mode", "selective")
    facts["ac"] = {"none": "None", "full": "FullAC", "selective": "SelectiveAC"}.get(mode, mode)
    converters = model.get("converters") or []
    if any("float8" in str(c) or "mx" in str(c) for c in converters):
        facts["fp8"] = True
    if parallelism.get("enable_async_tensor_parallel"):
        compile_["enable_async_tensor_parallel"] = True
    # TOML form: local_batch_size sequences per DP rank and step, pipeline micro-batches of
    # pipeline_parallel_microbatch_size sequences
    seq = as_int(training.get("seq_len"))
    if seq:
        training["max_context_length"] = seq
        local = as_int(training.get("local_batch_size"))
        pp = as_int(parallelism.get("pipeline_parallel_degree")) or 1
        mbs = as_int(parallelism.get("pipeline_parallel_microbatch_size")) or 1 if pp > 1 \
            else local
        if mbs:
            training["num_tokens_per_microbatch_per_dp_rank"] = mbs * seq
        gbs = as_int(training.get("global_batch_size"))
        if gbs and gbs > 0:
            training["num_tokens_per_train_step"] = gbs * seq
        elif local:
            facts["local_batch_size"] = local
    shape = re.search(re.escape(_SHAPE_COMMENT) + r"(\{.*\})", text)
    if shape:
        facts["shape"] = ast.literal_eval(shape.group(1))
    return {"training": training, "parallelism": parallelism, "compile": compile_}, facts


def read(text: str, path: str, function: str | None = None) -> Imported:
    """A TOML job file or a Python config module (`function`: which config function of a
    registry with several)."""
    is_toml = bool(re.search(r"^\[parallelism\]", text, re.M))
    if is_toml:
        sections, facts = _toml_sections(text, path)
    else:
        sections, facts = _python_sections(text, path, function)
    imported = from_sections(sections, facts, Imported(NAME, path, framework="torchtitan"),
                             is_toml)
    launch = re.search(r"--nnodes (\d+) --nproc_per_node (\d+)", text)
    if launch:
        imported.num_nodes, imported.gpus_per_node = int(launch.group(1)), int(launch.group(2))
    return imported


# torch.distributed.pipelining schedules.py get_schedule_class: the single-stage schedules (one
# chunk per rank; names compared in lower case); the others loop over several chunks a rank
SINGLE_STAGE_SCHEDULES = ("1f1b", "gpipe")


def resolve_split(imported: Imported, layers: int, pins: dict[str, Any]) -> None:
    """vpp and the layers of each chunk as torchtitan builds them for a model of `layers`
    layers (titan_stages, titan_chunks; or the config's module list), as the planner's split
    (common.apply_chunks). SpecError where torchtitan would refuse the split."""
    d = imported.deferred
    if pins.get("pp", 1) == 1 or "interleaved" not in d:
        return
    pp = pins["pp"]
    parts = imported.chunks
    if parts:
        stages, chunks = len(parts), parts
        what = "module_fqns_per_model_part"
    else:
        stages = titan_stages(layers, pp, bool(d["interleaved"]), d["layers_per_stage"] or None,
                              d["first_less"], d["last_less"])
        chunks = titan_chunks(layers, stages, d["first_less"], d["last_less"])
        what = (f"pipeline_parallel_layers_per_stage={d['layers_per_stage'] or 'default'} with "
                f"first/last stage weights {d['first_less']}/{d['last_less']}")
        if chunks is None:
            raise SpecError(f"{imported.path}: torchtitan cannot split {layers} layers into "
                            f"{stages} pipeline chunks ({what})")
    if stages % pp:
        raise SpecError(f"{imported.path}: {stages} pipeline chunks ({what}) is not a multiple "
                        f"of pipeline_parallel_degree {pp}")
    if "vpp" in pins and pins["vpp"] * pp != stages:
        return  # --vpp typed: the command line's split (the even rule)
    pins["vpp"] = stages // pp
    apply_chunks(imported, layers, pins, list(chunks), what)


def from_sections(sections: dict[str, dict[str, Any]], facts: dict[str, Any],
                  imported: Imported, is_toml: bool = False) -> Imported:
    """Model, layout and recipe from torchtitan's training/parallelism/compile sections and the
    facts around them (family, flavor, activation checkpointing, float8); shared by the config
    readers and the log reader (its "Running with configs" echo)."""
    training, par, comp = sections["training"], sections["parallelism"], sections["compile"]
    if not is_toml and "seq_len" in training:  # Python form of Feb-Aug 2026
        seq = as_int(training["seq_len"])
        training.setdefault("max_context_length", seq)
        local = as_int(training.get("local_batch_size"))
        if local and seq:
            training.setdefault("num_tokens_per_microbatch_per_dp_rank", local * seq)
        gbs = as_int(training.get("global_batch_size"))
        if gbs and gbs > 0 and seq:
            training.setdefault("num_tokens_per_train_step", gbs * seq)
    family, flavor = facts.get("family"), facts.get("flavor")
    builtin = FLAVORS.get((str(family), str(flavor)))
    if builtin:
        imported.model_name = builtin
    elif facts.get("shape"):
        imported.shape.update(facts["shape"])
    elif flavor:
        imported.notes.append(f"torchtitan flavor {family} {flavor} is not a built-in model; "
                              "give --model")
    seq = as_int(training.get("max_context_length")) or 2048  # TrainingConfig default
    imported.job["seq_len"] = seq
    pins = imported.pins
    tokens_mb = as_int(training.get("num_tokens_per_microbatch_per_dp_rank")) or 16384
    pins["mbs"] = max(1, tokens_mb // seq)
    step_tokens = as_int(training.get("num_tokens_per_train_step"))
    if step_tokens and step_tokens > 0:
        imported.job["global_batch"] = step_tokens // seq
    replicate = as_int(par.get("data_parallel_replicate_degree")) or 1
    shard = as_int(par.get("data_parallel_shard_degree"))
    shard = -1 if shard is None else shard
    pins["tp"] = as_int(par.get("tensor_parallel_degree")) or 1
    pins["pp"] = as_int(par.get("pipeline_parallel_degree")) or 1
    pins["cp"] = as_int(par.get("context_parallel_degree")) or 1
    pins["ep"] = as_int(par.get("expert_parallel_degree")) or 1
    sp = as_bool(par.get("enable_sequence_parallel"))
    pins["sp"] = pins["tp"] > 1 and (True if sp is None else sp)
    schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if pins["pp"] > 1:
        # the chunks follow from the model's layers (resolve_split); an explicit module list
        # states them
        imported.deferred.update(
            interleaved=int(schedule.lower() not in SINGLE_STAGE_SCHEDULES),
            layers_per_stage=as_int(par.get("pipeline_parallel_layers_per_stage")) or 0,
            first_less=as_int(par.get("pipeline_parallel_first_stage_less_layers", 1)) or 0,
            last_less=as_int(par.get("pipeline_parallel_last_stage_less_layers", 1)) or 0)
        parts = par.get("module_fqns_per_model_part")
        if isinstance(parts, list) and parts:
            imported.chunks = tuple(sum(str(x).startswith("layers.") for x in part)
                                    for part in parts)
    else:
        pins["vpp"] = 1
    if shard == 1 and replicate >= 1 and par.get("fsdp_reshard_after_forward") != "never":
        pins["zero"] = 0
        pins["dp"] = replicate
    else:
        if replicate > 1:
            imported.notes.append(f"HSDP (replicate {replicate} x shard {shard}) is read as "
                                  "ZeRO-3 over the whole data-parallel group")
        pins["zero"] = 2 if par.get("fsdp_reshard_after_forward") == "never" else 3
        if shard > 0:
            pins["dp"] = shard * replicate
    if not (step_tokens and step_tokens > 0):
        # no global batch stated: one accumulation step of every DP rank (trainer.py: tokens per
        # DP rank = micro-batch tokens x pipeline micro-batches; TOML form: local_batch_size)
        micro = as_int(par.get("num_pp_microbatches")) or 1
        per_rank = facts.get("local_batch_size") or pins["mbs"] * (micro if pins["pp"] > 1
                                                                    else 1)
        if "dp" in pins:
            imported.job["global_batch"] = per_rank * pins["dp"]
        else:
            imported.deferred["local_batch_size"] = per_rank
    ac = facts.get("ac", "SelectiveAC")  # Trainer.Config's default is SelectiveAC
    pins["recompute"] = {"None": "none", "FullAC": "full", "SelectiveAC": "selective",
                         "MemoryBudgetAC": "selective"}.get(ac, "selective")
    imported.job["precision"] = "fp8" if facts.get("fp8") else "bf16"
    imported.job["attention"] = "flash"
    imported.job["tp_comm_overlap"] = bool(comp.get("enable_async_tensor_parallel"))
    if "dp" in pins:
        imported.num_gpus = pins["dp"] * pins["tp"] * pins["pp"] * pins["cp"]
    return imported

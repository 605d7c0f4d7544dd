"""Megatron-LM: a runnable launch script (torchrun + pretrain_gpt.py arguments), and reading one.

Option names are Megatron-LM's own: megatron/training/arguments.py at NVIDIA/Megatron-LM commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22); the full list is
known_keys/megatron_lm.txt. The script's shape follows examples/gpt3/train_gpt3_175b_distributed.sh
of the same commit (CUDA_DEVICE_MAX_CONNECTIONS=1, torchrun's node arguments, pretrain_gpt.py).
The argument reader is shared with Megatron-DeepSpeed (planner.launchers.deepspeed), whose
pretrain_gpt.py takes the same Megatron names for the model and the layout.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from planner.errors import SpecError
from planner.launchers.common import (
    Export,
    Imported,
    LaunchPlan,
    apply_chunks,
    as_int,
    mcore_attention_backend,
    unknown_keys,
)

NAME = "megatron"
KEYS = "megatron_lm"
SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py @ d98e8a64ddf3 (2026-08-22)"
NORMALIZATION = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}  # --normalization choices
POSITION = {"rope": "rope", "learned": "learned_absolute", "none": "none", "alibi": None}


def model_args(plan: LaunchPlan, warnings: list[str]) -> list[tuple[str, Any]]:
    """The model's shape as Megatron arguments (shared with Megatron-DeepSpeed)."""
    m = plan.model
    args: list[tuple[str, Any]] = [
        ("--num-layers", m.num_hidden_layers),
        ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.intermediate_size),
        ("--num-attention-heads", m.num_attention_heads),
    ]
    if m.kv_heads != m.num_attention_heads:
        args += [("--group-query-attention", True), ("--num-query-groups", m.kv_heads)]
    if m.head_dim and m.head_dim != m.hidden_size // m.num_attention_heads:
        args.append(("--kv-channels", m.head_dim))
    args += [
        ("--seq-length", plan.job.seq_len),
        ("--max-position-embeddings", max(plan.job.seq_len, m.max_position_embeddings or 0)),
        ("--vocab-size", m.vocab_size),
    ]
    if m.activation == "swiglu":
        args.append(("--swiglu", True))
    elif m.activation not in ("gelu",):
        warnings.append(f"activation {m.activation} has no Megatron flag; GeLU is the default")
    args.append(("--normalization", NORMALIZATION[m.norm]))
    position = POSITION.get(m.position_embedding)
    if position is None:
        warnings.append(f"position embedding {m.position_embedding} has no Megatron choice")
    else:
        args.append(("--position-embedding-type", position))
    if not m.tie_word_embeddings:
        args.append(("--untie-embeddings-and-output-weights", True))
    if not m.linear_bias:
        args.append(("--disable-bias-linear", True))
    if m.is_moe:
        args += [("--num-experts", m.num_experts), ("--moe-router-topk", m.num_experts_per_tok),
                 ("--moe-ffn-hidden-size", m.expert_ffn)]
        if m.num_shared_experts:
            args.append(("--moe-shared-expert-intermediate-size",
                         m.num_shared_experts * m.expert_ffn))
        if m.first_k_dense_replace or m.moe_layer_freq != 1:
            pattern = [int(m.is_moe_layer(i)) for i in range(m.num_hidden_layers)]
            args.append(("--moe-layer-freq", layer_pattern(pattern)))
    if m.is_mla:
        args += [("--multi-latent-attention", True), ("--kv-lora-rank", m.kv_lora_rank),
                 ("--qk-head-dim", m.qk_nope_head_dim), ("--qk-pos-emb-head-dim",
                                                         m.qk_rope_head_dim),
                 ("--v-head-dim", m.v_head_dim)]
        if m.q_lora_rank:
            args.append(("--q-lora-rank", m.q_lora_rank))
    return args


def layer_pattern(pattern: list[int]) -> str:
    """Megatron's --moe-layer-freq pattern string (arguments.py moe_freq_type), run-length
    encoded: [0, 0, 0, 1, 1] -> '([0]*3+[1]*2)'."""
    runs: list[tuple[int, int]] = []
    for bit in pattern:
        if runs and runs[-1][0] == bit:
            runs[-1] = (bit, runs[-1][1] + 1)
        else:
            runs.append((bit, 1))
    return "(" + "+".join(f"[{b}]*{n}" for b, n in runs) + ")"


def read_layer_pattern(text: str, layers: int) -> tuple[int, int] | None:
    """(first_k_dense_replace, moe_layer_freq) of a --moe-layer-freq value: an integer N (one
    expert layer every N) or a pattern of [0]/[1] lists (evaluated with nothing but list
    arithmetic); None when the pattern is not k dense layers then every n-th an expert layer."""
    text = text.strip()
    if text.isdigit():
        return 0, int(text)
    if not re.fullmatch(r"[\[\]()+*,\d\s]+", text) or "**" in text or \
            any(int(n) > layers for n in re.findall(r"\d+", text)):
        return None  # list arithmetic on numbers no larger than the layer count, nothing else
    try:
        pattern = eval(text, {"__builtins__": {}}, {})
    except (SyntaxError, TypeError, ValueError):
        return None
    if not isinstance(pattern, list) or len(pattern) != layers or 1 not in pattern:
        return None
    first = pattern.index(1)
    ones = [i for i, b in enumerate(pattern) if b]
    step = ones[1] - ones[0] if len(ones) > 1 else 1
    expected = [int(i >= first and (i - first) % step == 0) for i in range(layers)]
    return (first, step) if expected == pattern else None


def chunk_counts(plan: LaunchPlan) -> list[int]:
    """Decoder layers of each model chunk in layer order (chunk c on pipeline rank c mod pp), as
    the planner costs them (Layout.chunk_counts)."""
    return plan.layout.chunk_counts(plan.model.num_hidden_layers)


def split_args(layers: int, pp: int, vpp: int, chunks: list[int]) -> list[tuple[str, Any]]:
    """The fewest Megatron-LM arguments that make the model build `chunks` (decoder layers of
    each of the pp x vpp chunks, in layer order). Megatron's rules (transformer_block.py
    get_num_layers_to_build @ d98e8a64ddf3): an even split of the layers, with
    --account-for-embedding/loss-in-pipeline-split counting the embedding and the loss as one
    layer each (one fewer layer on the first / last chunk); with vpp 1,
    --decoder-first/last-pipeline-num-layers and the rest even; anything else is stated chunk by
    chunk with --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py)."""
    if pp == 1:
        return []
    n = pp * vpp
    # since Megatron-LM ef490839e8 (2025-02-03); older releases take
    # --num-layers-per-virtual-pipeline-stage L/(pp*vpp) (both are read back)
    virtual = [("--num-virtual-stages-per-pipeline-rank", vpp)] if vpp > 1 else []
    for emb, loss in ((0, 0), (1, 1), (1, 0), (0, 1)):
        if (layers + emb + loss) % n:
            continue
        rule = [(layers + emb + loss) // n] * n
        rule[0] -= emb
        rule[-1] -= loss
        if rule == chunks:
            return virtual + [("--account-for-embedding-in-pipeline-split", True)] * emb + \
                [("--account-for-loss-in-pipeline-split", True)] * loss
    if vpp == 1 and len(set(chunks[1:-1])) <= 1:
        return [("--decoder-first-pipeline-num-layers", chunks[0]),
                ("--decoder-last-pipeline-num-layers", chunks[-1])]
    return [("--pipeline-model-parallel-layout", layout_string(chunks))]


def layout_string(chunks: list[int]) -> str:
    """Megatron's pipeline layout string for decoder layers per chunk: 'E' embedding, 't' a
    decoder layer, 'L' the loss, '|' between chunks, runs of equal chunks as '(t*8|)*14'
    (PipelineParallelLayerLayout.parse_str_to_list's grammar):
    [7, 8, 8, 7] -> 'Et*7|(t*8|)*2t*7L'."""
    body = ["t" * n if n < 2 else f"t*{n}" for n in chunks]
    out = "E" + body[0] + "|"
    i = 1
    while i < len(body) - 1:
        j = i
        while j + 1 < len(body) - 1 and body[j + 1] == body[i]:
            j += 1
        run = j - i + 1
        out += f"({body[i]}|)*{run}" if run > 1 else body[i] + "|"
        i = j + 1
    return out + body[-1] + "L"


def read_layout_string(text: str) -> list[tuple[int, int, int]]:
    """(embeddings, decoder layers, losses) of each chunk of a Megatron pipeline layout string
    (planner.layout.parse_pipeline_layout: Megatron-Core's grammar and rules); SpecError when
    it breaks them."""
    return [(e, t, loss) for e, t, _, loss in _layout_chunks(text)]


def _layout_chunks(text: str) -> list[tuple[int, int, int, int]]:
    """parse_pipeline_layout's (embeddings, decoder, MTP, losses) per chunk; SpecError."""
    from planner.errors import LayoutError
    from planner.layout import parse_pipeline_layout

    try:
        return parse_pipeline_layout(text)
    except LayoutError as err:
        raise SpecError(f"--pipeline-model-parallel-layout {err}") from None


def layout_args(plan: LaunchPlan, warnings: list[str]) -> list[tuple[str, Any]]:
    """Degrees, batch, sharding, recomputation, precision and overlap as Megatron-LM arguments."""
    lay, job = plan.layout, plan.job
    args: list[tuple[str, Any]] = [
        ("--tensor-model-parallel-size", lay.tp),
        ("--pipeline-model-parallel-size", lay.pp),
    ]
    args += split_args(plan.model.num_hidden_layers, lay.pp, lay.vpp, chunk_counts(plan))
    if lay.cp > 1:
        args.append(("--context-parallel-size", lay.cp))
    if lay.ep > 1:
        args.append(("--expert-model-parallel-size", lay.ep))
    if plan.model.is_moe:
        args += moe_args(plan)
    args += [("--micro-batch-size", lay.mbs), ("--global-batch-size", job.global_batch)]
    if lay.sp:
        args.append(("--sequence-parallel", True))
    if lay.zero == 1:
        args.append(("--use-distributed-optimizer", True))  # ZeRO-1: optimizer state sharded
    elif lay.zero in (2, 3):
        # Megatron-FSDP: DistributedDataParallelConfig.data_parallel_sharding_strategy
        # ('optim_grads' = ZeRO-2, 'optim_grads_params' = ZeRO-3)
        # (arguments.py validate_args: Megatron-FSDP needs --ckpt-format fsdp_dtensor and
        # refuses CUDA_DEVICE_MAX_CONNECTIONS=1, which export() then leaves unset)
        args += [("--use-megatron-fsdp", True), ("--data-parallel-sharding-strategy",
                                                 "optim_grads" if lay.zero == 2 else
                                                 "optim_grads_params"),
                 ("--ckpt-format", "fsdp_dtensor")]
    if job.grad_overlap:  # Megatron's default is off: the reduction after the backward
        args.append(("--overlap-grad-reduce", True))
        if lay.zero >= 1:
            args.append(("--overlap-param-gather", True))
    if lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    elif lay.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif lay.recompute == "offload":
        warnings.append(
            "recompute=offload (every layer's activations to host memory) has no pretrain_gpt.py "
            "flag at this commit (TransformerConfig.cpu_offloading is not on the command line); "
            "set cpu_offloading=True, cpu_offloading_activations=True in a YAML config")
    args += precision_args(plan, warnings)
    args.append(("--attention-backend", mcore_attention_backend(job.attention, warnings)))
    if job.tp_comm_overlap:
        args.append(("--tp-comm-overlap", True))
    if lay.vpp > 1 and not job.p2p_overlap:
        args.append(("--no-overlap-p2p-communication", True))
    return args


# JobSpec.moe_dispatcher -> Megatron-Core's moe_token_dispatcher_type (DeepEP is the flex
# dispatcher's backend; transformer_config.py at d98e8a6)
MOE_DISPATCHER = {"alltoall": [("--moe-token-dispatcher-type", "alltoall")],
                  "allgather": [("--moe-token-dispatcher-type", "allgather")],
                  "deepep": [("--moe-token-dispatcher-type", "flex"),
                             ("--moe-flex-dispatcher-backend", "deepep")]}


def moe_args(plan: LaunchPlan) -> list[tuple[str, Any]]:
    """Expert-TP (where it differs from TP, Megatron's default), the token dispatcher and the
    capacity factor (none: dropless) of an MoE plan."""
    lay, job = plan.layout, plan.job
    args: list[tuple[str, Any]] = []
    if lay.etp:
        args.append(("--expert-tensor-parallel-size", lay.expert_tp))
    args += MOE_DISPATCHER[job.moe_dispatcher]
    if job.moe_capacity_factor is not None:
        args.append(("--moe-expert-capacity-factor", job.moe_capacity_factor))
    # JobSpec.moe_routing / moe_ep_overlap -> Megatron-Core's flags (arguments.py); aux_loss
    # is Megatron's default load-balancing type
    if job.moe_routing == "force_balanced":
        args.append(("--moe-router-force-load-balancing", True))
    elif job.moe_routing == "loss_free":
        args += [("--moe-router-enable-expert-bias", True),
                 ("--moe-router-load-balancing-type", "none")]
    if job.moe_ep_overlap:
        args.append(("--overlap-moe-expert-parallel-comm", True))
    return args


def precision_args(plan: LaunchPlan, warnings: list[str]) -> list[tuple[str, Any]]:
    job = plan.job
    if job.precision == "fp16":
        args: list[tuple[str, Any]] = [("--fp16", True)]
    else:
        args = [("--bf16", True)]
    if job.precision == "fp8":
        # Transformer Engine FP8: E4M3 forward, E5M2 gradients ('hybrid'); the scaling recipe
        # keeps Megatron's default (--fp8-recipe delayed)
        args.append(("--fp8-format", "hybrid"))
    if job.grad_dtype == "half":
        args.append(("--grad-reduce-in-bf16", True))
    elif job.grad_dtype == "fp32":
        args.append(("--accumulate-allreduce-grads-in-fp32", True))
    elif job.grad_dtype == "half+fp32":
        warnings.append("grad_dtype half+fp32 is DeepSpeed's BF16_Optimizer; Megatron keeps fp32 "
                        "main gradients")
    if job.software == "megatron-2021":
        warnings.append("software megatron-2021: the memory model of Megatron-LM before July "
                        "2021; this script runs the current Megatron-LM")
    elif job.software != "current":
        warnings.append(f"software {job.software} is not Megatron-LM")
    return args


def format_args(args: list[tuple[str, Any]], indent: str = "    ") -> list[str]:
    """One `--flag value \\` line per argument (flags without a value for True)."""
    lines = []
    for key, value in args:
        text = key if value is True else f"{key} {shlex.quote(str(value))}"
        lines.append(f"{indent}{text} \\")
    return lines


def connections_lines(plan: LaunchPlan) -> list[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM's validate_args wants it (@ d98e8a64ddf3):
    1 for TP or CP before Blackwell (one hardware queue keeps the TP/CP communication kernels
    in issue order), and never 1 with Megatron-FSDP (ZeRO-2/3), which asserts it unset or > 1."""
    if plan.layout.zero in (2, 3):
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1"]
    return ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]


def export(plan: LaunchPlan) -> Export:
    """A bash launch script: torchrun's node arguments, then pretrain_gpt.py's arguments."""
    warnings: list[str] = []
    args = model_args(plan, warnings) + layout_args(plan, warnings)
    args.append(("--tokenizer-type", "NullTokenizer"))
    cluster = plan.cluster
    lines = ["#!/bin/bash", *plan.header(),
             f"# Megatron-LM option names: {SOURCE}; shape of examples/gpt3/"
             "train_gpt3_175b_distributed.sh.",
             "# NullTokenizer with --vocab-size benchmarks the layout; replace it with your "
             "tokenizer and data arguments (--data-path, --tokenizer-model, ...) and add the "
             "optimizer's (--lr, --train-iters, ...).",
             *([f"# virtual stages: Megatron-LM before ef490839e8 (2025-02-03) takes "
                f"--num-layers-per-virtual-pipeline-stage "
                f"{plan.model.num_hidden_layers // (plan.layout.pp * plan.layout.vpp)} instead"]
               if plan.layout.vpp > 1 else []),
             *[f"# WARNING: {w}" for w in warnings],
             "set -euo pipefail",
             *connections_lines(plan),
             f"GPUS_PER_NODE={cluster.gpus_per_node}",
             f"NUM_NODES={cluster.num_nodes}",
             "NODE_RANK=${NODE_RANK:-0}",
             "MASTER_ADDR=${MASTER_ADDR:-localhost}",
             "MASTER_PORT=${MASTER_PORT:-29500}",
             "",
             "torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES --node_rank $NODE_RANK "
             "--master_addr $MASTER_ADDR --master_port $MASTER_PORT \\",
             "  pretrain_gpt.py \\",
             *format_args(args),
             '    "$@"', ""]
    keys = [k for k, _ in args]
    bad = unknown_keys(KEYS, keys)
    if bad:
        raise RuntimeError(f"Megatron-LM export uses options the argument list lacks: {bad}")
    return Export(NAME, "\n".join(lines), keys, warnings)


# ---- reading arguments --------------------------------------------------------------------------

_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def _variables(text: str) -> dict[str, str]:
    """Simple shell assignments NAME=value (first word of the value, ${NAME:-default} kept as
    its default), for resolving $NAME in arguments."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _ASSIGN.match(line)
        if not m or m.group(2).startswith("("):
            continue
        try:
            words = shlex.split(m.group(2), comments=True)
        except ValueError:
            continue
        if words:
            value = words[0]
            d = re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", value)
            out[m.group(1)] = d.group(1) if d else value
    return out


def _resolve(word: str, variables: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return variables.get(name, m.group(0))

    for _ in range(3):
        word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, word)
    return word


def _split_unquoted(word: str) -> list[str]:
    """A quoted array element such as "--fp8-format hybrid" as the launch line gets it: bash
    splits it into words where the array is expanded unquoted (${ARGS[@]}, as Megatron-LM's
    examples/llama/train_llama3_8b_h100_fp8.sh does); expanded quoted it would reach argparse as
    one unknown option, so splitting is the reading under which the script runs."""
    if not word.startswith("--") or not any(c.isspace() for c in word) or \
            "=" in word.split(None, 1)[0]:
        return [word]
    try:
        return shlex.split(word)
    except ValueError:
        return word.split()


def parse_args_text(text: str) -> dict[str, Any]:
    """Every `--flag [value]` of a script or an argument list: value or True; $VARS resolved
    from the script's simple assignments, later flags win. Bash arrays and heredocs are read as
    words; a heredoc's body (e.g. a ds_config) is skipped."""
    variables = _variables(text)
    text = re.sub(r"<<-?\s*'?(\w+)'?.*?\n.*?\n\1\s*\n", "\n", text, flags=re.S)  # heredocs
    text = text.replace("\\\n", " ")
    out: dict[str, Any] = {}
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        words = [part for w in words for part in _split_unquoted(_resolve(w, variables))]
        for i, word in enumerate(words):
            if not word.startswith("--") or len(word) < 3:
                continue
            key, eq, value = word.partition("=")
            if eq:
                out[key] = value
            elif i + 1 < len(words) and not words[i + 1].startswith("--") and \
                    words[i + 1] not in (")", "\\", "$@", "$*", "|", "&&", ";"):
                out[key] = words[i + 1]
            else:
                out[key] = True
    return out


def read_split(args: dict[str, Any], shape: dict[str, Any], pins: dict[str, Any],
               imported: Imported) -> None:
    """The pipeline split the arguments give (--pipeline-model-parallel-layout, the
    --account-for-embedding/loss-in-pipeline-split flags, --decoder-first/last-pipeline-num-
    layers; Megatron's rules as split_args states them) as the planner's: nothing when it is the
    planner's even rule (costmodel.pipeline.stage_layer_counts), explicit per-stage layers
    (Imported.stage_layers) with vpp 1, and SpecError naming both splits otherwise (the planner
    splits interleaved chunks only by its even rule)."""
    pp = pins.get("pp", 1)
    layers = shape.get("num_hidden_layers")
    text = args.get("--pipeline-model-parallel-layout")
    first = as_int(args.get("--decoder-first-pipeline-num-layers"))
    last = as_int(args.get("--decoder-last-pipeline-num-layers"))
    emb = int(_flag(args, "--account-for-embedding-in-pipeline-split"))
    loss = int(_flag(args, "--account-for-loss-in-pipeline-split"))
    where = f"{imported.path}: --pipeline-model-parallel-layout {text}"
    if text not in (None, True):
        parsed = _layout_chunks(str(text))  # E opens, L closes, once each (checked there)
        if len(parsed) % pp:
            raise SpecError(f"{where} has {len(parsed)} stages, not a multiple of "
                            f"--pipeline-model-parallel-size {pp}")
        counts = [c[1] for c in parsed]
        if layers and sum(counts) != layers:
            raise SpecError(f"{where} holds {sum(counts)} decoder layers, --num-layers is "
                            f"{layers}")
        layers = shape["num_hidden_layers"] = sum(counts)
        pins["vpp"] = len(parsed) // pp
        where_mtp = [i for i, c in enumerate(parsed) if c[2]]
        if where_mtp and where_mtp[0] != len(parsed) - 1:
            imported.notes.append(
                f"the pipeline layout's MTP layers (m) sit on virtual stage {where_mtp[0]}; the "
                "planner costs them with the loss on the last (Megatron-Core's default)")
    elif pp > 1 and layers and (first is not None or last is not None):
        inner = pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        if pins.get("vpp", 1) > 1 or (inner and rest % inner):
            raise SpecError(f"{imported.path}: --decoder-first/last-pipeline-num-layers leave "
                            f"{rest} layers that {inner} stages cannot share evenly")
        even = rest // inner if inner else 0
        counts = [even] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
    elif pp > 1 and layers and (emb or loss):
        n = pp * pins.get("vpp", 1)
        if (layers + emb + loss) % n:
            raise SpecError(f"{imported.path}: {layers} layers + {emb + loss} (embedding/loss "
                            f"accounted for) do not divide into {n} pipeline chunks")
        counts = [(layers + emb + loss) // n] * n
        counts[0] -= emb
        counts[-1] -= loss
    else:
        return
    apply_chunks(imported, layers, pins, counts, "the pipeline split")


def _flag(args: dict[str, Any], *names: str) -> bool:
    return any(args.get(n) is True or str(args.get(n, "")).lower() == "true" for n in names)


def read_args(args: dict[str, Any], imported: Imported) -> Imported:
    """Model shape, layout and recipe from Megatron argument names (Megatron-LM and
    Megatron-DeepSpeed), with Megatron-LM's defaults for what the list leaves out."""
    shape, pins, job = imported.shape, imported.pins, imported.job
    for flag, key in (("--num-layers", "num_hidden_layers"), ("--hidden-size", "hidden_size"),
                      ("--num-attention-heads", "num_attention_heads"),
                      ("--ffn-hidden-size", "intermediate_size"), ("--vocab-size", "vocab_size"),
                      ("--kv-channels", "head_dim")):
        value = as_int(args.get(flag))
        if value:
            shape[key] = value
    hidden = shape.get("hidden_size")
    if hidden and "intermediate_size" not in shape and "--num-layers" in args:
        # Megatron's default ffn_hidden_size (arguments.py validate_args): 4h, or with SwiGLU
        # 2/3 of it rounded down to a multiple of 64
        shape["intermediate_size"] = (int(4 * hidden * 2 / 3 / 64) * 64
                                      if _flag(args, "--swiglu") else 4 * hidden)
    kv = as_int(args.get("--num-query-groups")) or as_int(args.get("--num-key-value-heads"))
    if _flag(args, "--group-query-attention") or "--num-key-value-heads" in args:
        shape["num_key_value_heads"] = kv or 1  # Megatron's num_query_groups default is 1
    if "--num-layers" in args:
        shape["activation"] = "swiglu" if _flag(args, "--swiglu") else "gelu"
        norm = str(args.get("--normalization", "LayerNorm")).lower()
        shape["norm"] = "rmsnorm" if "rms" in norm else "layernorm"
        position = str(args.get("--position-embedding-type", "learned_absolute"))
        if _flag(args, "--use-rotary-position-embeddings"):
            position = "rope"
        shape["position_embedding"] = {"rope": "rope", "learned_absolute": "learned",
                                       "none": "none"}.get(position, "rope")
        shape["tie_word_embeddings"] = not _flag(args, "--untie-embeddings-and-output-weights")
        shape["linear_bias"] = not _flag(args, "--disable-bias-linear")
    experts = args.get("--num-experts")
    if experts not in (None, True):
        n = as_int(str(experts).split()[0])
        if n and n > 1:
            shape["num_experts"] = n
            shape["num_experts_per_tok"] = as_int(args.get("--moe-router-topk")) or 2
            ffn = as_int(args.get("--moe-ffn-hidden-size"))
            if ffn:
                shape["moe_intermediate_size"] = ffn
            shared = as_int(args.get("--moe-shared-expert-intermediate-size"))
            if shared and ffn:
                shape["num_shared_experts"] = shared // ffn
            freq = args.get("--moe-layer-freq")
            if freq not in (None, True) and shape.get("num_hidden_layers"):
                read = read_layer_pattern(str(freq), shape["num_hidden_layers"])
                if read:
                    shape["first_k_dense_replace"], shape["moe_layer_freq"] = read
                else:
                    imported.notes.append(f"--moe-layer-freq {freq} is not k dense layers then "
                                          "every n-th an expert layer: read as all-MoE")
    if _flag(args, "--multi-latent-attention"):
        for flag, key in (("--q-lora-rank", "q_lora_rank"), ("--kv-lora-rank", "kv_lora_rank"),
                          ("--qk-head-dim", "qk_nope_head_dim"),
                          ("--qk-pos-emb-head-dim", "qk_rope_head_dim"),
                          ("--v-head-dim", "v_head_dim")):
            if as_int(args.get(flag)):
                shape[key] = as_int(args.get(flag))
    if (tok := str(args.get("--tokenizer-type", ""))) == "GPT2BPETokenizer" and \
            "vocab_size" not in shape:
        shape["vocab_size"] = 50257  # GPT-2 BPE (Radford et al. 2019), what the GPT-3 scripts use
        imported.notes.append(f"vocabulary 50257 from --tokenizer-type {tok}")
    elif "vocab_size" not in shape and "--vocab-file" in args and "--merge-file" in args:
        shape["vocab_size"] = 50257
        imported.notes.append("vocabulary 50257: a --vocab-file/--merge-file pair is GPT-2 BPE")
    seq = as_int(args.get("--seq-length")) or as_int(args.get("--encoder-seq-length"))
    if seq:
        job["seq_len"] = seq
    gbs = as_int(args.get("--global-batch-size"))
    if gbs:
        job["global_batch"] = gbs
    for flag, knob in (("--tensor-model-parallel-size", "tp"),
                       ("--pipeline-model-parallel-size", "pp"),
                       ("--context-parallel-size", "cp"), ("--expert-model-parallel-size", "ep"),
                       ("--expert-tensor-parallel-size", "etp"), ("--micro-batch-size", "mbs")):
        value = as_int(args.get(flag))
        if value:
            pins[knob] = value
    if "--num-layers" in args or "--tensor-model-parallel-size" in args:
        for knob in ("tp", "pp", "cp", "mbs"):
            pins.setdefault(knob, 1)  # Megatron's defaults
        pins.setdefault("ep", 1)
    vpp = as_int(args.get("--num-virtual-stages-per-pipeline-rank"))
    per_stage = as_int(args.get("--num-layers-per-virtual-pipeline-stage"))
    if vpp:
        pins["vpp"] = vpp
    elif per_stage and shape.get("num_hidden_layers") and pins.get("pp"):
        pins["vpp"] = shape["num_hidden_layers"] // (pins["pp"] * per_stage)
    elif "pp" in pins:
        pins["vpp"] = 1
    pins["sp"] = _flag(args, "--sequence-parallel")
    if pins["sp"] and pins.get("tp") == 1:
        # arguments.py validate_args (@ d98e8a64ddf3): "Disabling sequence parallelism because
        # tensor model parallelism is disabled"
        pins["sp"] = False
        imported.notes.append("--sequence-parallel at TP 1: Megatron switches it off")
    read_split(args, shape, pins, imported)
    if _flag(args, "--use-megatron-fsdp", "--use-torch-fsdp2"):
        strategy = str(args.get("--data-parallel-sharding-strategy", "optim_grads_params"))
        pins["zero"] = {"no_shard": 0, "optim": 1, "optim_grads": 2}.get(strategy, 3)
    elif _flag(args, "--use-distributed-optimizer"):
        pins["zero"] = 1
    elif "--zero-stage" in args:
        pins["zero"] = as_int(args["--zero-stage"]) or 0
    else:
        pins["zero"] = 0
    granularity = str(args.get("--recompute-granularity", ""))
    if granularity in ("full", "selective"):
        pins["recompute"] = granularity
    elif _flag(args, "--recompute-activations"):
        pins["recompute"] = "selective"
    elif _flag(args, "--checkpoint-activations"):
        pins["recompute"] = "full"
    else:
        pins["recompute"] = "none"
    if _flag(args, "--fp16"):
        job["precision"] = "fp16"
    elif _flag(args, "--bf16"):
        job["precision"] = "bf16"
    if args.get("--fp8-format") not in (None, True) or _flag(args, "--fp8-hybrid", "--fp8-e4m3"):
        job["precision"] = "fp8"
    backend = args.get("--attention-backend")
    if backend in ("flash", "fused", "unfused"):
        job["attention"] = {"flash": "flash", "fused": "cudnn", "unfused": "unfused"}[backend]
    elif _flag(args, "--use-flash-attn", "--use-flash-attn-v2", "--use-flash-attn-triton"):
        job["attention"] = "flash"
    if _flag(args, "--grad-reduce-in-bf16"):
        job["grad_dtype"] = "half"
    elif _flag(args, "--accumulate-allreduce-grads-in-fp32"):
        job["grad_dtype"] = "fp32"
    if _flag(args, "--fp32-allreduce"):
        # Megatron-LM before Megatron-Core (e.g. 8aa4619, megatron/model/distributed.py
        # allreduce_params): the 16-bit .grad is cast to fp32 for the DP all-reduce only
        job["grad_reduce_dtype"] = "fp32"
    if "--num-layers" in args and pins.get("tp"):
        job["grad_overlap"] = _flag(args, "--overlap-grad-reduce")
        job["tp_comm_overlap"] = _flag(args, "--tp-comm-overlap")
        job["p2p_overlap"] = not _flag(args, "--no-overlap-p2p-communication")
    nproc = as_int(args.get("--nproc_per_node")) or as_int(args.get("--nproc-per-node"))
    nnodes = as_int(args.get("--nnodes"))
    if nproc:
        imported.gpus_per_node = nproc
    if nnodes:
        imported.num_nodes = nnodes
    return imported


def looks_like(text: str, path: str) -> bool:
    return ("--num-layers" in text or "--tensor-model-parallel-size" in text) and \
        "deepspeed" not in text.lower()


def read(text: str, path: str) -> Imported:
    imported = Imported(NAME, path, framework="Megatron-LM")
    return read_args(parse_args_text(text), imported)

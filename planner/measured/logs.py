"""Training logs -> measured runs (planner.measured.runs.MeasuredRun), for `planner calibrate --runs
train.log`: the layout and model the log states and the median of its steady steps.

Formats (the launchers' own print statements, read from their sources):
- Megatron-LM (and Megatron-DeepSpeed): the argument block of megatron/training/arguments.py
  _print_args ("------------------------ arguments ------------------------", then one
  "  name ........ value" line per argparse dest, then "-------------------- end of arguments
  ---------------------") and the per-log-interval line of megatron/training/training.py
  training_log (" [date] iteration      N/   TOTAL | consumed samples: ... | elapsed time per
  iteration (ms): T | ..."), NVIDIA/Megatron-LM at d98e8a64ddf3. T is the mean over the
  iterations since the previous line, per optimizer step.
- NeMo 2 / Megatron-Bridge: the same iteration line (src/megatron/bridge/training/utils/
  train_utils.py training_log at 067f987df03b) and the ConfigContainer YAML that
  recipe.print_yaml() prints (scripts/performance/run_recipe.py).
- torchtitan: torchtitan/components/metrics.py's step line ("step: N  loss: ...  memory: ...
  tps: X  tflops: ...", X = tokens per second per GPU), torchtitan/distributed/parallel_dims.py's
  "Building device mesh with parallelism: pp=.., dp_replicate=.., dp_shard=.., cp=.., tp=..,
  ep=.." and torchtitan/trainer.py's "Building llama3 405B", "Trainer is initialized with ...
  tokens per DP rank, ... tokens per train step, gradient accumulation steps G, maximum context
  length S" (b5bcd76c66d0; v0.2.2 and earlier print "local batch size L, global batch size B,
  gradient accumulation steps G, sequence length S"), the "Applied FullAC activation
  checkpointing" line (activation_checkpoint.py), "Float8 training active"
  (components/quantization/float8.py) and, with debug.print_config, "Running with configs:
  {json}". Step time = tokens per step / (tps x GPUs).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from planner.errors import SpecError
from planner.launchers import megatron, nemo, torchtitan
from planner.launchers.common import Imported, as_int

# Steady state: the first logged intervals carry start-up work (CUDA/NCCL initialisation, kernel
# autotuning, torch.compile, the first data loads), so they are dropped.
SKIP_LOGGED = 2  # logged points dropped at the start
MIN_ITERATION = 4  # and any iteration number below this (log interval 1)

_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration "
                            r"\(ms\):\s*([\d.]+)")
_ARGS_START = re.compile(r"-{8,} arguments -{8,}")
_ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
_ARG_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*) \.+ (.*)$")
_TT_STEP = re.compile(r"step:\s*(\d+)\s+loss:.*?tps:\s*([\d,]+)")
_TT_MESH = re.compile(r"Building device mesh with parallelism: (.*)")
_TT_MESH_OLD = re.compile(r"Building \d+-D device mesh with \[(.*?)\], \[(.*?)\]")
_TT_INIT = re.compile(r"(\d+) tokens per DP rank, (\d+) tokens per train step, gradient "
                      r"accumulation steps (\d+), maximum context length (\d+)")
_TT_INIT_OLD = re.compile(r"local batch size (\d+), global batch size (\d+), gradient "
                          r"accumulation steps (\d+), sequence length (\d+)")
# "Building llama3 405B" (b5bcd76c66d0); v0.2.2 prints "Building llama3 405Bwith {json}" (no space)
_TT_MODEL = re.compile(r"Building (\w+) (\S+?)(?:with \{|\s*$)", re.M)
# megatron/training/vocab_utils.py: " > padded vocab (size: V) with D dummy tokens (new size: P)"
_PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
_WORLD = re.compile(r"using world size: (\d+)|from rank 0 to all (\d+) ranks|\bWORLD_SIZE=(\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# argparse dests whose flag is not --dest-with-dashes (megatron/training/arguments.py)
_DEST_FLAGS = {
    "add_bias_linear": ("--disable-bias-linear", False),
    "overlap_p2p_comm": ("--no-overlap-p2p-communication", False),
    "fp8": ("--fp8-format", None),
    "virtual_pipeline_model_parallel_size": ("--num-virtual-stages-per-pipeline-rank", None),
}
# set by Megatron itself for every bf16 run (arguments.py validate_args), not a user's choice
_DERIVED = {"accumulate_allreduce_grads_in_fp32"}


@dataclass
class LogRun:
    """What one training log says: the config read from it and its steady step times (s)."""

    path: str
    imported: Imported
    step_times_s: list[float]
    all_points: int
    notes: list[str] = field(default_factory=list)

    @property
    def median_step_time_s(self) -> float:
        return statistics.median(self.step_times_s)


def _steady(points: list[tuple[int, float]]) -> list[float]:
    kept = [t for i, (it, t) in enumerate(points) if i >= SKIP_LOGGED and it >= MIN_ITERATION]
    return kept


def _megatron_args(text: str) -> dict[str, Any]:
    """The argument block as Megatron flags (the form megatron.read_args takes)."""
    start = _ARGS_START.search(text)
    if not start:
        return {}
    end = _ARGS_END.search(text, start.end())
    block = text[start.end(): end.start() if end else len(text)]
    args: dict[str, Any] = {}
    for line in block.splitlines():
        m = _ARG_LINE.match(_strip_prefix(line))
        if not m:
            continue
        dest, value = m.group(1), m.group(2).strip()
        if dest in _DERIVED:
            continue
        if value.startswith("AttnBackend."):
            value = value.split(".", 1)[1]
        flag, when = _DEST_FLAGS.get(dest, ("--" + dest.replace("_", "-"), None))
        if when is not None:  # a store_false dest: the flag was given when the value is False
            if value == str(when):
                args[flag] = True
            continue
        if value in ("None", "False", "[]"):
            continue
        args[flag] = True if value == "True" else value
    for dest in ("world_size", "data_parallel_size"):
        m = re.search(rf"^\s*{dest} \.+ (\d+)\s*$", block, re.M)
        if m:
            args[f"__{dest}"] = int(m.group(1))
    return args


def _strip_prefix(line: str) -> str:
    """A log line without a launcher's prefix (e.g. '[default0]:' of torchrun --tee, '0: ')."""
    return re.sub(r"^(\[[^\]]*\]:?|\d+:)\s?", "", line)


def _config_yaml(text: str) -> dict[str, Any] | None:
    """The ConfigContainer YAML a Megatron-Bridge run prints (top-level model:/train: ...)."""
    lines = text.splitlines()
    sections = ("model", "train", "ddp", "dataset", "optimizer", "comm_overlap",
                "mixed_precision", "checkpoint", "logger", "scheduler", "tokenizer", "rng")
    start = next((i for i, line in enumerate(lines)
                  if re.match(rf"^({'|'.join(sections)}):\s*$", line)), None)
    if start is None:
        return None
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith((" ", "-")) and not re.match(r"^\w+:", line):
            break
        block.append(line)

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    try:
        data = yaml.load("\n".join(block), Loader=Loader)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def read_megatron_log(text: str, path: str) -> LogRun:
    points = [(int(m.group(1)), float(m.group(2)) / 1000.0) for m in _MEGATRON_ITER.finditer(text)]
    args = _megatron_args(text)
    data = _config_yaml(text) if not args else None
    if args:
        framework = "Megatron-DeepSpeed" if args.get("--deepspeed") is True else "Megatron-LM"
        imported = megatron.read_args(args, Imported("megatron", path, framework=framework))
        if args.get("--deepspeed") is True:
            from planner.launchers.deepspeed import apply_recipe

            imported.pins["zero"] = as_int(args.get("--zero-stage")) or 0
            apply_recipe(imported, args)
        world = args.get("__world_size")
        if world:
            imported.num_gpus = world
        if args.get("__data_parallel_size"):
            imported.pins["dp"] = args["__data_parallel_size"]
        padded = _PADDED_VOCAB.search(text)
        if padded and "vocab_size" not in imported.shape:
            imported.shape["vocab_size"] = int(padded.group(1))
    elif data:
        imported = nemo.from_data(data, text, path)
        # a Megatron-Bridge log names no world size: Megatron's own line, the config broadcast
        # (training/utils/checkpoint_utils.py) or the launcher's environment echo
        world = _WORLD.search(text)
        if world:
            imported.num_gpus = int(next(g for g in world.groups() if g))
    else:
        raise SpecError(f"{path}: a Megatron/NeMo log without its argument block or printed "
                        "config: the layout cannot be read")
    return LogRun(path, imported, _steady(points), len(points))


def read_torchtitan_log(text: str, path: str) -> LogRun:
    text = _ANSI.sub("", text)
    imported = Imported("torchtitan", path, framework="torchtitan")
    notes: list[str] = []
    echo = re.search(r"Running with configs: (\{.*?\n\})", text, re.S)
    facts: dict[str, Any] = {}
    model = _TT_MODEL.search(text)
    if model:
        facts["family"], facts["flavor"] = model.group(1), model.group(2)
    ac = re.search(r"Applied (\w+?)(?:AC)? activation checkpointing", text)
    facts["ac"] = "None"
    if ac:
        name = ac.group(1).lower()
        facts["ac"] = "FullAC" if "full" in name else "SelectiveAC"
    if re.search(r"Float8 .*training active|Swapped to Float8Linear", text):
        facts["fp8"] = True
    sections: dict[str, dict[str, Any]] = {"training": {}, "parallelism": {}, "compile": {}}
    if echo:
        try:
            config = json.loads(echo.group(1))
            for key in sections:
                if isinstance(config.get(key), dict):
                    sections[key].update(config[key])
        except json.JSONDecodeError:
            pass
    mesh = _TT_MESH.search(text)
    degrees: dict[str, int] = {}
    if mesh:
        degrees = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", mesh.group(1))}
    else:
        old = _TT_MESH_OLD.search(text)
        if old:
            names = [n.strip(" '\"") for n in old.group(1).split(",")]
            sizes = [int(v) for v in old.group(2).split(",")]
            degrees = dict(zip(names, sizes, strict=False))
    par = sections["parallelism"]
    for key, name in (("pp", "pipeline_parallel_degree"), ("tp", "tensor_parallel_degree"),
                      ("cp", "context_parallel_degree"), ("ep", "expert_parallel_degree"),
                      ("dp_shard", "data_parallel_shard_degree"),
                      ("dp_replicate", "data_parallel_replicate_degree")):
        if key in degrees:
            par[name] = degrees[key]
    par.setdefault("data_parallel_shard_degree", degrees.get("dp_shard", 1))
    training = sections["training"]
    init = _TT_INIT.search(text)
    old_init = _TT_INIT_OLD.search(text)
    tokens_per_step = None
    pipelined = degrees.get("pp", 1) > 1
    if init:
        # trainer.py: tokens per DP rank = tokens per micro-batch x pipeline micro-batches
        per_rank, tokens_per_step, accum, seq = (int(g) for g in init.groups())
        training.update(max_context_length=seq, num_tokens_per_train_step=tokens_per_step)
        training.setdefault("num_tokens_per_microbatch_per_dp_rank",
                            seq if pipelined else per_rank)
    elif old_init:
        # torchtitan <= v0.2.2: local_batch_size sequences per DP rank per accumulation step
        local, global_batch, accum, seq = (int(g) for g in old_init.groups())
        training.update(max_context_length=seq, num_tokens_per_train_step=global_batch * seq)
        training.setdefault("num_tokens_per_microbatch_per_dp_rank",
                            seq if pipelined else local * seq)
        tokens_per_step = global_batch * seq
    if pipelined and not echo:
        notes.append("pipelined run without the config echo (debug.print_config): micro-batch "
                     "size taken as 1, virtual stages as 1")
    imported = torchtitan.from_sections(sections, facts, imported)
    imported.notes += notes
    world = math.prod(degrees.get(k, 1) for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    if degrees:
        imported.num_gpus = world
    points = [(int(m.group(1)), float(m.group(2).replace(",", "")))
              for m in _TT_STEP.finditer(text)]
    if not tokens_per_step:
        raise SpecError(f"{path}: a torchtitan log without its 'Trainer is initialized with' "
                        "line: tokens per step unknown")
    if not degrees:
        raise SpecError(f"{path}: a torchtitan log without its device-mesh line: GPU count "
                        "unknown")
    # tps is tokens per second per GPU (metrics.py: tokens / (time x non-data-parallel size),
    # tokens counted per data-parallel rank): step time = tokens per step / (tps x GPUs)
    times = [(step, tokens_per_step / (tps * world)) for step, tps in points if tps > 0]
    return LogRun(path, imported, _steady(times), len(times))


def read_log(path: str | Path) -> LogRun:
    """A Megatron-LM / NeMo / Megatron-Bridge or torchtitan training log, detected by content."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise SpecError(f"cannot read log {path}: {exc.strerror}") from None
    if "elapsed time per iteration (ms)" in text:
        run = read_megatron_log(text, str(path))
    elif _TT_STEP.search(_ANSI.sub("", text)):
        run = read_torchtitan_log(text, str(path))
    else:
        raise SpecError(f"{path}: not a training log this planner reads (Megatron-LM/NeMo "
                        "'elapsed time per iteration (ms)' lines or torchtitan 'step: ... tps:' "
                        "lines)")
    if not run.step_times_s:
        raise SpecError(f"{path}: {run.all_points} logged step(s), none left after skipping the "
                        f"first {SKIP_LOGGED} (start-up); log more iterations")
    return run

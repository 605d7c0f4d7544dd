"""Options shared by solve, estimate and validate, declared once (typer Annotated aliases),
and the helpers that turn them into library objects. A given value pins a knob; None leaves it
to solve."""

from __future__ import annotations

import math
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import limits


class RecomputeChoice(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"
    offload = "offload"


class AttentionChoice(str, Enum):
    flash = "flash"
    cudnn = "cudnn"
    triton = "triton"
    unfused = "unfused"


class GradDtypeChoice(str, Enum):
    auto = "auto"
    half = "half"
    fp32 = "fp32"
    half_fp32 = "half+fp32"


class MoeDispatcherChoice(str, Enum):
    alltoall = "alltoall"
    allgather = "allgather"
    deepep = "deepep"


class MoeRoutingChoice(str, Enum):
    aux_loss = "aux_loss"
    loss_free = "loss_free"
    force_balanced = "force_balanced"


class PrecisionChoice(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


# ---- checks every option of its kind shares (typer callbacks: a bad value is one line) -----

def output_file(ctx: typer.Context, param: typer.CallbackParam, value: Path | None):
    """An output file option: refuse an empty path, a directory, a path under a plain file or
    in an unwritable folder before any work is done (planner.io.check_output_file)."""
    from planner.io import check_output_file

    if value is None or ctx.resilient_parsing:
        return value
    return check_output_file(value, param.opts[0] if param.opts else "output file")


def record_file(ctx: typer.Context, param: typer.CallbackParam, value: Path | None):
    """A run-records option (JSON lines appended, then read back): an output file that is a
    regular file or none yet; not "-", a device or a FIFO (planner.io.check_records_file)."""
    from planner.io import check_records_file

    if value is None or ctx.resilient_parsing:
        return value
    return check_records_file(value, param.opts[0] if param.opts else "runs file")


def output_folder(ctx: typer.Context, param: typer.CallbackParam, value: str | None):
    """An output folder option (figures; declared str, so an empty value is seen and refused
    rather than read as "."): refuse an existing file, a path under one, an unwritable place or
    a name too long before any work (planner.io.check_output_folder). Returns a Path."""
    from planner.io import check_output_folder

    if value is None or ctx.resilient_parsing:
        return value
    return check_output_folder(value, param.opts[0] if param.opts else "output folder")


def finite_seconds(ctx: typer.Context, param: typer.CallbackParam, value: float | None):
    """A duration option: finite (inf/NaN pass click's FloatRange) and at most a week."""
    if value is None:
        return value
    if not math.isfinite(value) or value > limits.MAX_TIMEOUT_S:
        raise typer.BadParameter(f"{value:g} s is not a finite number of seconds up to "
                                 f"{limits.MAX_TIMEOUT_S:g} (a week)")
    return value


def finite(ctx: typer.Context, param: typer.CallbackParam, value: float | None):
    """A real option: finite (NaN passes click's FloatRange, which only compares)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ENDPOINT_RE = re.compile(
    rf"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>{_HOST_LABEL}(?:\.{_HOST_LABEL})*))"
    r"(?::(?P<port>\d{1,5}))?$"
)


def rdzv_endpoint(ctx: typer.Context, param: typer.CallbackParam, value: str | None):
    """torchrun's --rdzv-endpoint: HOST[:PORT] with a host name, an IPv4 address or [IPv6], and
    a port in 1..65535 (torch.distributed.elastic parses the same shape; 29400 if none)."""
    if value is None:
        return value
    m = _ENDPOINT_RE.match(value.strip())
    port = int(m.group("port")) if m and m.group("port") else None
    if m is None or (m.group("v6") is not None and m.group("v6").count(":") < 2):
        raise typer.BadParameter(f"'{value}' is not HOST:PORT (node0:29500, 10.0.0.1:29500, "
                                 "[fd00::1]:29500)")
    if port is not None and not 1 <= port <= 65535:
        raise typer.BadParameter(f"port {port} of '{value}' is not in 1..65535")
    return value.strip()


BACKENDS = ("gloo", "nccl", "mpi", "xccl")  # torch.distributed.Backend's built-in names


def backend_name(ctx: typer.Context, param: typer.CallbackParam, value: str | None):
    """A torch.distributed backend name (None: nccl on GPUs, else gloo)."""
    if value is None:
        return value
    if value.strip().lower() not in BACKENDS:
        raise typer.BadParameter(f"'{value}' is not a torch.distributed backend "
                                 f"({', '.join(BACKENDS)})")
    return value.strip().lower()


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Built-in name/alias, spec YAML, or HF config.json.")
]
ClusterOpt = Annotated[
    str, typer.Option("--cluster", "-c", help="NxGPU, NODESxPERNODExGPU, or a cluster YAML.")
]


def _count(flag: str, upper: int, help_text: str) -> Any:
    """An optional whole-number option in 1..upper (the physical bound of planner.limits)."""
    return Annotated[int | None, typer.Option(flag, min=1, max=upper, help=help_text)]


SeqLenOpt = _count("--seq-len", limits.MAX_SEQ_LEN, "Tokens per sequence (default: the model's).")
GlobalBatchOpt = _count("--global-batch", limits.MAX_GLOBAL_BATCH,
                        "Sequences per optimizer step (default: the model's).")
TpOpt = _count("--tp", limits.MAX_GPUS, "Tensor-parallel degree.")
PpOpt = _count("--pp", limits.MAX_LAYERS, "Pipeline-parallel degree.")
DpOpt = _count("--dp", limits.MAX_GPUS, "Data-parallel degree.")
CpOpt = _count("--cp", limits.MAX_GPUS, "Context-parallel degree.")
EpOpt = _count("--ep", limits.MAX_EXPERTS, "Expert-parallel degree (MoE).")
EtpOpt = _count("--etp", limits.MAX_GPUS, "Expert tensor-parallel degree (MoE; default: the TP "
                "size). Expert groups fold over the tp*cp*dp ranks: etp*ep divides them.")
VppOpt = _count("--vpp", limits.MAX_LAYERS,
                "Virtual stages per GPU (interleaved 1F1B); 1 = 1F1B.")
MbsOpt = _count("--mbs", limits.MAX_GLOBAL_BATCH, "Micro-batch size, sequences.")
ZeroOpt = Annotated[
    int | None, typer.Option("--zero", min=0, max=3, help="ZeRO stage / FSDP sharding (0-3).")
]
RecomputeOpt = Annotated[
    RecomputeChoice | None,
    typer.Option("--recompute", help="Activation recomputation, or offload of the activations "
                 "to host memory (GPU profiles with a host link: GB200, GB300)."),
]
SpOpt = Annotated[
    bool | None, typer.Option("--sp/--no-sp", help="Sequence parallelism alongside TP.")
]
PrecisionOpt = Annotated[PrecisionChoice, typer.Option("--precision", help="Matmul precision.")]
ProfileOpt = Annotated[
    Path | None,
    typer.Option("--profile", help="GPU profile YAML (from `planner profile` or `calibrate`)."),
]
AttentionOpt = Annotated[
    AttentionChoice | None,
    typer.Option(
        "--attention",
        help="Attention kernel: flash (FlashAttention-2 class), cudnn (Transformer Engine's cuDNN "
        "fused attention, FlashAttention-3 class on Hopper+), triton (FlashAttention in Triton, "
        "llm-foundry's attn_impl triton) or unfused (2021-22 stacks). "
        "Default: the --stack's (flash for Megatron-Core).",
    ),
]
GradDtypeOpt = Annotated[
    GradDtypeChoice | None,
    typer.Option(
        "--grad-dtype",
        help="Gradient recipe: auto (Megatron fp32 main grads at ZeRO 0/1), half (DeepSpeed "
        "ZeRO-1/2), fp32, half+fp32 (DeepSpeed BF16_Optimizer). Default: the --stack's.",
    ),
]
TpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap",
        help="TP/SP collectives overlap their GEMMs (Megatron-Core tp_comm_overlap with "
        "Transformer Engine userbuffers, as NeMo / Megatron-Bridge run; needs sp). Default: "
        "the --stack's (off for Megatron-Core).",
    ),
]
P2pOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--p2p-overlap/--no-p2p-overlap",
        help="Interleaved 1F1B overlaps pipeline sends with compute (Megatron-Core "
        "overlap_p2p_comm). Default: the --stack's (on for Megatron-Core).",
    ),
]
MoeDispatcherOpt = Annotated[
    MoeDispatcherChoice | None,
    typer.Option("--moe-dispatcher", help="MoE token dispatcher: alltoall (NCCL all-to-all), "
                 "allgather, or deepep (Megatron-Core's flex dispatcher with DeepEP). "
                 "Default: alltoall."),
]
MoeCapacityOpt = Annotated[
    float | None,
    typer.Option("--moe-capacity-factor", min=0.01, max=1024, callback=finite,
                 help="MoE expert capacity factor: tokens beyond it x the mean per expert are "
                 "dropped (caps the router's load imbalance). Default: dropless."),
]
MoeRoutingOpt = Annotated[
    MoeRoutingChoice | None,
    typer.Option("--moe-routing", help="How the MoE router balances the experts (the most "
                 "loaded EP rank's share): aux_loss (a load-balancing loss, MaxVio 0.52), "
                 "loss_free (expert bias, DeepSeek-V3's; MaxVio 0.04) or force_balanced "
                 "(random logits, as vendor benchmarks run). Default: aux_loss."),
]
MoeEpOverlapOpt = Annotated[
    bool | None,
    typer.Option("--moe-ep-overlap/--no-moe-ep-overlap",
                 help="Overlap the MoE dispatch and combine with another micro-batch's compute "
                 "(Megatron-Core overlap_moe_expert_parallel_comm). Default: off."),
]
StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        help="Software stack: a preset name (planner stacks) or a framework description such as "
        "'NeMo 24.07 (Megatron-Core)' or 'DeepSpeed ZeRO-3'. Sets the job recipe, the layout "
        "knobs the software fixes and its efficiency factors. Default: megatron-core.",
    ),
]
StageLayersOpt = Annotated[
    str | None,
    typer.Option("--stage-layers", metavar="L1,L2,...",
                 help="Layers per pipeline stage, first to last (pins pp; e.g. 7,8,...,8,7); "
                 "with --vpp, per virtual stage, or Megatron's layout string 'Et|(tt|)*30mL'."),
]
EvenStagesOpt = Annotated[
    bool,
    typer.Option("--even-stages", help="Keep the even rule's layers per stage (floor/ceil, the "
                 "extra layers to the inner stages): no uneven split is searched."),
]
CsvOpt = Annotated[Path | None, typer.Option("--csv", callback=output_file,
                                             help="Write the plan(s) as CSV here.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
RdzvEndpointOpt = Annotated[str | None, typer.Option(
    "--rdzv-endpoint", callback=rdzv_endpoint,
    help="HOST:PORT of the rendezvous (needed with --nnodes > 1).")]
BackendOpt = Annotated[str | None, typer.Option(
    "--backend", callback=backend_name,
    help="torch.distributed backend: gloo, nccl, mpi, xccl (default: nccl on GPUs, else gloo).")]
NnodesOpt = Annotated[int, typer.Option("--nnodes", min=1, max=limits.MAX_NNODES,
                                        help="Nodes of the run.")]


def timeout_option(help_text: str) -> Any:
    """A --timeout of seconds: at least 1, finite, at most a week."""
    return Annotated[float, typer.Option("--timeout", min=1, callback=finite_seconds,
                                         help=help_text)]


def output_option(flag: str, help_text: str, *short: str) -> Any:
    """A file option a command writes (checked by output_file before any work; "-" = stdout)."""
    return Annotated[Path, typer.Option(flag, *short, callback=output_file, help=help_text)]


def records_option(flag: str, help_text: str, *short: str) -> Any:
    """A JSON-lines file of run records a command appends to (checked by record_file)."""
    return Annotated[Path, typer.Option(flag, *short, callback=record_file, help=help_text)]


def layout_pins(**values: Any) -> dict[str, Any]:
    """The layout knobs the user gave (None = not given), enum values unwrapped."""
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = value.value if isinstance(value, Enum) else value
    return out


def is_layout_string(text: str | None) -> bool:
    """Whether --stage-layers is a Megatron pipeline layout string ('Et|(tt|)*30mL')."""
    return text is not None and any(c in text for c in "EL|t")


def layout_string_pins(text: str | None, pins: dict[str, Any]) -> dict[str, Any]:
    """pp and vpp a --stage-layers layout string states with the pins typed: its virtual
    stages are pp x vpp (--pp, else --vpp, else one a stage, as Megatron's
    --pipeline-model-parallel-size reads it); {} for counts."""
    if not is_layout_string(text):
        return {}
    from planner.errors import SpecError

    n = len(parse_stage_layers(text))
    pp = pins.get("pp") or n // (pins.get("vpp") or 1)
    if not pp or n % pp or ("vpp" in pins and pins["vpp"] * pp != n):
        raise SpecError(f"--stage-layers '{text}' has {n} virtual stages, not pp x vpp = "
                        f"{pins.get('pp', '?')} x {pins.get('vpp', '?')}")
    return {"pp": pp, "vpp": n // pp}


def parse_stage_layers(text: str | None) -> tuple[int, ...]:
    """--stage-layers '7,8,8,7' -> (7, 8, 8, 7); a run may be written COUNTxREPEAT as the
    tables print it ('7,8x14,7' = 7, fourteen 8s, 7); with vpp > 1 one count per virtual stage
    (a chunk may hold 0), or Megatron's pipeline layout string ('Et|(tt|)*30mL': the decoder
    layers t of each virtual stage, planner.layout.parse_pipeline_layout). SpecError (exit 2)
    when malformed."""
    if text is None:
        return ()
    import re

    from planner.errors import LayoutError, SpecError

    if is_layout_string(text):
        from planner.layout import parse_pipeline_layout

        try:
            return tuple(t for _, t, _, _ in parse_pipeline_layout(text))
        except LayoutError as e:
            raise SpecError(f"--stage-layers: {e}") from None
    counts: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*[xX*]\s*(\d+))?", part)
        if m is None or (m.group(2) is not None and int(m.group(2)) < 1):
            raise SpecError(f"--stage-layers '{text}': expected positive integers joined by "
                            "commas (e.g. 7,8,8,7 or 7,8x14,7)")
        counts += [int(m.group(1))] * (int(m.group(2)) if m.group(2) else 1)
    if len(counts) == 1 or sum(counts) < 1:  # one stage, or no layer: never a pipeline split
        raise SpecError(f"--stage-layers '{text}': every stage needs at least one layer")
    return tuple(counts)


def load_inputs(model: str, cluster: str, profile: Path | None, seq_len: int | None,
                global_batch: int | None, *, precision: PrecisionChoice = PrecisionChoice.bf16,
                attention: AttentionChoice | None = None,
                grad_dtype: GradDtypeChoice | None = None,
                tp_comm_overlap: bool | None = None, p2p_overlap: bool | None = None,
                moe_dispatcher: MoeDispatcherChoice | None = None,
                moe_capacity_factor: float | None = None,
                moe_routing: MoeRoutingChoice | None = None, moe_ep_overlap: bool | None = None,
                stack: Any = None, pools: bool = False):
    """Resolve --model/--cluster/--profile/--seq-len/--global-batch/--precision and the job
    recipe to specs. `stack` (a StackPreset, a name or free text; None = megatron-core) sets the
    recipe and its efficiency factors on the GPU profile; --attention, --grad-dtype,
    --tp-comm-overlap and --p2p-overlap, where given, override its recipe. pools: the
    command takes a cluster of pools (64xH100+128xA100; solve, estimate)."""
    from planner.registry import load_gpu, load_model, parse_cluster, parse_cluster_or_pools
    from planner.specs import JobSpec
    from planner.stacks import StackPreset, resolve_stack

    preset = stack if isinstance(stack, StackPreset) else resolve_stack(stack)
    model_spec = load_model(model)
    gpu = load_gpu(str(profile)) if profile is not None else None
    cluster_spec = (parse_cluster_or_pools if pools else parse_cluster)(cluster, profile=gpu)
    job = preset.job(JobSpec(
        seq_len=seq_len or model_spec.seq_len,
        global_batch=global_batch or model_spec.global_batch,
        precision=precision.value,
    ), stack if isinstance(stack, str) else "")
    # the stack's factors for the job's precision on every GPU
    cluster_spec = preset.cluster_for(cluster_spec, job.precision)
    given = layout_pins(attention=attention, grad_dtype=grad_dtype,
                        tp_comm_overlap=tp_comm_overlap, p2p_overlap=p2p_overlap,
                        moe_dispatcher=moe_dispatcher, moe_capacity_factor=moe_capacity_factor,
                        moe_routing=moe_routing, moe_ep_overlap=moe_ep_overlap)
    if given:
        job = job.model_copy(update=given)
    return model_spec, cluster_spec, job


# ---- the training run (planner.economics): time, cost, energy, checkpoints, LR ----------
TrainTokensOpt = Annotated[
    float | None,
    typer.Option("--train-tokens", min=1, max=limits.MAX_TRAIN_TOKENS, callback=finite,
                 help="Tokens to train on (e.g. 15e12): adds "
                 "train_days, gpu_hours, cost_usd, energy_mwh, checkpoint_gb, "
                 "checkpoint_interval_min to every plan."),
]
GpuHourPriceOpt = Annotated[
    float | None,
    typer.Option("--gpu-hour-price", min=0, max=limits.MAX_GPU_HOUR_PRICE, callback=finite,
                 help="USD per GPU-hour (default 2, seed 001 ch. 9)."),
]
PueOpt = Annotated[
    float | None,
    typer.Option("--pue", min=1, max=limits.MAX_PUE, callback=finite,
                 help="Power usage effectiveness (default 1.4, seed 001 Ex 9.9)."),
]
MtbfOpt = Annotated[
    float | None,
    typer.Option("--mtbf-hours", min=0.001, max=limits.MAX_MTBF_HOURS, callback=finite,
                 help="Mean time between failures of one node, hours "
                 "(default 6335: Llama 3's 419 interruptions in 54 days on 2048 nodes)."),
]
StorageOpt = Annotated[
    float | None,
    typer.Option("--storage-gb-per-s", min=0.001, max=limits.MAX_STORAGE_GB_PER_S,
                 callback=finite, help="Aggregate checkpoint write bandwidth, "
                 "GB/s (default 10, seed 001 ch. 7)."),
]
RefLrOpt = Annotated[
    float | None,
    typer.Option("--ref-lr", min=0, max=limits.MAX_LEARNING_RATE, callback=finite,
                 help="A peak learning rate tuned at --ref-batch: prints the "
                 "linear / square-root scaled LR and warmup for the plan's global batch."),
]
RefBatchOpt = Annotated[
    float | None,
    typer.Option("--ref-batch", min=1, max=limits.MAX_GLOBAL_BATCH, callback=finite,
                 help="The global batch (sequences) --ref-lr was tuned at."),
]


def economics_inputs(train_tokens: float | None, price: float | None, pue: float | None,
                     mtbf: float | None, storage: float | None):
    """RunInputs from the options, None without --train-tokens (the others need it)."""
    from planner.economics import RunInputs
    from planner.errors import SpecError

    if train_tokens is None:
        if any(v is not None for v in (price, pue, mtbf, storage)):
            raise SpecError("--gpu-hour-price, --pue, --mtbf-hours and --storage-gb-per-s "
                            "need --train-tokens")
        return None
    given = {"gpu_hour_usd": price, "pue": pue, "node_mtbf_hours": mtbf,
             "storage_gb_per_s": storage}
    return RunInputs(train_tokens=train_tokens, **{k: v for k, v in given.items() if v is not None})


def with_economics(plans, model, cluster, inputs):
    """The plans with their training run's economics (planner.economics.RunCosts: days, GPU-hours,
    cost, energy, checkpoints) attached; unchanged when inputs is None."""
    if inputs is None:
        return plans
    from dataclasses import replace

    from planner.economics import training_run

    return [replace(p, run=training_run(p, model, cluster, inputs)) for p in plans]


def check_lr_options(ref_lr: float | None, ref_batch: float | None) -> None:
    """--ref-lr and --ref-batch go together."""
    from planner.errors import SpecError

    if (ref_lr is None) != (ref_batch is None):
        raise SpecError("--ref-lr and --ref-batch go together (the LR tuned at that batch)")


def stack_pins(stack: Any, pins: dict[str, Any]) -> dict[str, Any]:
    """The user's pins plus the layout knobs the stack fixes (the user's win)."""
    from planner.stacks import StackPreset, resolve_stack

    preset = stack if isinstance(stack, StackPreset) else resolve_stack(stack)
    return {**preset.layout_defaults, **pins}

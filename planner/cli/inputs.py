"""One input resolver for the planning commands (solve, estimate, explain, report, export): the
options a command was given, by name, to one frozen Inputs.

    inputs = resolve_inputs(ctx, pools=True)   # inside a command; ctx.params holds its options
    inputs.model, inputs.cluster, inputs.job, inputs.pins, inputs.stack, inputs.economics

The options themselves are declared once, in cli/options.py (and cli/launcher_options.py for
--config, --model/--cluster with a config); a command lists the ones it takes in its signature
(typer reads them there) and hands its context here. A command that lacks an option gets its
default (None: not given). Nothing here is positional: a new recipe option is one entry in
RECIPE_OPTIONS and its declaration.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from planner.cli import options as o
from planner.cli.launcher_options import RECIPE_OPTIONS, inputs
from planner.cli.options import (
    check_lr_options,
    economics_inputs,
    layout_pins,
    layout_string_pins,
    parse_stage_layers,
    stack_pins,
)

ECONOMICS_OPTIONS = ("train_tokens", "gpu_hour_price", "pue", "mtbf_hours", "storage_gb_per_s")

# The options the planning commands share, declared once: name -> (annotated type, default).
# A command takes a group with @takes(...) and finds them in ctx.params (resolve_inputs).
LAYOUT_KNOB_OPTIONS: dict[str, tuple[Any, Any]] = {
    "tp": (o.TpOpt, None), "pp": (o.PpOpt, None), "dp": (o.DpOpt, None), "cp": (o.CpOpt, None),
    "ep": (o.EpOpt, None), "etp": (o.EtpOpt, None), "vpp": (o.VppOpt, None),
    "mbs": (o.MbsOpt, None),
    "zero": (o.ZeroOpt, None), "recompute": (o.RecomputeOpt, None), "sp": (o.SpOpt, None)}
JOB_OPTIONS: dict[str, tuple[Any, Any]] = {
    "precision": (o.PrecisionOpt, o.PrecisionChoice.bf16), "attention": (o.AttentionOpt, None),
    "grad_dtype": (o.GradDtypeOpt, None), "tp_comm_overlap": (o.TpOverlapOpt, None),
    "p2p_overlap": (o.P2pOverlapOpt, None), "moe_dispatcher": (o.MoeDispatcherOpt, None),
    "moe_capacity_factor": (o.MoeCapacityOpt, None), "moe_routing": (o.MoeRoutingOpt, None),
    "moe_ep_overlap": (o.MoeEpOverlapOpt, None), "stack": (o.StackOpt, None),
    "seq_len": (o.SeqLenOpt, None), "global_batch": (o.GlobalBatchOpt, None),
    "profile": (o.ProfileOpt, None)}
RUN_ECONOMICS_OPTIONS: dict[str, tuple[Any, Any]] = {
    "train_tokens": (o.TrainTokensOpt, None), "gpu_hour_price": (o.GpuHourPriceOpt, None),
    "pue": (o.PueOpt, None), "mtbf_hours": (o.MtbfOpt, None),
    "storage_gb_per_s": (o.StorageOpt, None), "ref_lr": (o.RefLrOpt, None),
    "ref_batch": (o.RefBatchOpt, None)}


def takes(*groups: dict[str, tuple[Any, Any]]) -> Callable[[Callable], Callable]:
    """Add the options of `groups` to a command (typer reads its signature): the command keeps
    its own parameters and receives these as **options; resolve_inputs reads them by name."""
    def wrap(command: Callable) -> Callable:
        sig = inspect.signature(command, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                   annotation=annotation)
                 for group in groups for name, (annotation, default) in group.items()]
        command.__signature__ = sig.replace(parameters=own + added)
        return command
    return wrap


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What a planning command works on, resolved from its options (and --config, --stack)."""

    model: Any  # ModelSpec
    cluster: Any  # ClusterSpec, or PooledCluster where the command takes pools
    job: Any  # JobSpec: sequence, batch, precision and the software recipe
    pins: dict[str, Any]  # layout knobs pinned: the config's layout, typed flags over it
    typed_pins: dict[str, Any]  # what the user typed and the stack fixes (without the config)
    stack: Any  # StackPreset (--stack; megatron-core when not given)
    stack_given: bool = False  # --stack was given (titles name the stack then)
    economics: Any = None  # economics.RunInputs with --train-tokens, else None
    stage_layers: tuple[int, ...] = ()  # --stage-layers, parsed
    config: Any = None  # the launcher config --config resolved (launchers.Resolved), or None
    ref_lr: float | None = None  # --ref-lr / --ref-batch: the LR advice's reference
    ref_batch: float | None = None


def resolve_inputs(ctx: typer.Context, *, pools: bool = False,
                   pin_stack: bool = True) -> Inputs:
    """The command's Inputs. pools: it takes a cluster of pools (64xH100+128xA100). pin_stack:
    the layout knobs the stack fixes are pins (solve, export, explain, report); estimate keeps
    them as defaults of the knobs not given (False)."""
    from planner.stacks import resolve_stack

    opt = ctx.params
    preset = resolve_stack(opt.get("stack"))
    flags = layout_pins(**{k: opt.get(k) for k in LAYOUT_KNOB_OPTIONS})
    flags |= layout_string_pins(opt.get("stage_layers"), flags)  # 'Et|(tt|)*30mL': pp, vpp
    pins = stack_pins(preset, flags) if pin_stack else flags
    recipe = {k: opt.get(k) for k in RECIPE_OPTIONS}
    model, cluster, job, current, resolved = inputs(
        ctx, opt.get("config"), opt.get("model"), opt.get("cluster"), opt.get("profile"),
        opt.get("seq_len"), opt.get("global_batch"), recipe, pins, opt.get("stack"),
        pools=pools)
    economics = economics_inputs(*(opt.get(k) for k in ECONOMICS_OPTIONS))
    check_lr_options(opt.get("ref_lr"), opt.get("ref_batch"))
    return Inputs(model=model, cluster=cluster, job=job, pins=current, typed_pins=pins,
                  stack=preset, stack_given=opt.get("stack") is not None,
                  economics=economics, stage_layers=parse_stage_layers(opt.get("stage_layers")),
                  config=resolved, ref_lr=opt.get("ref_lr"), ref_batch=opt.get("ref_batch"))

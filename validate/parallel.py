"""Lay a Transformer out with torch.distributed's own parallel APIs (after torchtitan's
parallelize_llama): DeviceMesh in the planner's rank order, tensor/sequence parallelism with
parallelize_module, activation checkpointing, FSDP2 / replicate for data parallelism, and
torch.distributed.pipelining stages and schedules.

ZeRO mapping (data-parallel axis `dp`; FSDP2 keeps parameters sharded at rest in every stage):

    zero 0  replicate() (FSDP2's DDP): parameters, gradients and optimizer state replicated;
            gradients all-reduced once per step (no sync on earlier micro-batches).
    zero 1  fully_shard(reshard_after_forward=False); gradient sync and resharding only on the
            last micro-batch: full gradients accumulate locally and are reduce-scattered once,
            optimizer state and master weights sharded.
    zero 2  fully_shard(reshard_after_forward=False); gradients reduce-scattered on every
            micro-batch and kept sharded; parameters stay gathered between micro-batches.
    zero 3  fully_shard(reshard_after_forward=True): parameters gathered for forward and again
            for backward, everything sharded.

With pp > 1 the pipeline schedule drives gradient sync itself (PipelineStage syncs FSDP modules
on the last backward), so zero 1 and 2 both reduce once per step there.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from planner.layout import MESH_DIM_NAMES, Layout

from .model import Transformer, cross_entropy


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The world mesh, dims ("pp", "dp", "cp", "tp") outermost first (planner.layout's order)."""
    shape = tuple(getattr(layout, name) for name in MESH_DIM_NAMES)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIM_NAMES)


def stage_layer_ranges(num_layers: int, num_stages: int,
                       counts: Sequence[int] = ()) -> list[range]:
    """Layers of each pipeline stage (model chunk with vpp > 1), contiguous: the layout's
    explicit layers per stage (`counts`, vpp 1), else the cost model's even rule
    (costmodel.pipeline.stage_layer_counts), so the run holds the layers the estimate assumed."""
    from planner.costmodel.pipeline import stage_layer_counts

    sizes = list(counts) if counts else stage_layer_counts(num_layers, num_stages)
    if len(sizes) != num_stages or sum(sizes) != num_layers:
        raise ValueError(f"{sizes} layers per stage do not split {num_layers} layers "
                         f"into {num_stages} stages")
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def local_stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """Stages this pipeline rank runs: pp_rank, pp_rank + pp, ... (looped, vpp of them)."""
    return [pp_rank + k * layout.pp for k in range(layout.vpp)]


def stage_module(full: Transformer, layers: range, first: bool, last: bool) -> Transformer:
    """A copy of `full` holding only `layers` (and the embedding / head at the ends)."""
    module = copy.deepcopy(full)
    for name in list(module.layers.keys()):
        if int(name) not in layers:
            del module.layers[name]
    if not first:
        module.embed = None
    if not last:
        module.norm = None
        module.output = None
    return module


def apply_tp(module: Transformer, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Megatron tensor parallelism (and sequence parallelism when `sp`) with parallelize_module:
    q/k/v and the MLP's up projections column-wise, the output projections row-wise, the
    embedding vocab-sharded, the LM head column-wise with its logits gathered."""
    seq = Shard(1) if sp else Replicate()
    top: dict = {}
    if module.embed is not None:
        top["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sp:
            top["embed"] = PrepareModuleOutput(output_layouts=Replicate(),
                                               desired_output_layouts=Shard(1))
    if module.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if module.output is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(module, tp_mesh, top)
    for block in module.layers.values():
        plan: dict = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
            plan["attention"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),))
            plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                      desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)
    if module.args.tied and module.embed is not None and module.output is not None:
        module.output.weight = module.embed.tok.weight  # both Shard(0) over the vocabulary


def apply_recompute(module: Transformer, mode: str) -> None:
    """Megatron's recomputation with torch's checkpointing: `full` checkpoints whole blocks,
    `selective` only the core attention (QK^T, softmax, PV), Korthikanti et al. 2022."""
    if mode in ("none", "offload"):  # offload: the worker's save_on_cpu context, no checkpoints
        return
    for name, block in list(module.layers.items()):
        if mode == "full":
            module.layers[name] = checkpoint_wrapper(block)
        else:
            block.attention.recompute_core = True


def apply_dp(module: Transformer, dp_mesh: DeviceMesh, zero: int) -> None:
    """FSDP2 (zero 1-3) or FSDP2's replicate (zero 0) per block and on the stage root; routed
    experts left out (ignored_params: each EP rank holds its own, sync_expert_grads reduces
    them)."""
    blocks = list(module.layers.values())
    ignored = set(expert_params([module])) or None
    if zero == 0:
        for block in blocks:
            replicate(block, mesh=dp_mesh, ignored_params=ignored)
        replicate(module, mesh=dp_mesh, ignored_params=ignored)
        return
    reshard = zero == 3
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=ignored)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=ignored)


def expert_params(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The routed experts' weights of the modules (validate.moe.MoEFeedForward)."""
    from .moe import MoEFeedForward

    return [p for m in modules for sub in m.modules() if isinstance(sub, MoEFeedForward)
            for p in sub.expert_params()]


def build_expert_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The expert layout of the DP ranks (planner.layout's folding with tp = cp = 1: expert-TP 1,
    EP innermost, then the expert-data-parallel replicas): dims ("pp", "edp", "ep")."""
    shape = (layout.pp, layout.dp // layout.ep, layout.ep)
    return init_device_mesh(device_type, shape, mesh_dim_names=("pp", "edp", "ep"))


def apply_ep(module: Transformer, ep_mesh: DeviceMesh) -> None:
    """Keep this rank's experts of every MoE layer; tokens go to their experts' ranks over the
    EP group (all_to_all_single)."""
    from .moe import MoEFeedForward

    group, rank, size = ep_mesh.get_group(), ep_mesh.get_local_rank(), ep_mesh.size()
    for sub in module.modules():
        if isinstance(sub, MoEFeedForward):
            sub.localize(group, rank, size)


def sync_expert_grads(params: Sequence[nn.Parameter], edp_group: dist.ProcessGroup | None,
                      dp: int) -> None:
    """The experts' gradients of the whole global batch: each is already summed over the EP
    ranks that routed to it (the combine's backward); summed over the expert-DP replicas and
    divided by dp, as FSDP averages the other gradients over the DP ranks."""
    for p in params:
        if p.grad is None:
            continue
        if edp_group is not None and dist.get_world_size(edp_group) > 1:
            dist.all_reduce(p.grad, group=edp_group)
        p.grad /= dp


def set_microbatch_sync(module: nn.Module, zero: int, last: bool) -> None:
    """Gradient sync / resharding for one micro-batch of a step (the ZeRO mapping above)."""
    if not isinstance(module, FSDPModule):
        return
    if zero <= 1:
        module.set_requires_gradient_sync(last)
        module.set_reshard_after_backward(last)
    elif zero == 2:
        module.set_requires_gradient_sync(True)
        module.set_reshard_after_backward(last)


def build_schedule(stages: Sequence[PipelineStage], n_microbatches: int, kind: str):
    """The pipeline schedule: 1F1B (or GPipe) for one stage per rank, interleaved 1F1B for more.
    Losses are means per micro-batch; the schedule scales gradients by 1/n_microbatches."""
    if len(stages) > 1:
        return ScheduleInterleaved1F1B(list(stages), n_microbatches=n_microbatches,
                                       loss_fn=cross_entropy)
    cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=cross_entropy)


def sq_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of the given (possibly DTensor) tensors, over their whole meshes, fp32."""
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        s = t.detach().float().pow(2).sum()
        if isinstance(s, DTensor):
            s = s.full_tensor()
        total += s.double().cpu()
    return total


def grad_norm(modules: Sequence[nn.Module], pp_group: dist.ProcessGroup | None,
              ep_group: dist.ProcessGroup | None = None) -> float:
    """L2 norm of all gradients of the model, across tensor, data, expert and pipeline
    parallelism (the routed experts' squares summed over the EP group: each rank holds its own)."""
    experts = {id(p) for p in expert_params(modules)} if ep_group is not None else set()
    seen: set[int] = set()
    grads, expert_grads = [], []
    for m in modules:
        for p in m.parameters():
            if p.grad is not None and id(p) not in seen:
                seen.add(id(p))
                (expert_grads if id(p) in experts else grads).append(p.grad)
    total = sq_norm(grads)
    if experts:
        local = sq_norm(expert_grads).to(_group_device(ep_group))
        dist.all_reduce(local, group=ep_group)
        total = total + local.cpu()
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dev_total = total.to(_group_device(pp_group))
        dist.all_reduce(dev_total, group=pp_group)
        total = dev_total.cpu()
    return float(total.sqrt())


def _group_device(group: dist.ProcessGroup) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

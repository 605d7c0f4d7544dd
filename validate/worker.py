"""The torchrun worker of `planner validate`: builds the layout, trains warm-up then measured steps
on synthetic data, and rank 0 appends one record.

    python -m torch.distributed.run --nproc-per-node 4 -m planner.validate.worker --config RUN.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import context_parallel

from planner.interrupts import exit_with_launcher
from planner.io import append_jsonl
from planner.progress import report_phase

from .config import RunConfig, read_config
from .model import ModelArgs, Transformer, cross_entropy, set_positions, synthetic_batch
from .parallel import (
    PipelineStage,
    apply_dp,
    apply_ep,
    apply_recompute,
    apply_tp,
    build_expert_mesh,
    build_mesh,
    build_schedule,
    expert_params,
    grad_norm,
    local_stage_ids,
    set_microbatch_sync,
    stage_layer_ranges,
    stage_module,
    sync_expert_grads,
)
from .records import LAUNCHED_ENV, environment, failure_fields, one_line

# Relative agreement of step 1's loss and gradient norm with the single-process reference:
# fp32 on CPU differs only in reduction order (observed ~1e-6); bf16 autocast on GPUs rounds
# activations to 8 mantissa bits (2^-8 = 0.4%), accumulated over layers.
TOLERANCE_FP32 = 1e-4
TOLERANCE_BF16 = 2e-2
GIB = 2**30


def _device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device):
    """bf16 autocast on GPUs; fp32 on CPUs (CPU bf16 matmuls are slow and not what we model)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _reset_peak_mem(device: torch.device) -> None:
    """Start the peak-memory count here (after building and the reference step)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM), proc(5)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_mem_bytes(device: torch.device) -> float:
    """CUDA max allocated on GPUs; the peak resident set size (VmHWM) on CPUs."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def reference_step(full: Transformer, cfg: RunConfig, device: torch.device) -> tuple[float, float]:
    """Step 1 in one process on the whole model and the whole global batch: (loss, grad norm)."""
    model = copy.deepcopy(full).to(device)
    tokens, targets = synthetic_batch(cfg.global_batch, cfg.seq_len, model.args.vocab, cfg.seed, 0)
    with _autocast(device):
        loss = cross_entropy(model(tokens.to(device)), targets.to(device))
    loss.backward()
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()
                          if p.grad is not None))
    return float(loss.detach()), float(norm)


class Trainer:
    """One rank's part of the layout: its stage modules, optimizer and (with pp) schedule."""

    def __init__(self, cfg: RunConfig, full: Transformer, device: torch.device) -> None:
        layout = cfg.plan_layout
        self.cfg, self.layout, self.device = cfg, layout, device
        self.mesh = build_mesh(layout, device.type)
        coords = self.mesh.get_coordinate()
        self.pp_rank, self.dp_rank = coords[0], coords[1]
        num_stages = layout.pp * layout.vpp
        ranges = stage_layer_ranges(full.args.num_layers, num_stages, layout.stage_layers)
        self.stage_ids = local_stage_ids(layout, self.pp_rank)
        self.modules: list[Transformer] = []
        # experts over the DP ranks (MoE; ep 1 keeps every expert, reduced over all of dp)
        self.expert_mesh = build_expert_mesh(layout, device.type) if full.args.experts else None
        for sid in self.stage_ids:
            module = stage_module(full, ranges[sid], sid == 0, sid == num_stages - 1)
            if self.expert_mesh is not None and layout.ep > 1:
                apply_ep(module, self.expert_mesh["ep"])
            module.to(device)
            if layout.tp > 1:
                apply_tp(module, self.mesh["tp"], layout.sp)
            apply_recompute(module, layout.recompute)
            if layout.dp * layout.cp > 1:
                apply_dp(module, self.dp_mesh(), layout.zero)
            self.modules.append(module)
        # foreach AdamW; DTensor and plain parameters (e.g. norms under TP without SP) in separate
        # groups, since one foreach kernel cannot mix them
        params = list({id(p): p for m in self.modules for p in m.parameters()}.values())
        groups = [g for g in (
            [p for p in params if isinstance(p, DTensor)],
            [p for p in params if not isinstance(p, DTensor)],
        ) if g]
        self.optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=cfg.lr,
                                           foreach=True)
        self.grad_accum = layout.grad_accum(cfg.global_batch)
        self.has_first = 0 in self.stage_ids
        self.has_last = (num_stages - 1) in self.stage_ids
        self.schedule = None
        if layout.pp > 1:
            pp_group = self.mesh["pp"].get_group()
            stages = [PipelineStage(m, sid, num_stages, device, group=pp_group)
                      for m, sid in zip(self.modules, self.stage_ids, strict=True)]
            self.schedule = build_schedule(stages, self.grad_accum, cfg.pp_schedule)
        self.pp_group = self.mesh["pp"].get_group() if layout.pp > 1 else None

    def dp_mesh(self):
        """The mesh gradients are averaged over: dp, or dp x cp flattened (cp ranks hold the
        same parameters and see different tokens of the same sequences)."""
        if self.layout.cp == 1:
            return self.mesh["dp"]
        if not hasattr(self, "_dp_cp"):
            self._dp_cp = self.mesh["dp", "cp"]._flatten("dp_cp")
        return self._dp_cp

    def local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This DP rank's share of the step's global batch (grad_accum * mbs sequences)."""
        tokens, targets = synthetic_batch(self.cfg.global_batch, self.cfg.seq_len,
                                          self.modules[0].args.vocab, self.cfg.seed, step)
        share = self.cfg.global_batch // self.layout.dp
        rows = slice(self.dp_rank * share, (self.dp_rank + 1) * share)
        # copies: context_parallel shards them in place
        return tokens[rows].to(self.device).clone(), targets[rows].to(self.device).clone()

    def step(self, step: int, want_grad_norm: bool) -> tuple[float, float | None]:
        """One optimizer step; returns (mean loss over the global batch, grad norm or None)."""
        tokens, targets = self.local_batch(step)
        self.optimizer.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        with self._context_parallel(tokens, targets), _autocast(self.device), self._offload():
            if self.schedule is None:
                model = self.modules[0]
                mbs = self.layout.mbs
                for i in range(self.grad_accum):
                    set_microbatch_sync(model, self.layout.zero, last=i == self.grad_accum - 1)
                    rows = slice(i * mbs, (i + 1) * mbs)
                    loss = cross_entropy(model(tokens[rows]), targets[rows]) / self.grad_accum
                    loss.backward()
                    loss_sum += float(loss.detach())
            else:
                losses: list[torch.Tensor] = []
                args = (tokens,) if self.has_first else ()
                self.schedule.step(*args, target=targets if self.has_last else None,
                                   losses=losses if self.has_last else None)
                if self.has_last:
                    loss_sum += float(torch.stack([x.detach().float() for x in losses]).mean())
        if self.expert_mesh is not None:
            edp = self.expert_mesh["edp"].get_group() if self.layout.dp > self.layout.ep else None
            sync_expert_grads(expert_params(self.modules), edp, self.layout.dp)
        ep_group = self.expert_mesh["ep"].get_group() if self.expert_mesh is not None and \
            self.layout.ep > 1 else None
        norm = grad_norm(self.modules, self.pp_group, ep_group) if want_grad_norm else None
        self.optimizer.step()
        return self._global_mean_loss(loss_sum), norm

    def _offload(self) -> contextlib.AbstractContextManager:
        """recompute='offload': every tensor autograd saves goes to host memory and comes back
        for the backward (torch.autograd.graph.save_on_cpu; pinned buffers on GPUs)."""
        if self.layout.recompute != "offload":
            return contextlib.nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")

    @contextlib.contextmanager
    def _context_parallel(self, tokens: torch.Tensor, targets: torch.Tensor):
        """With cp > 1: torch's context_parallel shards tokens, targets and the positions along
        the sequence (head-tail load balanced) and runs ring attention in SDPA's place."""
        if self.layout.cp == 1:
            yield
            return
        positions = torch.arange(tokens.shape[1], device=self.device)
        buffers = [tokens, targets, positions]
        with context_parallel(self.mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 0],
                              no_restore_buffers=set(buffers)):
            for m in self.modules:
                set_positions(m, positions)
            yield

    def _global_mean_loss(self, loss_sum: torch.Tensor) -> float:
        """Average the loss over the ranks that computed one (last pipeline stage)."""
        dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        buf = torch.tensor([float(loss_sum), 1.0 if self.has_last else 0.0],
                           dtype=torch.float64, device=dev)
        dist.all_reduce(buf)
        return float(buf[0] / buf[1])


def run(cfg: RunConfig, device: torch.device, backend: str) -> dict[str, Any]:
    """Train and measure; returns the record fields this rank knows (complete on rank 0)."""
    layout = cfg.plan_layout
    args = ModelArgs.from_spec(cfg.model, cfg.seq_len)
    notes = []
    if args.tied and layout.pp > 1:
        # The first and last stages would hold two copies of the tied matrix; Megatron all-reduces
        # their gradients between the two stages. We run the untied model in both the layout and
        # the reference instead.
        args = replace(args, tied=False)
        notes.append("tied embeddings untied for pp > 1")
    torch.manual_seed(cfg.seed)
    full = Transformer(args)
    rank = dist.get_rank()
    total = cfg.warmup + cfg.steps

    local_rank = int(os.environ.get("LOCAL_RANK", rank))

    def phase(done: int, text: str) -> None:  # each node's launcher hears its local rank 0
        if local_rank == 0:
            report_phase(done, total, f"{cfg.base_record.get('layout', '')}: {text}")

    ref_loss = ref_norm = None
    if cfg.check and rank == 0:
        phase(0, "single-process reference step")
        ref_loss, ref_norm = reference_step(full, cfg, device)
    phase(0, "building the layout")
    trainer = Trainer(cfg, full, device)
    del full
    _reset_peak_mem(device)
    losses, times, first_norm = [], [], None
    for step in range(total):
        phase(step, f"step {step + 1}/{total}" + (" (warm-up)" if step < cfg.warmup else ""))
        _sync(device)
        t0 = time.perf_counter()
        loss, norm = trainer.step(step, want_grad_norm=step == 0)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        if step == 0:
            first_norm = norm
    phase(total, "gathering the measurements")
    measured = torch.tensor(times[cfg.warmup:], dtype=torch.float64)
    peak = torch.tensor([_peak_mem_bytes(device)], dtype=torch.float64)
    if device.type == "cuda":
        measured, peak = measured.to(device), peak.to(device)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)  # the slowest rank sets each step's time
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    step_times = [float(t) for t in measured.cpu()]
    median = statistics.median(step_times)
    tol = TOLERANCE_BF16 if device.type == "cuda" else TOLERANCE_FP32
    record: dict[str, Any] = {
        "measured_step_time_s": median,
        "measured_step_times_s": step_times,
        "measured_tokens_per_s": cfg.global_batch * cfg.seq_len / median,
        "measured_peak_mem_gb": float(peak.cpu()[0]) / GIB,
        "losses": losses,
        "first_step_grad_norm": first_norm,
        "reference_loss": ref_loss,
        "reference_grad_norm": ref_norm,
        "match_tolerance_rel": tol,
        "world_size": dist.get_world_size(),
        "backend": backend,
        "notes": notes,
    }
    if ref_loss is not None:
        record["loss_rel_error"] = abs(losses[0] - ref_loss) / abs(ref_loss)
        record["grad_norm_rel_error"] = abs(first_norm - ref_norm) / abs(ref_norm)
        record["match"] = record["loss_rel_error"] <= tol and record["grad_norm_rel_error"] <= tol
    return record


def _inject_fault(rank: int) -> None:
    """Test hook: PLANNER_VALIDATE_FAULT="raise:R", "hang:R" or "kill:R" makes rank R raise,
    sleep forever or SIGKILL itself after initialization, so the failure paths can be tested."""
    spec = os.environ.get("PLANNER_VALIDATE_FAULT", "")
    if not spec:
        return
    kind, _, which = spec.partition(":")
    if int(which or 0) != rank:
        return
    if kind == "raise":
        raise RuntimeError("injected fault")
    if kind == "hang":
        while True:
            time.sleep(1)
    if kind == "kill":
        os.kill(os.getpid(), 9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="planner validate worker (run under torchrun)")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the launcher")
    ns = parser.parse_args(argv)
    exit_with_launcher()  # the planner killed outright: end, do not train on to the end
    cfg = read_config(ns.config)
    device, backend = _device()
    threads = os.environ.get("PLANNER_THREADS")
    if device.type == "cpu" and threads:
        torch.set_num_threads(int(threads))
    rank = int(os.environ.get("RANK", "0"))
    base = {**cfg.base_record, "run_id": cfg.run_id, **environment(device)}
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
        _inject_fault(rank)
        fields = run(cfg, device, backend)
        if rank == 0:
            append_jsonl(cfg.out, {**base, **fields, "ok": True, "error": None})
        return 0
    except Exception as exc:  # one line for the launcher, the traceback on stderr
        reason = one_line(exc)
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (Path(cfg.run_dir) / f"error-rank{rank}.txt").write_text(reason + "\n")
        traceback.print_exc()
        if rank == 0 and not os.environ.get(LAUNCHED_ENV):  # the launcher picks the root cause
            append_jsonl(cfg.out, {**base, **failure_fields(reason, backend), "ok": False})
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

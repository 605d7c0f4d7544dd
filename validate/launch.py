"""Start a validate run under torchrun, watch it, and make sure a record exists afterwards.

The launcher predicts the plan with the cost model (when a profile is known), writes the
RunConfig, runs `python -m torch.distributed.run ... -m planner.validate.worker --config RUN.json`
in its own process group, and on a crash, a hang past the timeout or an OOM kill appends a record
with ok false and a one-line reason, then kills whatever is left of the group. No torch here
except the optional GPU probe for the default profile.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import LayoutError, SpecError
from planner.interrupts import (
    Interrupted,
    deferred,
    die_with_parent_preexec,
    parent_env,
    raise_on_signals,
)
from planner.io import append_jsonl, read_jsonl
from planner.layout import Layout
from planner.progress import PROGRESS_FILE_ENV, Bar, PhaseFile, progress
from planner.specs import ClusterSpec, GpuProfile, JobSpec, ModelSpec

from .config import RunConfig
from .records import LAUNCHED_ENV, failure_fields

KILL_GRACE_S = 5.0  # SIGTERM, then SIGKILL this long after
POLL_S = 0.25  # how often the launcher looks at the workers' progress file
# Set in torchrun's environment (its workers inherit it): finds them even after re-parenting.
RUN_TAG_ENV = "PLANNER_RUN_TAG"


@dataclass
class Launch:
    """A prepared run: the config on disk and the torchrun command that runs it."""

    config: RunConfig
    config_path: Path
    command: list[str]
    nproc_per_node: int
    nnodes: int
    backend: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def require_torch() -> None:
    """SpecError (one line, exit 2) when torch is not installed: torchrun would fail in every
    process. Looks the module up without importing it."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SpecError("this command runs torch under torchrun, and torch is not installed: "
                        "pip install 'llm-3d-planner[validate]'")


def _no_gpu_driver() -> bool:
    """True when no NVIDIA or AMD GPU driver is loaded (Linux: no /proc/driver/nvidia, no
    /dev/nvidia0, no /dev/kfd), so torch would see no GPU: the launcher then need not import
    torch (~3 s on a busy 2-core host) just to learn that."""
    if not Path("/proc").is_dir():  # not Linux: ask torch
        return False
    return not any(Path(p).exists() for p in ("/proc/driver/nvidia/gpus", "/dev/nvidia0",
                                              "/dev/kfd"))


def local_gpu_count() -> int:
    """GPUs torch sees here (torch.cuda.device_count(), 0 without CUDA)."""
    if _no_gpu_driver():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:  # pragma: no cover - torch is required by validate
        return 0


def local_backend() -> str:
    """nccl when a CUDA GPU is visible, gloo otherwise."""
    return "nccl" if local_gpu_count() > 0 else "gloo"


def local_profile() -> GpuProfile | None:
    """The built-in profile whose name or alias appears in the local GPU's name, if any."""
    if local_gpu_count() == 0:
        return None
    try:
        import torch

        name = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        return None
    from planner.registry import gpu_of_device

    return gpu_of_device(name)


def local_device() -> str:
    """This machine's device as a validate record names it: the first GPU's name
    (torch.cuda.get_device_name), else 'cpu'."""
    if local_gpu_count() == 0:
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def _mem_available_bytes() -> float | None:
    """/proc/meminfo MemAvailable (proc(5)): what new processes can take without swapping."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass
class RunMemory:
    """Predicted memory of one validate run, bytes: per rank on the host and on the device, and
    rank 0's extra for the single-process reference step (--check)."""

    host_per_rank: float
    device_per_rank: float
    reference: float


def run_memory(model: ModelSpec, layout: Layout, job: JobSpec, gpu: GpuProfile | None,
               nproc_per_node: int, cuda: bool, check: bool) -> RunMemory:
    """What a validate run holds (validate/worker.py): every rank first builds the whole model in
    fp32 on the host (4 bytes a parameter), then keeps its shard, trained in fp32 (weights 4,
    gradients 4, AdamW m and v 8 bytes a parameter; activations fp32 on CPUs, bf16 autocast on
    GPUs). The shard's bytes are the cost model's memory terms (planner.costmodel.memory: 16-bit
    weights, the recipe's gradients, 12 bytes of fp32 master + Adam) rescaled to those widths.
    The reference step (rank 0 with --check) adds a copy of the model and its gradients."""
    from planner.costmodel import estimate
    from planner.costmodel.memory import GRAD_BYTES_BY_ZERO, OPTIMIZER_BYTES, WEIGHT_BYTES
    from planner.registry import load_gpu

    full = 4.0 * model.num_params
    gib = 2**30
    try:
        cluster = ClusterSpec(gpu=gpu or load_gpu("H100"), num_nodes=max(
            1, layout.num_gpus // nproc_per_node), gpus_per_node=nproc_per_node)
        est = estimate(model, cluster, job, layout)
        grad_bytes = float(GRAD_BYTES_BY_ZERO[layout.zero])
        state = gib * (est.mem_weights_gb * 4 / WEIGHT_BYTES + est.mem_grads_gb * 4 / grad_bytes
                       + est.mem_optimizer_gb * 8 / OPTIMIZER_BYTES)
        shard = state + gib * (est.mem_activations_gb * (1 if cuda else 2) + est.mem_other_gb)
    except (LayoutError, SpecError, ValueError):  # no estimate: the whole model per rank
        shard = 4 * full
    host = full if cuda else max(full, shard)
    return RunMemory(host_per_rank=host, device_per_rank=shard if cuda else 0.0,
                     reference=2 * full if check else 0.0)


def check_machine(model: ModelSpec, layout: Layout, job: JobSpec, gpu: GpuProfile | None,
                  nproc_per_node: int, check: bool = True) -> None:
    """SpecError (one line, exit 2) before launching a run this machine cannot hold: the ranks'
    predicted host memory (run_memory) against /proc/meminfo MemAvailable, and on GPUs each
    rank's device memory against torch.cuda.mem_get_info's free bytes."""
    gpus = local_gpu_count()
    need = run_memory(model, layout, job, gpu, nproc_per_node, gpus > 0, check)
    gib = 2**30
    host = nproc_per_node * need.host_per_rank + need.reference
    available = _mem_available_bytes()
    if available is not None and host > available:
        raise SpecError(
            f"{model.name} {layout} needs about {host / gib:.1f} GiB of host memory here "
            f"({nproc_per_node} ranks x {need.host_per_rank / gib:.1f} GiB"
            + (f" + {need.reference / gib:.1f} GiB for the --check reference" if check else "")
            + f"), {available / gib:.1f} GiB available: scale the model down (--layers, "
            "--hidden, ...) or use fewer ranks")
    if gpus > 0 and need.device_per_rank > 0:
        import torch

        free = min(torch.cuda.mem_get_info(i)[0] for i in range(min(gpus, nproc_per_node)))
        if need.device_per_rank > free:
            raise SpecError(
                f"{model.name} {layout} needs about {need.device_per_rank / gib:.1f} GiB per "
                f"GPU here, {free / gib:.1f} GiB free: scale the model down or shard more")


def predict(model: ModelSpec, layout: Layout, job: JobSpec, gpu: GpuProfile | None,
            nnodes: int, nproc_per_node: int) -> dict[str, Any]:
    """Plan columns and predicted_step_time_s for the run (null prediction without a profile or
    without the cost model); the prediction's own error, if any, in `prediction_error`."""
    out: dict[str, Any] = {
        **layout.as_dict(), "rank": 0, "global_batch": job.global_batch, "seq_len": job.seq_len,
        "grad_accum": layout.grad_accum(job.global_batch), "predicted_step_time_s": None,
        "prediction_error": None,
    }
    if gpu is None:
        out["prediction_error"] = "no profile for this hardware: pass --profile (`planner profile`)"
        return out
    try:
        from planner.costmodel import estimate
        from planner.plan import Plan
    except ImportError as exc:  # the cost model is optional for a run
        out["prediction_error"] = f"cost model unavailable: {exc}"
        return out
    cluster = ClusterSpec(gpu=gpu, num_nodes=nnodes, gpus_per_node=nproc_per_node)
    try:
        est = estimate(model, cluster, job, layout)
    except LayoutError as exc:
        out["prediction_error"] = str(exc)
        return out
    out.update(Plan(layout=layout, estimate=est).row())
    out["predicted_step_time_s"] = est.step_time_s
    out["predicted_step_time_low_s"] = est.step_time_low_s
    out["predicted_step_time_high_s"] = est.step_time_high_s
    return out


def prepare(model: ModelSpec, layout: Layout, job: JobSpec, *, out: Path, steps: int, warmup: int,
            profile: GpuProfile | None, profile_ref: str | None, nproc: int | None = None,
            nnodes: int = 1, rdzv_endpoint: str | None = None, backend: str | None = None,
            seed: int = 0, check: bool = True, pp_schedule: str = "1f1b",
            timeout_s: float = 600.0, threads: int | None = None,
            extra: dict[str, Any] | None = None) -> Launch:
    """Check the run, predict it, write its config and build the torchrun command."""
    from .config import require_supported

    world = layout.num_gpus
    if world % nnodes:
        raise LayoutError(f"{world} processes (tp*pp*dp*cp) do not split over {nnodes} nodes")
    per_node = nproc if nproc is not None else world // nnodes
    if per_node * nnodes != world:
        raise LayoutError(f"--nproc {per_node} x {nnodes} node(s) = {per_node * nnodes} processes, "
                          f"but the layout {layout} needs tp*pp*dp*cp = {world}")
    backend = backend or local_backend()
    if backend not in ("gloo", "nccl", "mpi", "xccl"):
        raise SpecError(f"unknown backend '{backend}' (gloo on CPUs, nccl on GPUs)")
    require_supported(model, layout, job.global_batch, job.seq_len, backend)
    run_id = uuid.uuid4().hex[:12]
    run_dir = out.parent / ".planner-validate" / run_id
    base = {
        "model": model.name, "layout": str(layout), "run_id": run_id,
        # what the matmuls ran in: bf16 autocast on GPUs, fp32 on CPUs (`precision` below is the
        # JobSpec's, the one the prediction used)
        "compute_dtype": "bf16" if backend == "nccl" else "fp32",
        # the spec as it ran (scaled down) and the precision: `planner calibrate` re-predicts it
        "model_spec": model.model_dump(mode="json"), "precision": job.precision,
        "profile": profile_ref if profile is not None else None,
        "profile_name": profile.name if profile is not None else None,
        "steps": steps, "warmup": warmup, "seed": seed, "nnodes": nnodes,
        "nproc_per_node": per_node, "pp_schedule": pp_schedule,
        **predict(model, layout, job, profile, nnodes, per_node),
        **(extra or {}),
    }
    config = RunConfig(
        run_id=run_id, model=model, layout=layout.as_dict(), seq_len=job.seq_len,
        global_batch=job.global_batch, steps=steps, warmup=warmup, seed=seed, check=check,
        pp_schedule=pp_schedule, collective_timeout_s=max(30, int(timeout_s)),
        out=out.resolve(), run_dir=run_dir.resolve(), base_record=base,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    config_path.write_text(config.model_dump_json(indent=1))
    cmd = torchrun_prefix(per_node, nnodes, rdzv_endpoint, run_id)
    cmd += ["-m", "planner.validate.worker", "--config", str(config_path.resolve())]
    env = cpu_thread_env(per_node, threads) if backend == "gloo" else {}
    return Launch(config, config_path, cmd, per_node, nnodes, backend, env)


def cpu_thread_env(per_node: int, threads: int | None = None) -> dict[str, str]:
    """Environment that shares the node's cores between its ranks (CPU runs): cores / ranks
    threads each unless `threads` is given (read by the workers as PLANNER_THREADS)."""
    n = threads or max(1, (os.cpu_count() or 1) // per_node)
    return {"OMP_NUM_THREADS": str(n), "PLANNER_THREADS": str(n)}


def torchrun_prefix(nproc_per_node: int, nnodes: int, rdzv_endpoint: str | None,
                    rdzv_id: str) -> list[str]:
    """`python -m torch.distributed.run` with the process count and the rendezvous."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0"]
    if rdzv_endpoint:
        return cmd + ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                      "--rdzv-id", rdzv_id]
    if nnodes > 1:
        raise SpecError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node)")
    return cmd + ["--standalone"]


def _proc_stat(pid: int) -> tuple[int, int, str, int] | None:
    """(parent pid, process group, state letter, start time in clock ticks since boot) from
    /proc/PID/stat (proc(5)), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    return int(fields[1]), int(fields[2]), fields[0], int(fields[19])


def _alive(pid: int, started: int | None = None) -> bool:
    """Running (not gone, not a zombie waiting to be reaped), and when `started` is given the
    same process that started then (not a new one that reuses the pid)."""
    stat = _proc_stat(pid)
    return (stat is not None and stat[2] not in ("Z", "X")
            and (started is None or stat[3] == started))


def process_tree(root: int, tag: str | None = None) -> set[int]:
    """`root` and its descendants, plus every process of ours started with RUN_TAG_ENV=`tag` in
    its environment (a worker whose torchrun died was re-parented, but keeps its environment).
    Reads /proc (Linux); elsewhere only `root`."""
    proc = Path("/proc")
    if not proc.is_dir():
        return {root}
    children: dict[int, list[int]] = {}
    tagged: set[int] = set()
    needle = f"{RUN_TAG_ENV}={tag}\0".encode() if tag else None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _proc_stat(pid)
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(pid)
        if needle is not None:
            try:
                if needle in (entry / "environ").read_bytes():
                    tagged.add(pid)
            except OSError:  # another user's process, or gone
                pass
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree | tagged


def end_process_tree(root: int, tag: str | None = None, grace_s: float = KILL_GRACE_S) -> None:
    """End torchrun (`root`) and every process it started: SIGTERM to each one's process group
    (torchrun starts every worker in a session of its own, torch.distributed.elastic's
    SubprocessHandler: start_new_session=True, torch 2.13), SIGKILL to what is left after
    `grace_s`. The tree is collected before anything is signalled, while the parent links hold."""
    started: dict[int, int] = {}

    def collect() -> None:
        for pid in process_tree(root, tag):
            stat = _proc_stat(pid)
            if stat is not None:
                started.setdefault(pid, stat[3])

    collect()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):  # until gone
        if sig == signal.SIGKILL:
            collect()
        live = {p for p, t in started.items() if _alive(p, t)}
        if not live:
            return
        # a group is signalled only through its leader, one of ours (a worker, torchrun)
        groups = {stat[1] for p in live if (stat := _proc_stat(p)) is not None} & live
        for pgid in groups - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p, started[p]) for p in live):
            time.sleep(0.05)


def _find_record(out: Path, run_id: str) -> dict[str, Any] | None:
    """The record of `run_id` in `out` (the last one), whatever else the file holds."""
    if not out.is_file():
        return None
    try:
        records = read_jsonl(out, warn=False)  # other lines (torn, comments) are not ours
    except SpecError:
        return None
    for rec in reversed(records):
        if isinstance(rec, dict) and rec.get("run_id") == run_id:
            return rec
    return None


def _failure_reason(launch: Launch, rc: int | None, timeout_s: float | None, log: Path) -> str:
    """One line: the hang, a rank killed by a signal (it leaves no error of its own, and its
    peers' errors, a closed connection, follow from it), else the first rank's own error, else
    how torchrun saw a rank exit."""
    if timeout_s is not None:
        return f"timed out after {timeout_s:g} s (a rank hung or the run is too slow); killed"
    text = log.read_text(errors="replace") if log.is_file() else ""
    exits = [(int(code), int(rank)) for code, rank in
             re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)", text)]
    killed = [(code, rank) for code, rank in exits if code < 0]
    if killed:
        code, local_rank = killed[0]
        name = signal.Signals(-code).name
        hint = " (out of host memory?)" if name == "SIGKILL" else ""
        who = (f"rank {local_rank}" if launch.nnodes == 1 else
               f"local rank {local_rank} of this node")
        return f"{who} was killed by {name}{hint}; see {log}"
    errors = sorted(Path(launch.config.run_dir).glob("error-rank*.txt"),
                    key=lambda p: p.stat().st_mtime)
    if errors:
        rank = errors[0].stem.removeprefix("error-rank")
        return f"rank {rank}: {errors[0].read_text().strip()}"
    if exits:
        code, local_rank = exits[0]
        return f"local rank {local_rank} exited with code {code}; see {log}"
    return f"torchrun exited with code {rc}; see {log}"


def run_torchrun(command: list[str], env: dict[str, str], log: Path, timeout_s: float, *,
                 progress_file: Path | None = None, bar: Bar | None = None
                 ) -> tuple[int | None, bool]:
    """Run a torchrun command in its own session with its output in `log`; returns (exit code
    or None, timed out). SIGTERM, SIGINT and SIGHUP raise planner.interrupts.Interrupted here;
    on every way out (done, timed out, interrupted, any error) torchrun and every process it
    started are gone when this returns. The workers' phases (progress_file, written by rank 0)
    move `bar` while it runs."""
    timed_out = False
    tag = uuid.uuid4().hex[:16]
    full_env = {**os.environ, **env, RUN_TAG_ENV: tag, **parent_env()}  # workers watch us
    phases = None
    if progress_file is not None:
        full_env[PROGRESS_FILE_ENV] = str(progress_file)
        phases = PhaseFile(progress_file)
    proc = None
    with raise_on_signals(), open(log, "w") as log_file:
        try:
            with deferred():  # a signal while starting is raised once the handle is held
                # SIGKILL of the planner ends torchrun (parent-death signal) and its workers
                # (their watchdog: planner.interrupts.exit_with_launcher)
                proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                        env=full_env, start_new_session=True,
                                        preexec_fn=die_with_parent_preexec())
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    rc = proc.wait(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if phases is not None and bar is not None:
                        phases.follow(bar)
                    if time.monotonic() >= deadline:
                        timed_out, rc = True, None
                        break
        finally:  # also on Ctrl-C, SIGTERM, SIGHUP: leave nothing behind
            if proc is not None:
                end_process_tree(proc.pid, tag)
                proc.wait()
    return rc, timed_out


def execute(launch: Launch, timeout_s: float = 600.0, *,
            show_progress: bool | None = None) -> dict[str, Any]:
    """Run the prepared torchrun command and return the run's record (appending a failure record
    when the workers did not write one). Nothing of the process tree survives this call; the run
    folder (config, torchrun log, per-rank errors) is removed after a good run. On SIGTERM,
    SIGINT or SIGHUP the record says `interrupted by SIG...` and Interrupted is raised again.
    A bar follows the workers' steps on a terminal (`show_progress` None) or when True."""
    cfg = launch.config
    log = Path(cfg.run_dir) / "torchrun.log"
    total = cfg.warmup + cfg.steps
    label = f"{cfg.base_record.get('layout', '')}"
    try:
        with progress(f"{label}: starting torchrun", total, enabled=show_progress) as bar:
            rc, timed_out = run_torchrun(
                launch.command, {**launch.env, LAUNCHED_ENV: "1"}, log, timeout_s,
                progress_file=Path(cfg.run_dir) / "progress.jsonl", bar=bar)
    except Interrupted as exc:
        if _find_record(cfg.out, cfg.run_id) is None:  # rank 0 had not finished: say why
            append_jsonl(cfg.out, _failure_record(launch, exc.reason, log))
            exc.note = f"torchrun and its workers ended, the run's record appended to {cfg.out}"
        raise
    record = _find_record(cfg.out, cfg.run_id)
    if record is not None and record.get("ok"):  # the run folder is kept only after a failure
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
    if record is not None:  # written by rank 0 (ok, or its own failure when run by hand)
        return record
    reason = _failure_reason(launch, rc, timeout_s if timed_out else None, log)
    record = _failure_record(launch, reason, log)
    append_jsonl(cfg.out, record)
    return record


def _failure_record(launch: Launch, reason: str, log: Path) -> dict[str, Any]:
    cfg = launch.config
    return {**cfg.base_record, "run_id": cfg.run_id, **_launcher_environment(launch),
            **failure_fields(reason, launch.backend), "log": str(log)}


def _launcher_environment(launch: Launch) -> dict[str, Any]:
    import datetime as dt
    import platform
    import socket
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:  # pragma: no cover
        torch_version = None
    return {"device": None, "torch_version": torch_version, "hostname": socket.gethostname(),
            "python_version": platform.python_version(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "world_size": launch.nproc_per_node * launch.nnodes}


def summary(record: dict[str, Any]) -> str:
    """Short human line for a record."""
    return json.dumps({k: record.get(k) for k in (
        "layout", "ok", "error", "measured_step_time_s", "predicted_step_time_s",
        "measured_peak_mem_gb", "match")})

"""`planner profile`: measure this machine under torchrun and write a GPU profile.

    planner profile --out my-cluster.yaml                 # all local GPUs, or 2 CPU processes
    planner profile --out cpu.yaml --nproc 4 --quick
    planner profile --out h100.yaml --nnodes 2 --rdzv-endpoint node0:29500   # on every node

GEMM sweeps over sizes and dtypes, fused attention, copy bandwidth, and all-reduce, all-gather,
reduce-scatter and send/recv sweeps over message sizes (inside a node, and across nodes when
there are several). The profile has the built-in profiles' schema, every value with its source,
and is usable by solve, estimate and validate through --profile. The sweeps are budgeted by the
device (a size sweep stops after its first point past the budget; a dtype this CPU emulates is
skipped), both said in the profile; a terminal shows the phases as a progress bar. SIGTERM,
SIGINT or SIGHUP end torchrun and its workers, leave --out as it was and exit 128 + signal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner import limits
from planner.cli.options import NnodesOpt, RdzvEndpointOpt, output_option, timeout_option
from planner.cli.typer_app import app


@app.command("profile")
def profile_cmd(
    out: output_option("--out", "Profile YAML to write.", "-o"),
    nproc: Annotated[int | None, typer.Option(
        "--nproc", min=2, max=limits.MAX_NPROC,
        help="Processes per node (default: the GPUs, or 2 on CPUs).")] = None,
    nnodes: NnodesOpt = 1,
    rdzv_endpoint: RdzvEndpointOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name (default: the "
                                             "file's stem).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer sizes, shorter timings.")] = False,
    timeout: timeout_option("Give up after this many seconds.") = 900.0,
) -> None:
    """Measure GEMM, attention, memory and collective performance and write a GPU profile."""
    import json
    import tempfile
    import time
    import uuid

    from rich.console import Console

    from planner.errors import PlannerError
    from planner.interrupts import Interrupted, raise_on_signals
    from planner.progress import progress
    from planner.validate.launch import (
        cpu_thread_env,
        local_gpu_count,
        local_profile,
        require_torch,
        run_torchrun,
        torchrun_prefix,
    )
    from planner.validate.profile import build_profile, write_profile

    require_torch()
    gpus = local_gpu_count()  # imports torch only where a GPU driver is loaded
    cuda = gpus > 0
    per_node = nproc or (gpus if cuda else 2)
    if per_node < 2:
        raise PlannerError("profiling needs at least 2 processes per node (--nproc 2)")
    console = Console(stderr=True, soft_wrap=True)
    started = time.monotonic()
    with raise_on_signals(), tempfile.TemporaryDirectory(prefix="planner-profile-") as tmp:
        raw_path = Path(tmp) / "raw.json"
        cmd = torchrun_prefix(per_node, nnodes, rdzv_endpoint, uuid.uuid4().hex[:12])
        cmd += ["-m", "planner.validate.bench", "--out", str(raw_path)]
        if quick:
            cmd.append("--quick")
        env = {} if cuda else cpu_thread_env(per_node)
        console.print("torchrun command:", highlight=False)
        typer.echo(" ".join([*(f"{k}={v}" for k, v in env.items()), *cmd]),
                   err=str(out) == "-")  # stdout carries the profile with --out -
        log = Path(tmp) / "torchrun.log"
        try:
            with progress("profile: starting torchrun") as bar:
                rc, timed_out = run_torchrun(cmd, env, log, timeout,
                                             progress_file=Path(tmp) / "progress.jsonl", bar=bar)
        except Interrupted as exc:
            exc.note = f"torchrun and its workers ended; {out} not written"
            raise
        if timed_out or rc != 0 or not raw_path.is_file():
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            for line in tail:
                console.print(line, highlight=False, markup=False)
            why = f"timed out after {timeout:g} s" if timed_out else f"torchrun exit code {rc}"
            raise PlannerError(f"profiling failed ({why}); {out} not written")
        raw = json.loads(raw_path.read_text())
    spec = local_profile() if cuda else None
    profile = build_profile(raw, name or (out.stem if str(out) != "-" else "profile"), spec)
    write_profile(profile, out)
    for name_, why in raw.get("gemm_skipped", {}).items():
        console.print(f"GEMM {name_} {why}", highlight=False)
    for line in raw.get("sweeps_stopped", []):
        console.print(f"time budget: {line}", highlight=False)
    console.print(
        f"wrote {out} in {time.monotonic() - started:.0f} s: peak "
        f"{profile.peak_bf16_tflops * 1e3:.1f} GFLOP/s per process, "
        f"all-reduce busbw up to {profile.intra_node.link_gb_per_s:.3g} GB/s, "
        f"copy {profile.hbm_tb_per_s * 1e3:.1f} GB/s, {profile.memory_gib:.1f} GiB per process",
        highlight=False)

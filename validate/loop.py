"""The closed loop: validate the top plans on this machine, refit the profile, re-rank.

    from planner.validate.loop import closed_loop
    result = closed_loop(model, cluster, job, pins={}, n=3, runs_path="runs.jsonl")
    result.winner_changed, result.plans_after[0], result.fit.profile

The `n` plans that best separate the tie of `solve` (choose_calibration_plans: the first plan,
then the tied plans that differ most in what drives their step times) run for real through
planner.validate's launcher (one torchrun per plan, records appended to `runs_path`); the
profile is fitted to those runs (planner.calibrate.calibrate) and the search runs again with
the fitted profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.calibrate.choose import choose_calibration_plans
from planner.calibrate.fit import FitResult, calibrate, profile_yaml
from planner.errors import PlannerError
from planner.layout import Layout
from planner.measured.runs import Skipped, load_records
from planner.plan import Plan
from planner.progress import progress
from planner.specs import ClusterSpec, JobSpec, ModelSpec

# validate_run(model, cluster, job, layout, runs_path) appends one record to runs_path
ValidateRun = Callable[[ModelSpec, ClusterSpec, JobSpec, Layout, Path], Any]
# the loop chooses its n runs among the first 4 n ranked plans (or the shown top_k, if more)
CANDIDATES_PER_RUN = 4
SHOWN_PLANS = 10  # closed_loop's top_k default: solve --top's


def candidate_count(n: int, top_k: int = SHOWN_PLANS) -> int:
    """How many ranked plans the loop chooses its `n` runs among (choose_calibration_plans)."""
    return max(top_k, CANDIDATES_PER_RUN * n)


@dataclass
class ClosedLoopResult:
    """What the loop did: the ranking before and after the refit, and the fit itself."""

    plans_before: list[Plan]
    plans_after: list[Plan]
    fit: FitResult
    validated: list[Layout]
    skipped: list[Skipped]
    runs_path: Path
    profile_path: Path | None

    @property
    def winner_changed(self) -> bool:
        """True when the fitted profile ranks a different layout first."""
        return self.plans_before[0].layout != self.plans_after[0].layout


def default_validate_run(steps: int = 4, warmup: int = 1, timeout_s: float = 600.0,
                         **options: Any) -> ValidateRun:
    """One run through planner.validate's launcher (prepare + execute: torchrun in its own
    process group, a failure record on a crash or timeout). `options` go to
    planner.validate.launch.prepare (backend, threads, check, ...)."""

    def run(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
            runs_path: Path) -> Any:
        from planner.validate.launch import execute, prepare

        launch = prepare(model, layout, job, out=runs_path, steps=steps, warmup=warmup,
                         profile=cluster.gpu, profile_ref=cluster.gpu.name,
                         nnodes=cluster.num_nodes, timeout_s=timeout_s, **options)
        return execute(launch, timeout_s=timeout_s)

    def preflight(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout) -> None:
        """SpecError before any run when this machine is not the cluster's GPU, or cannot hold
        the run (planner.validate.launch.check_machine)."""
        from planner.errors import SpecError
        from planner.measured.runs import profile_device_mismatch
        from planner.validate.launch import check_machine, local_device

        why = profile_device_mismatch(cluster.gpu, local_device())
        if why:
            raise SpecError(f"--calibrate runs the plans on this machine, {why}: measure this "
                            "machine with `planner profile --out here.yaml` and pass --profile "
                            "here.yaml (its runs then calibrate that profile)")
        check_machine(model, layout, job, cluster.gpu, cluster.gpus_per_node,
                      check=options.get("check", True))

    run.preflight = preflight  # type: ignore[attr-defined]
    return run


def closed_loop(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, Any],
                n: int, runs_path: str | Path, *, top_k: int = SHOWN_PLANS,
                profile_out: str | Path | None = None,
                validate_run: ValidateRun | None = None, stack: Any = None,
                tp_across_nodes: bool = False) -> ClosedLoopResult:
    """Validate `n` plans of solve(model, cluster, job, pins) on this machine (the first and
    those that best separate its tie: choose_calibration_plans), fit
    cluster.gpu to the measured step times, solve again with the fitted profile, and return both
    rankings. Records are appended to `runs_path`; only this call's records are fitted. The
    fitted profile is written to `profile_out` when given. With `stack` (a StackPreset, as
    `solve --calibrate` passes) the fit is planner.calibrate.fewshot's: only the knobs the runs
    identify, at most runs - 1, pulled toward the preset; without it, every knob the runs move.
    Raises InfeasibleError when nothing fits, PlannerError when no validated run succeeded. A
    terminal shows the plans and each run's steps as progress bars; SIGTERM, SIGINT or SIGHUP
    during a run end its torchrun, append its record (ok false) and raise
    planner.interrupts.Interrupted."""
    from planner.search import solve

    if n < 1:
        raise PlannerError("--calibrate N needs N >= 1 plans to validate")
    if getattr(cluster, "pools", None):
        raise PlannerError("--calibrate fits one GPU kind's profile from runs on this machine; "
                           "not on a cluster of pools")
    runs_path = Path(runs_path)
    validate_run = validate_run or default_validate_run()
    # the candidates: the tie (or the top plans) beyond what is shown, so that the runs can
    # spread over it (choose_calibration_plans); even splits: the run records carry the
    # degrees, not the layers per stage
    candidates = solve(model, cluster, job, pins, top_k=candidate_count(n, top_k),
                       even_stages=True, tp_across_nodes=tp_across_nodes)
    plans_before = candidates[:top_k]
    already = _count_lines(runs_path)
    validated = [plan.layout for plan in choose_calibration_plans(candidates, n)]
    preflight = getattr(validate_run, "preflight", None)
    for layout in validated if preflight is not None else []:  # refuse before any run starts
        preflight(model, cluster, job, layout)
    with progress(f"validating {len(validated)} plans", len(validated)) as bar:
        for i, layout in enumerate(validated):
            bar.update(description=f"validating plan {i + 1}/{len(validated)}: {layout}")
            validate_run(model, cluster, job, layout, runs_path)
            bar.advance()
    runs, skipped = load_records(runs_path, cluster.gpu)
    runs = [r for r in runs if int(r.run_id.rsplit(":", 1)[1]) > already]
    skipped = [s for s in skipped if int(s.run_id.rsplit(":", 1)[1]) > already]
    if not runs:
        reasons = "; ".join(s.reason for s in skipped[:3]) or "no record written"
        raise PlannerError(f"no validated run succeeded ({reasons})")
    if stack is not None:
        from planner.calibrate.fewshot import few_shot_fit

        fit = few_shot_fit(cluster.gpu, runs, stack=stack, layouts=[r.layout for r in runs],
                           cross_validate=len(runs) >= 3)
    else:
        fit = calibrate(cluster.gpu, runs, layouts=[r.layout for r in runs],
                        cross_validate=len(runs) >= 3)
    fitted_cluster = cluster.model_copy(update={"gpu": fit.profile})
    plans_after = solve(model, fitted_cluster, job, pins, top_k=top_k, even_stages=True,
                        tp_across_nodes=tp_across_nodes)
    path = None
    if profile_out is not None:
        from planner.io import write_text_atomic

        path = Path(profile_out)
        write_text_atomic(path, profile_yaml(fit.profile))
    return ClosedLoopResult(list(plans_before), list(plans_after), fit, validated,
                            skipped, runs_path, path)


def _count_lines(path: Path) -> int:
    """Lines already in the file, so the loop fits only its own records (load_records names a
    record by its line)."""
    if not path.is_file():
        return 0
    return len(path.read_text(errors="replace").splitlines())  # the run ids' line numbers

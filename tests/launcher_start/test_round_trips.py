"""Export -> read back (`--config`) -> the same layout, on the start-up checks' plans (dense, MoE,
FSDP, CP, uneven splits): the degrees, knobs and the layers of every pipeline chunk."""

from __future__ import annotations

import pytest

from planner.costmodel.pipeline import stage_layer_counts
from planner.launchers import LaunchPlan, export_plan, read_config, resolve
from tests.launcher_start.plans import PLANS, launch_plan

KNOBS = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp")
SUFFIX = {"megatron": ".sh", "nemo": ".yaml", "torchtitan": ".py", "deepspeed": ".sh"}


def chunks(plan: LaunchPlan, stage_layers: tuple[int, ...]) -> list[int]:
    lay = plan.layout
    if stage_layers and lay.vpp == 1:
        return list(stage_layers)
    return stage_layer_counts(plan.model.num_hidden_layers, lay.pp * lay.vpp)


def round_trip(launcher: str, name: str, tmp_path, form: str | None = None):
    plan = launch_plan(name)
    out = export_plan(launcher, plan, form)
    path = tmp_path / f"plan{'.py' if form == 'python' else SUFFIX[launcher]}"
    path.write_text(out.text)
    got = resolve(read_config(path), plan.model.name, plan.cluster)
    return plan, got


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_round_trip_keeps_the_layout(name, tmp_path):
    plan, got = round_trip("megatron", name, tmp_path)
    assert {k: got.pins[k] for k in KNOBS} == {k: getattr(plan.layout, k) for k in KNOBS}
    assert chunks(plan, got.imported.stage_layers) == chunks(plan, plan.layout.stage_layers)
    assert got.job.global_batch == plan.job.global_batch
    assert got.job.seq_len == plan.job.seq_len


@pytest.mark.parametrize("form", ["python", "toml"])
@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_round_trip_keeps_the_layout(name, form, tmp_path):
    from tests.unit.test_launchers import expressible

    plan = launch_plan(name)
    job, layout = expressible("torchtitan", plan.job, plan.layout, form)
    plan = LaunchPlan(plan.model, plan.cluster, job, layout)
    out = export_plan("torchtitan", plan, form)
    path = tmp_path / f"plan.{'py' if form == 'python' else 'toml'}"
    path.write_text(out.text)
    got = resolve(read_config(path), plan.model.name, plan.cluster)
    assert {k: got.pins[k] for k in KNOBS} == {k: getattr(layout, k) for k in KNOBS}
    assert chunks(plan, got.imported.stage_layers) == chunks(plan, layout.stage_layers)
    assert got.job.global_batch == job.global_batch


@pytest.mark.parametrize("name", list(PLANS))
def test_deepspeed_round_trip_keeps_the_layout_it_can_run(name, tmp_path):
    from planner.launchers.deepspeed import layout_problems
    from tests.launcher_start.test_deepspeed_start import ds_plan

    if layout_problems(launch_plan(name).layout):
        pytest.skip("DeepSpeed's pipeline engine cannot run it: refused (test_deepspeed_start)")
    plan = ds_plan(name)
    path = tmp_path / "plan.sh"
    path.write_text(export_plan("deepspeed", plan).text)
    got = resolve(read_config(path), plan.model.name, plan.cluster)
    assert {k: got.pins[k] for k in KNOBS} == {k: getattr(plan.layout, k) for k in KNOBS}
    assert chunks(plan, got.imported.stage_layers) == chunks(plan, plan.layout.stage_layers)
    assert got.job.global_batch == plan.job.global_batch


@pytest.mark.parametrize("form", ["yaml", "python"])
@pytest.mark.parametrize("name", list(PLANS))
def test_nemo_round_trip_keeps_the_layout(name, form, tmp_path):
    plan = launch_plan(name)
    out = export_plan("nemo", plan, "python" if form == "python" else None)
    path = tmp_path / f"plan.{'py' if form == 'python' else 'yaml'}"
    path.write_text(out.text)
    got = resolve(read_config(path), plan.model.name, plan.cluster)
    assert {k: got.pins[k] for k in KNOBS} == {k: getattr(plan.layout, k) for k in KNOBS}
    assert chunks(plan, got.imported.stage_layers) == chunks(plan, plan.layout.stage_layers)
    assert got.job.global_batch == plan.job.global_batch

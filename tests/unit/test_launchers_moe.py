"""Megatron-LM export of the MoE knobs: expert-TP, the token dispatcher, the capacity factor,
each a pretrain_gpt.py option of the checked-in key list (arguments.py at d98e8a6)."""

from __future__ import annotations

from planner import JobSpec, Layout, load_model, parse_cluster
from planner.launchers import LaunchPlan, export_plan
from planner.launchers.common import unknown_keys
from planner.launchers.megatron import parse_args_text


def _args(job: JobSpec, layout: Layout) -> dict:
    plan = LaunchPlan(load_model("mixtral-8x7b"), parse_cluster("64xH100"), job, layout)
    text = export_plan("megatron", plan).text
    args = parse_args_text(text)
    mine = [k for k in args if "expert" in k or k.startswith("--moe-")]
    assert mine and unknown_keys("megatron_lm", mine) == []
    return args


def test_expert_tp_dispatcher_and_capacity_are_exported():
    job = JobSpec(seq_len=4096, global_batch=512, moe_dispatcher="deepep",
                  moe_capacity_factor=1.25)
    args = _args(job, Layout(tp=4, pp=2, dp=8, ep=8, etp=1, sp=True, zero=1))
    assert args["--expert-model-parallel-size"] == "8"
    assert args["--expert-tensor-parallel-size"] == "1"
    assert args["--moe-token-dispatcher-type"] == "flex"
    assert args["--moe-flex-dispatcher-backend"] == "deepep"
    assert float(args["--moe-expert-capacity-factor"]) == 1.25


def test_megatrons_defaults_stay_implicit():
    """etp = tp is Megatron's default (no flag); dropless has no capacity flag; alltoall is
    written (Megatron-Core's default dispatcher is allgather)."""
    args = _args(JobSpec(seq_len=4096, global_batch=512),
                 Layout(tp=2, pp=2, dp=16, ep=8, sp=True, zero=1))
    assert "--expert-tensor-parallel-size" not in args
    assert "--moe-expert-capacity-factor" not in args
    assert args["--moe-token-dispatcher-type"] == "alltoall"


def test_expert_tp_is_read_back():
    from planner.launchers import read_config

    job = JobSpec(seq_len=4096, global_batch=512)
    plan = LaunchPlan(load_model("mixtral-8x7b"), parse_cluster("64xH100"), job,
                      Layout(tp=4, pp=2, dp=8, ep=8, etp=1, sp=True, zero=1))
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.sh"
        path.write_text(export_plan("megatron", plan).text)
        imported = read_config(path)
    assert (imported.pins["ep"], imported.pins["etp"]) == (8, 1)


def test_routing_and_ep_overlap_are_exported():
    """force_balanced -> --moe-router-force-load-balancing; loss_free -> expert bias with no
    auxiliary loss; moe_ep_overlap -> --overlap-moe-expert-parallel-comm; aux_loss (Megatron's
    default load-balancing type) and no overlap write nothing."""
    lay = Layout(tp=1, pp=2, dp=32, ep=8, zero=1)
    forced = _args(JobSpec(seq_len=4096, global_batch=512, moe_routing="force_balanced",
                           moe_ep_overlap=True), lay)
    assert "--moe-router-force-load-balancing" in forced
    assert "--overlap-moe-expert-parallel-comm" in forced
    free = _args(JobSpec(seq_len=4096, global_batch=512, moe_routing="loss_free"), lay)
    assert "--moe-router-enable-expert-bias" in free
    assert free["--moe-router-load-balancing-type"] == "none"
    plain = _args(JobSpec(seq_len=4096, global_batch=512), lay)
    assert not {"--moe-router-force-load-balancing", "--overlap-moe-expert-parallel-comm",
                "--moe-router-enable-expert-bias"} & set(plain)

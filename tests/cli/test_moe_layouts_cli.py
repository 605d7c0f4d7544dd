"""Published Qwen3-235B-A22B expert layouts (Megatron-Core's MoE parallel folding) through
`planner estimate` and `planner solve`: accepted, with etp and the MoE recipe options."""

from __future__ import annotations

import json

import pytest

from tests.cli.inproc import invoke

# Qwen3-235B-A22B's config.json (Qwen/Qwen3-235B-A22B): 94 layers, hidden 4096, 64 query and
# 4 key/value heads of 128, 128 experts of 1536, top 8, vocab 151936
QWEN3_235B = """\
name: qwen3-235b-a22b-test
num_hidden_layers: 94
hidden_size: 4096
num_attention_heads: 64
num_key_value_heads: 4
head_dim: 128
intermediate_size: 12288
vocab_size: 151936
activation: swiglu
num_experts: 128
num_experts_per_tok: 8
moe_intermediate_size: 1536
seq_len: 4096
global_batch: 1024
"""


@pytest.fixture
def qwen3(tmp_path):
    path = tmp_path / "qwen3-235b.yaml"
    path.write_text(QWEN3_235B)
    return str(path)


@pytest.mark.parametrize("gpus, tp, pp, dp, ep", [(256, 2, 8, 16, 32), (64, 2, 8, 4, 8)])
def test_published_qwen3_layouts_are_accepted(qwen3, gpus, tp, pp, dp, ep):
    """tp 2 x dp 16 with ep 32 (and dp 4 with ep 8): ep exceeds dp*cp, so the experts fold
    over the TP ranks too, expert-TP 1 (etp*ep = 32 = tp*dp; Megatron's default etp = tp = 2
    would need 64). estimate takes etp 1, says so, and the plan's etp column is 1."""
    args = ["estimate", "--model", qwen3, "--cluster", f"{gpus}xH100", "--tp", str(tp),
            "--pp", str(pp), "--dp", str(dp), "--ep", str(ep)]
    result = invoke(*args, "--json")
    assert result.code == 0, result.stderr
    row = json.loads(result.stdout)
    assert (row["tp"], row["dp"], row["ep"], row["etp"]) == (tp, dp, ep, 1)
    assert "estimating etp=1" in result.stderr
    assert row["time_ep_comm_s"] > 0
    explicit = invoke(*args, "--etp", "1", "--json")
    assert explicit.code == 0 and "estimating" not in explicit.stderr
    assert json.loads(explicit.stdout)["step_time_s"] == row["step_time_s"]
    refused = invoke(*args, "--etp", "2")
    assert refused.code == 2
    assert refused.error_lines == [
        f"error: layout tp{tp}-pp{pp}-dp{dp}-ep{ep}-mbs1-z1-sel-sp is invalid: etp*ep = 2*{ep}"
        f" = {2 * ep} does not divide the tp*cp*dp = {tp * dp} ranks of a pipeline stage "
        "(Megatron-Core folds the expert groups over them)"]


def test_dispatcher_and_capacity_factor_options(qwen3):
    """The recipe options reach the cost model: a capacity factor of 1 caps the router's
    imbalance (less EP time and activation memory than dropless); DeepEP and allgather
    change the EP time; a bad value is one error line, exit 2."""
    base = ["estimate", "--model", qwen3, "--cluster", "64xH100", "--tp", "2", "--pp", "8",
            "--dp", "4", "--ep", "8", "--etp", "1", "--json"]
    rows = {}
    for name, extra in (("dropless", ()), ("cf1", ("--moe-capacity-factor", "1")),
                        ("deepep", ("--moe-dispatcher", "deepep")),
                        ("allgather", ("--moe-dispatcher", "allgather"))):
        result = invoke(*base, *extra)
        assert result.code == 0, result.stderr
        rows[name] = json.loads(result.stdout)
    assert rows["cf1"]["time_ep_comm_s"] < rows["dropless"]["time_ep_comm_s"]
    assert rows["cf1"]["mem_activations_gb"] < rows["dropless"]["mem_activations_gb"]
    assert rows["deepep"]["time_ep_comm_s"] != rows["dropless"]["time_ep_comm_s"]
    assert rows["allgather"]["time_ep_comm_s"] != rows["dropless"]["time_ep_comm_s"]
    bad = invoke(*base, "--moe-dispatcher", "nccl")
    assert bad.code == 2 and len(bad.error_lines) == 1
    assert bad.error_lines[0].startswith("error: Invalid value for '--moe-dispatcher'")


def test_solve_searches_expert_tp(qwen3):
    """solve on 64 H100 pinned to the published degrees with --etp 1 returns plans with etp 1
    and ep 8 (ep beyond dp = 4)."""
    result = invoke("solve", "--model", qwen3, "--cluster", "64xH100", "--tp", "2", "--dp", "4",
                    "--ep", "8", "--etp", "1", "--top", "3", "--json")
    assert result.code == 0, result.stderr
    plans = json.loads(result.stdout)
    assert plans and all((p["ep"], p["etp"], p["dp"]) == (8, 1, 4) for p in plans)

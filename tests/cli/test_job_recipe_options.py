"""--grad-dtype and --attention reach the cost model through `planner estimate`."""

import json
import subprocess
import sys

import pytest


def _estimate(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "planner", "estimate", "--model", "llama70b", "--cluster",
           "128xA100", "--tp", "8", "--pp", "4", "--zero", "1", "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_half_gradients_cost_three_quarters_of_megatron_fp32_grads_at_dp4():
    # Megatron's distributed optimizer keeps 4 B/param fp32 gradients; DeepSpeed ZeRO-1 keeps
    # 2 B/param half gradients plus 4 B/param for its own fp32 shard (1/dp of them): at dp = 4
    # that is (2 + 4/4) / 4 = 0.75 of the default, for the same local parameters.
    default, half = _estimate(), _estimate("--grad-dtype", "half")
    assert default["dp"] == 4
    assert half["mem_grads_gb"] / default["mem_grads_gb"] == pytest.approx(0.75)
    assert half["mem_weights_gb"] == default["mem_weights_gb"]


def test_unfused_attention_is_slower_and_a_bad_choice_exits_2():
    assert _estimate("--attention", "unfused")["time_compute_s"] > _estimate()["time_compute_s"]
    bad = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "llama70b",
                          "--cluster", "128xA100", "--tp", "8", "--attention", "sdpa"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

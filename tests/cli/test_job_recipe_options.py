"""--grad-dtype and --attention reach the cost model through `planner estimate`."""

import json
import os
import subprocess
import sys

import pytest


def _estimate(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "planner", "estimate", "--model", "llama70b", "--cluster",
           "128xA100", "--tp", "8", "--pp", "4", "--zero", "1", "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_half_gradients_cost_half_of_megatron_fp32_grads():
    # Megatron's distributed optimizer keeps 4 B/param fp32 gradients; DeepSpeed ZeRO-1 keeps
    # 2 B/param half gradients, and its fp32 shard (4 B / dp) exists only at the optimizer step,
    # after the activations are freed (memory.py's after-backward phase): 0.5 of the default.
    default, half = _estimate(), _estimate("--grad-dtype", "half")
    assert default["dp"] == 4
    assert half["mem_grads_gb"] / default["mem_grads_gb"] == pytest.approx(0.5)
    assert half["mem_weights_gb"] == default["mem_weights_gb"]


def test_unfused_attention_is_slower_and_a_bad_choice_exits_2():
    assert _estimate("--attention", "unfused")["time_compute_s"] > _estimate()["time_compute_s"]
    bad = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "llama70b",
                          "--cluster", "128xA100", "--tp", "8", "--attention", "sdpa"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_tp_comm_overlap_hides_most_tp_traffic_and_the_title_says_so():
    """70B at tp 8 on A100: the layer GEMMs outlast the SP collectives, so overlap leaves one
    chunk in 8 of each layer's traffic plus the unoverlapped embedding and head collectives."""
    plain, over = _estimate(), _estimate("--tp-comm-overlap")
    assert 0.1 < over["time_tp_comm_s"] / plain["time_tp_comm_s"] < 0.2
    assert over["time_compute_s"] == pytest.approx(plain["time_compute_s"])
    text = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "llama70b",
                           "--cluster", "128xA100", "--tp", "8", "--pp", "4",
                           "--tp-comm-overlap"], capture_output=True, text=True, check=True)
    assert "bf16, tp-comm-overlap" in text.stdout


def test_cpu_profile_title_says_fp32():
    """A gloo-measured profile ran its matmuls in fp32: the title must not claim bf16."""
    from pathlib import Path

    import planner.validate

    profile = Path(planner.validate.__file__).parent / "measured" / "cpu-gloo-2proc.yaml"
    text = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model",
                           "examples/tiny-llama.yaml", "--cluster", "1x2xcpu-gloo-2proc",
                           "--profile", str(profile), "--tp", "2", "--pp", "1"],
                          capture_output=True, text=True, check=True)
    assert "fp32 (CPU profile)" in text.stdout and "bf16" not in text.stdout.splitlines()[0]


def test_moe_routing_and_ep_overlap_reach_the_cost_model_and_the_title():
    """Mixtral 8x7B, ep 8 (one expert per rank): the default trained router's busiest rank
    carries 1 + 0.52 the mean copies; force-balanced routing 1 + sqrt(2 ln 8) x sqrt((7/8)(6/7)
    / 4096) = 1.028 (the hypergeometric spread of 4096 copies a rank sends: mbs 1 x 4096
    tokens x top-2 / tp 2), so the bandwidth part of the all-to-all shrinks 1.52 / 1.028 =
    1.48x and its latency part not at all: a ratio between 1.45 and 1.52 (measured 1.46); the
    EP overlap hides the rest behind compute; the table title names both; a bad routing exits
    2 with one line."""
    def moe(*extra: str) -> tuple[dict, str]:
        base = [sys.executable, "-m", "planner", "estimate", "--model", "mixtral-8x7b",
                "--cluster", "64xH100", "--tp", "2", "--pp", "1", "--ep", "8", "--mbs", "1",
                "--seq-len", "4096", "--global-batch", "512", *extra]
        js = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True,
                                       check=True).stdout)
        # wide enough for the whole title whatever width the test runner's terminal passes on
        wide = {**os.environ, "COLUMNS": "200"}
        title = subprocess.run(base, capture_output=True, text=True, check=True, env=wide).stdout
        return js, title.splitlines()[0]

    (plain, t0), (forced, t1) = moe(), moe("--moe-routing", "force_balanced")
    ratio = plain["time_ep_comm_s"] / forced["time_ep_comm_s"]
    assert 1.45 < ratio < 1.52 and "routing" not in t0 and "force-balanced routing" in t1
    over, t2 = moe("--moe-routing", "force_balanced", "--moe-ep-overlap")
    assert over["time_ep_comm_s"] == 0.0 and "EP overlap" in t2  # EP shorter than compute
    bad = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "mixtral-8x7b",
                          "--cluster", "64xH100", "--moe-routing", "sinkhorn"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

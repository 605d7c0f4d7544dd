"""Training logs -> MeasuredRun (planner.measured.logs). The excerpts in tests/data/launchers are
written in each launcher's own print format (module docstring of planner.measured.logs names the
source lines); the expected values are read off the excerpts by hand."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.layout import Layout
from planner.measured.logs import SKIP_LOGGED, read_log
from planner.measured.runs import run_from_log
from planner.registry import load_gpu

DATA = Path(__file__).resolve().parents[1] / "data" / "launchers"


def test_megatron_log_layout_model_and_median_of_steady_steps():
    run = run_from_log(DATA / "megatron_llama2_7b.log", load_gpu("H100"))
    # iterations 4..10 of the excerpt (1-3: start-up), milliseconds
    steady = [4617.6, 4629.4, 4623.5, 4635.4, 4625.0, 4616.5, 4630.6]
    assert run.measured_step_time_s == pytest.approx(statistics.median(steady) / 1000)
    assert run.measured_step_time_s == pytest.approx(4.625)
    assert run.model.name == "llama2-7b"  # the argument block's shape is the built-in's
    assert run.layout == Layout(tp=2, pp=2, dp=2, mbs=1, zero=1, recompute="selective", sp=True)
    assert (run.job.seq_len, run.job.global_batch, run.job.precision) == (4096, 64, "bf16")
    assert run.job.grad_overlap and not run.job.tp_comm_overlap
    assert run.cluster.num_gpus == 8
    assert run.extra["framework"] == "Megatron-LM"
    assert run.extra["steady_steps"] == 7 and run.extra["logged_steps"] == 10


def test_megatron_bridge_log_reads_the_printed_config():
    run = run_from_log(DATA / "megatron_bridge_llama3_8b.log", load_gpu("H100"))
    steady = [12891.8, 12927.9, 12907.3, 12878.5, 12943.9, 12910.3, 12897.0]
    assert run.measured_step_time_s == pytest.approx(statistics.median(steady) / 1000)
    assert run.model.name == "llama3-8b"
    assert run.layout == Layout(tp=1, pp=1, dp=4, cp=2, mbs=1, zero=1, recompute="none")
    assert run.job.grad_dtype == "half"  # ddp.grad_reduce_in_fp32 false
    assert run.job.attention == "cudnn"  # attention_backend null: TE picks cuDNN fused
    assert run.cluster.num_gpus == 8  # WORLD_SIZE=8


def test_torchtitan_log_step_time_from_tokens_per_second():
    run = run_from_log(DATA / "torchtitan_llama3_8b.log", load_gpu("H100"))
    # 65536 tokens per step on 8 GPUs; steady tps (steps 4-10) median 7008 tokens/s/GPU
    assert run.measured_step_time_s == pytest.approx(65536 / (7008 * 8))
    assert run.model.name == "llama3-8b"
    assert run.layout == Layout(tp=1, pp=1, dp=8, mbs=1, zero=3, recompute="selective")
    assert (run.job.seq_len, run.job.global_batch) == (8192, 8)


def test_too_short_a_log_says_so(tmp_path):
    text = (DATA / "megatron_llama2_7b.log").read_text().splitlines()
    short = [line for line in text if "iteration        3/" not in line and
             not any(f"iteration {i:8d}/" in line for i in range(3, 11))]
    path = tmp_path / "short.log"
    path.write_text("\n".join(short) + "\n")
    with pytest.raises(SpecError, match=f"none left after skipping the first {SKIP_LOGGED}"):
        read_log(path)


def test_a_file_that_is_no_log(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("nothing here\n")
    with pytest.raises(SpecError, match="not a training log"):
        read_log(path)


def test_torchtitan_v022_log_of_the_405b_toml_preset():
    # torchtitan <= v0.2.2 prints "local batch size L, global batch size B, ..." and
    # "Building llama3 405Bwith {...}" (train.py at 9810191bbb03^); the layout is its 405B TOML
    run = run_from_log(DATA / "torchtitan_v022_llama3_405b.log", load_gpu("H100"))
    # 32 x 8192 tokens per step on 16 x 8 = 128 GPUs; steady tps (steps 4-10) median 181
    assert run.measured_step_time_s == pytest.approx(32 * 8192 / (181 * 128))
    assert run.model.name == "llama3.1-405b"
    assert run.layout == Layout(tp=8, pp=1, dp=16, mbs=2, zero=3, recompute="full", sp=True)
    assert run.job.precision == "fp8"


def test_megatron_deepspeed_log_takes_deepspeeds_recipe():
    # Megatron-DeepSpeed prints the same argument block (megatron/arguments.py _print_args at
    # 4efb479d5317) and iteration line (megatron/training.py)
    run = run_from_log(DATA / "megatron_deepspeed_llama2_7b.log", load_gpu("A100"))
    steady = [5903.8, 5921.6, 5898.2, 5915.0, 5909.4]  # iterations 4-8, ms
    assert run.measured_step_time_s == pytest.approx(statistics.median(steady) / 1000)
    assert run.extra["framework"] == "Megatron-DeepSpeed"
    assert run.model.name == "llama2-7b"
    assert run.layout == Layout(tp=2, pp=2, dp=4, mbs=4, zero=1, recompute="full", sp=False)
    # DeepSpeed's pipeline engine: 16-bit gradients reduced after the backward, blocking sends
    assert (run.job.grad_dtype, run.job.grad_overlap, run.job.p2p_overlap) == ("half", False,
                                                                               False)
    assert run.job.attention == "flash"  # --use-flash-attn-v2
    assert run.cluster.num_gpus == 16


def test_a_log_faster_than_the_gpus_peak_is_skipped_like_a_table_row(tmp_path):
    import re

    from planner.measured.runs import load_runs

    text = (DATA / "megatron_llama2_7b.log").read_text()
    gpu = load_gpu("A100")
    runs, skipped = load_runs(DATA / "megatron_llama2_7b.log", gpu)
    assert len(runs) == 1 and not skipped
    step = runs[0].measured_step_time_s
    # the same log with every step 20x faster: an MFU far above 1 on A100s
    fast = re.sub(r"elapsed time per iteration \(ms\): ([\d.]+)",
                  lambda m: f"elapsed time per iteration (ms): {float(m.group(1)) / 20:.1f}",
                  text)
    path = tmp_path / "fast.log"
    path.write_text(fast)
    runs, skipped = load_runs(path, gpu)
    assert runs == [] and len(skipped) == 1
    assert "MFU" in skipped[0].reason and "> 1" in skipped[0].reason
    assert step > 0

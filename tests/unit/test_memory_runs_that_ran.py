"""Runs that ran are not refused (issue 19): NVIDIA's tuned Llama 3.1 405B H100 recipes (dgxc rows
594/600/684/699, no recompute) fit once their gradients are the 16-bit ones the releases' NeMo
recipes keep, term by term by hand; the runs-that-ran check of benchmarks/memory.py."""

from __future__ import annotations

import pandas as pd
import pytest
from bench_fixtures import load_bench

from planner.costmodel import estimate, memory_status
from planner.layout import Layout
from planner.measured.runs import PUBLISHED_RUNS_CSV, grad_recipe_of, load_table
from planner.specs import JobSpec

GIB = 2**30


@pytest.fixture(scope="module")
def runs():
    loaded, _ = load_table(PUBLISHED_RUNS_CSV)
    return {r.run_id: r for r in loaded}


def test_notes_state_16_bit_gradients():
    base = JobSpec(seq_len=8192, global_batch=256)
    assert grad_recipe_of(base, "Recipe: gradients in bf16 (...)").grad_dtype == "half"
    assert grad_recipe_of(base, "gradients reduced in fp32") == base
    assert grad_recipe_of(base, None) == base


def test_dgxc_nemo_rows_keep_the_gradients_their_release_kept(runs):
    """NeMo launcher YAMLs (grad_sync_dtype bf16) and NeMo 2 performance recipes
    (grad_reduce_in_fp32 False): half. Nemotron4 15B of v25.02-v25.03 runs
    mcore_distributed_optim without grad_sync_dtype, and MaxText is not NeMo: unchanged."""
    table = pd.read_csv(PUBLISHED_RUNS_CSV)
    dgxc = table[table.source_id == "dgxc_benchmarking"]
    for row_id in (594, 600, 684, 699):
        assert runs[f"dgxc_benchmarking:{row_id}"].job.grad_dtype == "half"
    mcore_15b = dgxc[dgxc.source.str.contains("README_15b.md @ v25.02-v25.03", regex=False)]
    maxtext = dgxc[dgxc.framework.str.contains("MaxText")]
    assert len(mcore_15b) == 16 and len(maxtext) > 0
    for row_id in (*mcore_15b.row_id, *maxtext.row_id):
        run = runs.get(f"dgxc_benchmarking:{row_id}")
        assert run is None or run.job.grad_dtype == "auto"


def test_llama_405b_recipe_fits_term_by_term(runs):
    """Row 684 (512 H100, tp8 pp8 cp2 vpp8, mbs 1, gbs 256, seq 8192, no recompute) by hand:
    - layers per stage 15, 16 x 6, 15 (126 layers, embedding and loss counted as a layer each);
      the peak is stage 1, 16 layers of h=16384, 8 KV heads of 128, SwiGLU ffn 53248:
      2 h^2 (Q, O) + 2 h (8 x 128) (K, V) + 3 h ffn + 2 h (norms) parameters per layer, / tp 8;
    - 16-bit gradients: 2 B per parameter (was 4: an fp32 buffer);
    - in flight: Megatron-Core's interleaved warmup (megatron/core/pipeline_parallel/
      schedules.py @ ee6737d, the Megatron-LM commit of dgxc v25.04: (pp - rank - 1) x 2 +
      (vpp - 1) x microbatch_group_size_per_vp_stage, which model_parallel_config.py defaults to
      pp), plus the one forward before the first backward: (2 x 6 + 7 x 8 + 1) chunks = 69 of
      the 8 chunks a stage has."""
    run = runs["dgxc_benchmarking:684"]
    layout = Layout(tp=8, pp=8, dp=4, cp=2, vpp=8, mbs=1, zero=1, recompute="none", sp=True)
    est = estimate(run.model, run.cluster, run.job, layout)
    h, kv_dim, ffn = 16384, 8 * 128, 53248
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * ffn + 2 * h
    assert per_layer == 3_187_703_808
    assert est.peak_stage == 1
    assert est.mem_grads_gb == pytest.approx(16 * per_layer / 8 * 2 / GIB, rel=1e-6)
    assert est.mem_weights_gb == pytest.approx(16 * per_layer / 8 * 2 / GIB, rel=1e-6)
    warmup = (8 - 1 - 1) * 2 + (8 - 1) * 8
    assert est.in_flight == pytest.approx((warmup + 1) / 8)  # 8.625
    assert est.peak_mem_gb < est.mem_capacity_gb  # 67.1 GiB against 75.9: was 78.9
    assert memory_status(est) == "fits"


@pytest.mark.parametrize("row_id", [594, 600, 684, 699])
def test_405b_rows_run_without_recompute_in_the_accuracy_benchmark(runs, row_id):
    """accuracy.py's predictor searches the knobs a row leaves open: with the recipe's 16-bit
    gradients the fastest layout that fits keeps the recipe's no recompute (it fell back to
    full recompute and predicted these rows 33-45% slow)."""
    run = runs[f"dgxc_benchmarking:{row_id}"]
    out = load_bench("accuracy").Predictor().row(run, run.cluster.gpu)
    assert out["layout"].recompute == "none"
    assert abs(out["step_time_s"] / run.measured_step_time_s - 1) < 0.15


def test_fit_check_counts_the_runs_that_ran(runs):
    """The check's statuses follow the memory band: no dgxc Llama 3.1 405B row flagged; every
    BLOOM and DLPerf run (recompute stated, nvidia-smi readings) fits; every dense run that ran
    is checked or counted unchecked (13 today: vpp blank with pp > 1)."""
    bench = load_bench("memory")
    frame, unchecked = bench.fit_check()
    ran = [r for r in runs.values() if not r.oom and not r.model.is_moe]
    blank_vpp = [r for r in ran if r.pins.get("pp", 1) > 1 and "vpp" not in r.pins]
    assert unchecked == len(blank_vpp) and len(frame) + unchecked == len(ran)
    llama405 = frame[frame["run"].isin([f"dgxc_benchmarking:{i}" for i in (594, 600, 684, 699)])]
    assert len(llama405) == 4 and not llama405["flagged"].any()
    assert (llama405["needs"] == "none").all()
    summary = bench.fit_summary(frame).set_index("source")
    for source in ("bloom_prequel", "dlperf_megatron_v100"):
        assert summary.loc[source, "flagged"] == 0
    assert summary.loc["ALL", "flagged"] == int(frame["flagged"].sum())
    over = frame["status"].isin(["over", "refused"])
    assert (frame.loc[over, "peak_gb"] > frame.loc[over, "capacity_gb"]).all()
    # no run that ran is refused at what its row states (issue 19 section 4's target)
    assert summary.loc["ALL", "contradicted"] == 0


def test_fit_check_contradicts_a_run_no_recompute_fits(tmp_path):
    """A row that could not have run: NVIDIA's 405B recipe (row 684: 512 H100, seq 8192, cp 2,
    recompute unstated) restated without model parallelism, tp 1 pp 1 dp 256 with ZeRO-1: every
    GPU holds the 16-bit weights of all 405B parameters (2 B x 4.06e11 = 756 GiB) against 80 GB,
    at any recompute: contradicted, needs '(none fits)'."""
    table = pd.read_csv(PUBLISHED_RUNS_CSV)
    row = table[(table.source_id == "dgxc_benchmarking") & (table.row_id == 684)].copy()
    row[["tp", "pp", "dp", "vpp", "zero_or_fsdp"]] = [1, 1, 256, 1, "ZeRO-1"]
    path = tmp_path / "runs.csv"
    row.to_csv(path, index=False)
    frame, _ = load_bench("memory").fit_check(path)
    assert len(frame) == 1
    assert frame["mem_weights_gb"].iloc[0] > 700
    assert frame["needs"].iloc[0] == "(none fits)" and bool(frame["contradicted"].iloc[0])

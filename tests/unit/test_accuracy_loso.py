"""benchmarks/accuracy.py's leave-one-source-out pieces: the measured values a refit starts from
(docs/hardware.md 2.1), the flat 50%-of-peak baseline by hand, and the headline table's
statistics against numpy; benchmarks/recipes.py's recipe groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bench_fixtures import load_bench

acc = load_bench("accuracy")


def test_unfitted_profiles_are_the_measured_values():
    """The A100's cuBLASLt sweep top 256.5 of 312 TFLOP/s and FlashAttention-2's 179.5 / 312;
    the H100's FP8 sweep shape scaled to BF16 MAMF (1382.2 / 1402.6 x 0.803); no layer overhead
    (docs/hardware.md 2.1, the profiles' sources)."""
    base = acc.unfitted_profiles()
    a100 = base["A100-SXM4-80GB"]
    assert a100.gemm_efficiency.points[-1][1] == pytest.approx(256.5 / 312, rel=1e-3)
    assert a100.attention_efficiency == pytest.approx(179.5 / 312, abs=1e-3)
    assert a100.layer_overhead_us == 0.0
    h100 = base["H100-SXM"]
    assert h100.gemm_efficiency.points[-1][1] == pytest.approx(1382.2 / 1402.6 * 0.803, rel=1e-3)
    assert h100.fused_attention_efficiency == pytest.approx(0.75)
    # the FP8 curves at their own sweep's top (a fit moves them with gemm_scale)
    assert h100.fp8_gemm_efficiency.points[-1][1] == pytest.approx(1382.2 / 1979, rel=1e-3)
    assert base["GB200-NVL72"].fp8_gemm_efficiency.points[-1][1] == pytest.approx(
        2906.9 / 5000, rel=1e-3)
    # the sibling takes its big part's revert: the same ratio on its own curve
    from planner.registry import load_gpu

    a40 = load_gpu("A100-SXM4-40GB")
    ratio = (256.5 / 312) / load_gpu("A100-SXM4-80GB").gemm_efficiency.points[-1][1]
    assert base["A100-SXM4-40GB"].gemm_efficiency.points[-1][1] == pytest.approx(
        min(1.0, a40.gemm_efficiency.points[-1][1] * ratio), rel=1e-3)


@pytest.mark.parametrize(("gpu", "peak16", "peak8", "mamf16", "mamf8"), [
    ("H100-SXM", 989, 1979, 794.5, 1402.6), ("GB200-NVL72", 2500, 5000, 1822.0, 3615.6)])
def test_a_fitted_gemm_scale_keeps_the_measured_fp8_over_bf16_ratio(gpu, peak16, peak8, mamf16,
                                                                     mamf8):
    """FP8 over BF16 GEMM throughput at the curves' top is the chip's measured MAMF ratio
    (stas00/ml-engineering, docs/hardware.md 2.1: H100 1402.6 / 794.5 = 1.77, GB200
    3615.6 / 1822 = 1.98) before a fit and after any GEMM scale (0.733: H100 fitted on
    llm-foundry's BF16 runs, dgxc held out)."""
    from planner.specs.adjust import apply_values

    def ratio(p):
        return p.fp8_gemm_efficiency.points[-1][1] * peak8 / (
            p.gemm_efficiency.points[-1][1] * peak16)

    base = acc.unfitted_profiles()[gpu]
    assert ratio(base) == pytest.approx(mamf8 / mamf16, rel=2e-3)
    assert ratio(apply_values(base, {"gemm_scale": 0.733})) == pytest.approx(mamf8 / mamf16,
                                                                             rel=2e-3)


def test_flat_baseline_by_hand():
    """llm-foundry MPT-7b on 8 A100 (row 317): the planner's FLOP count
    (model_flops_per_step), at half of 8 x 312 TFLOP/s."""
    from planner.costmodel.compute import model_flops_per_step
    from planner.measured.runs import load_table

    runs, _ = load_table()
    run = next(r for r in runs if r.run_id == "llmfoundry_mpt_bench:317")
    flops = model_flops_per_step(run.model, 2048, 96)
    assert acc.flat_baseline(run) == pytest.approx(flops / (0.5 * 312e12 * 8), rel=1e-9)
    # the run's own MFU is 64.1%: the flat model is 0.641 / 0.5 - 1 = +28% too slow on it
    assert acc.flat_baseline(run) / run.measured_step_time_s - 1 == pytest.approx(
        0.6414 / 0.5 - 1, abs=0.01)


def test_loso_table_statistics():
    per_run = pd.DataFrame({
        "source": ["a", "a", "a", "b"], "stock": [0.1, -0.2, 0.3, -0.05],
        "named": [0.0, 0.1, -0.1, 0.02], "flat50": [0.5, 0.5, -0.5, 0.2]})
    table = acc.loso_table(per_run).set_index("source")
    assert table.loc["a", "stock_median"] == pytest.approx(0.2)
    assert table.loc["a", "stock_signed"] == pytest.approx(0.1)
    assert table.loc["a", "stock_p90"] == pytest.approx(np.quantile([0.1, 0.2, 0.3], 0.9))
    assert table.loc["ALL", "runs"] == 4
    assert table.loc["ALL", "named_median"] == pytest.approx(np.median([0.0, 0.1, 0.1, 0.02]))


def test_recipe_groups_count_duplicates_once():
    """dgxc measured the same job and layout on several containers: one recipe, the median."""
    rec = load_bench("recipes")
    from planner.measured.runs import load_table

    runs, _ = load_table()
    groups = rec.recipe_groups(runs, ("dgxc_benchmarking",))
    timed = [r for r in runs if r.source_id == "dgxc_benchmarking" and r.measured_step_time_s
             and not r.model.is_moe]
    assert sum(n for _, _, n in groups) == len(timed)
    assert len(groups) < len(timed)
    for run, measured, n in groups:
        same = [r.measured_step_time_s for r in timed
                if r.model == run.model and r.cluster.num_gpus == run.cluster.num_gpus
                and r.cluster.gpu.name == run.cluster.gpu.name and r.job == run.job
                and r.pins == run.pins and r.stack == run.stack]
        assert n == len(same) and measured == pytest.approx(float(np.median(same)))


def test_tuning_knobs_budget_by_hand() -> None:
    """n runs fit the first n // 20 knobs of (gemm_scale, attention_efficiency,
    fused_attention_efficiency, layer_overhead_us); the fused slot is taken on a GPU without
    that class too (it fits nothing there), so 60 A100 runs fit 2 knobs and 60 H100 runs 3."""
    from planner.registry import load_gpu

    a100, h100 = load_gpu("A100"), load_gpu("H100")
    assert a100.fused_attention_efficiency is None and h100.fused_attention_efficiency
    assert acc.tuning_knobs(a100, acc.TUNE_KNOBS, 60) == ["gemm_scale", "attention_efficiency"]
    assert acc.tuning_knobs(h100, acc.TUNE_KNOBS, 60) == [
        "gemm_scale", "attention_efficiency", "fused_attention_efficiency"]
    assert acc.tuning_knobs(a100, acc.TUNE_KNOBS, 80) == [
        "gemm_scale", "attention_efficiency", "layer_overhead_us"]
    assert acc.tuning_knobs(a100, acc.TUNE_KNOBS, 5) == ["gemm_scale"]


def test_an_attention_rate_needs_its_own_runs_by_hand() -> None:
    """An attention rate is fitted only where 20 (RUNS_PER_KNOB) of the runs use a kernel it
    times: 229 H100 runs of which 13 flash (PaxML) and 216 cudnn fit the GEMM scale, the fused
    rate and the layer overhead, not attention_efficiency; with 77 triton runs more it is
    fitted. On the A100 (no fused rate) cudnn runs count for attention_efficiency."""
    from planner.registry import load_gpu

    a100, h100 = load_gpu("A100"), load_gpu("H100")
    assert acc.tuning_knobs(h100, acc.TUNE_KNOBS, 229, {"flash": 13, "cudnn": 216}) == [
        "gemm_scale", "fused_attention_efficiency", "layer_overhead_us"]
    assert acc.tuning_knobs(h100, acc.TUNE_KNOBS, 306,
                            {"flash": 13, "cudnn": 216, "triton": 77}) == list(acc.TUNE_KNOBS)
    assert acc.tuning_knobs(h100, acc.TUNE_KNOBS, 229, {"flash": 13, "cudnn": 19}) == [
        "gemm_scale", "layer_overhead_us"]
    assert acc.tuning_knobs(a100, acc.TUNE_KNOBS, 80, {"cudnn": 80}) == [
        "gemm_scale", "attention_efficiency", "layer_overhead_us"]
    assert acc.tuning_knobs(a100, acc.TUNE_KNOBS, 80, {"unfused": 80}) == [
        "gemm_scale", "layer_overhead_us"]


def test_stack_fits_round_trip_and_refuse_other_code(tmp_path, monkeypatch):
    """bands.py --stack-fits reads back exactly the presets accuracy.py --save-stack-fits wrote
    (a preset with per-class factors set, fitted and fitted without a source), and refuses a
    file whose key is not this checkout's with one PlannerError line."""
    from planner.errors import PlannerError
    from planner.stacks import StackFactors, resolve_stack

    nemo = resolve_stack("nemo").model_copy(update={
        "gpu_factors": {"B200/GB200": StackFactors(gemm_scale=1.25, layer_overhead_us=500.0)}})
    fsdp = resolve_stack("pytorch-fsdp")
    path = tmp_path / "fits.json"
    acc.save_stack_fits(path, {"nemo": nemo, "pytorch-fsdp": fsdp}, {("nemo", "src_a"): fsdp})
    fitted, without = acc.load_stack_fits(path)
    assert fitted["nemo"] == nemo and fitted["pytorch-fsdp"] == fsdp
    assert fitted["nemo"].gpu_factors["B200/GB200"].layer_overhead_us == 500.0
    assert without == {("nemo", "src_a"): fsdp}
    monkeypatch.setattr(acc, "stack_fit_key", lambda: "0" * 64)
    with pytest.raises(PlannerError, match="other code or data"):
        acc.load_stack_fits(path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(PlannerError, match="not a stack-fits file"):
        acc.load_stack_fits(tmp_path / "bad.json")

"""A stack's factors hold for the precisions of the runs they were fitted on (issue 19: nemo
fitted on Megatron-Bridge's FP8-only runs carried its layer pass to dgxc's BF16 runs, +21.9%
held out). A job of a precision kind the fit never saw gets the stock prediction; a preset
written before the field holds for every precision, as it did."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import yaml

from planner.calibrate.fit import predict_step_times
from planner.calibrate.stackfit import fit_stack_factors, precisions_of, predict_with
from planner.costmodel import estimate
from planner.layout import Layout
from planner.registry import load_gpu
from planner.specs import ClusterSpec, JobSpec, ModelSpec
from planner.stacks import StackFactors, StackPreset, precision_kind, resolve_stack

LAYERS, GBS = 4, 16
LAYOUT = Layout(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none")
EXTRA_US = 1000.0  # the preset's layer pass over the profile's, us


def _tiny() -> ModelSpec:
    return ModelSpec(name="t", num_hidden_layers=LAYERS, hidden_size=1024, num_attention_heads=8,
                     num_key_value_heads=8, intermediate_size=4096, vocab_size=32000,
                     seq_len=1024, global_batch=GBS, activation="gelu")


def _step(preset: StackPreset, precision: str) -> float:
    gpu = load_gpu("H100-SXM")
    cluster = ClusterSpec(gpu=gpu, num_nodes=1, gpus_per_node=1)
    cluster = preset.cluster_for(cluster, precision)
    job = JobSpec(seq_len=1024, global_batch=GBS, precision=precision)
    return estimate(_tiny(), cluster, job, LAYOUT).step_time_s


def _fp8_only(gemm_scale: float = 1.0) -> StackPreset:
    gpu = load_gpu("H100-SXM")
    return resolve_stack("nemo").model_copy(update={"gpu_factors": {}, "factors": StackFactors(
        gemm_scale=gemm_scale, layer_overhead_us=gpu.layer_overhead_us + EXTRA_US,
        precisions=["fp8"])})


def test_precision_kinds():
    assert [precision_kind(p) for p in ("bf16", "fp16", "fp8")] == ["16-bit", "16-bit", "fp8"]


def test_fp8_fit_gives_bf16_the_stock_prediction_and_fp8_the_factored_one():
    """A layer pass 1 ms longer than the profile's, on one stage with no recompute, adds
    layers x (1 forward + 2 backward passes) x micro-batches = 4 x 3 x 16 x 1 ms = 0.192 s; the
    fit saw FP8 runs only, so a BF16 job is predicted exactly as with stock factors."""
    stock = resolve_stack("nemo").model_copy(update={"factors": StackFactors(),
                                                     "gpu_factors": {}})
    fp8 = _fp8_only()
    assert _step(fp8, "bf16") == _step(stock, "bf16")
    assert _step(fp8, "fp8") - _step(stock, "fp8") == pytest.approx(
        LAYERS * 3 * GBS * EXTRA_US * 1e-6, rel=1e-9)
    # fp16 runs bf16's GEMM path: a factor fitted on fp16 runs holds for a bf16 job, not fp8
    half = stock.model_copy(update={"factors": fp8.factors.model_copy(
        update={"precisions": ["fp16"]})})
    assert _step(half, "bf16") - _step(stock, "bf16") == pytest.approx(
        LAYERS * 3 * GBS * EXTRA_US * 1e-6, rel=1e-9)
    assert _step(half, "fp8") == _step(stock, "fp8")


def test_the_gemm_scale_reaches_the_fp8_curve_only_for_fp8_jobs():
    gpu = load_gpu("H100-SXM")
    preset = _fp8_only(gemm_scale=0.5)
    assert preset.apply(gpu, "bf16") is gpu  # stock factors leave the profile as it is
    on8 = preset.apply(gpu, "fp8")
    assert [y for _, y in on8.fp8_gemm_efficiency.points] == pytest.approx(
        [0.5 * y for _, y in gpu.fp8_gemm_efficiency.points])
    assert on8.layer_overhead_us == pytest.approx(gpu.layer_overhead_us + EXTRA_US)
    # the runs of one calibration: the factors start it when they hold for any of them
    assert preset.factors_for("H100-SXM", False, ["fp8", "fp8"]) == preset.factors
    assert preset.factors_for("H100-SXM", False, ["bf16", "fp8"]) == preset.factors
    assert preset.factors_for("H100-SXM", False, ["bf16", "fp16"]) == StackFactors()
    assert preset.factors_for("H100-SXM", False) == preset.factors  # None: any precision


def test_a_gpu_class_factor_keeps_its_own_precisions():
    """GB300 factors fitted on FP8 runs (Megatron-Bridge's) are stock for a GB300 BF16 job even
    where the transferable factors saw both kinds."""
    gb300 = StackFactors(gemm_scale=1.8, layer_overhead_us=1240.0, precisions=["fp8"])
    preset = resolve_stack("nemo").model_copy(update={
        "factors": StackFactors(gemm_scale=1.1, layer_overhead_us=800.0,
                                precisions=["bf16", "fp8"]),
        "gpu_factors": {"GB300": gb300}})
    assert preset.factors_for("GB300-NVL72", True, "fp8") == gb300
    assert preset.factors_for("GB300-NVL72", True, "bf16") == StackFactors()
    assert preset.factors_for("H100-SXM", False, "bf16") == preset.factors


def test_a_preset_file_without_the_field_holds_for_every_precision():
    """An old preset file (no `precisions` under factors) loads and applies its factors to BF16
    and FP8 jobs alike, as before the field."""
    data = resolve_stack("nemo").model_dump(mode="json", exclude_none=True)
    data["factors"] = {"gemm_scale": 1.0, "layer_overhead_us":
                       load_gpu("H100-SXM").layer_overhead_us + EXTRA_US}
    data["gpu_factors"] = {}
    old = StackPreset.model_validate(yaml.safe_load(yaml.safe_dump(data)))
    assert old.factors.precisions is None
    stock = old.model_copy(update={"factors": StackFactors()})
    for precision in ("bf16", "fp8"):
        assert _step(old, precision) - _step(stock, precision) == pytest.approx(
            LAYERS * 3 * GBS * EXTRA_US * 1e-6, rel=1e-9)


@cache
def _fsdp_h100_runs(precision: str) -> tuple:
    """llm-foundry's H100 runs of one precision with a stated layout (7 are FP8)."""
    from planner.measured.runs import load_table

    runs, _ = load_table()
    return tuple(r for r in runs if r.source_id == "llmfoundry_mpt_bench"
                 and r.cluster.gpu.name == "H100-SXM" and r.job.precision == precision
                 and r.measured_step_time_s and r.layout is not None)


def test_a_fit_records_its_precisions_and_a_written_preset_keeps_them():
    """pytorch-fsdp fitted on llm-foundry's FP8 H100 runs only: the factors record fp8, move
    the FP8 predictions, and leave the BF16 runs exactly at the stock prediction."""
    runs, bf16 = list(_fsdp_h100_runs("fp8")), list(_fsdp_h100_runs("bf16"))[::7]
    assert len(runs) >= 5 and len(bf16) >= 5 and precisions_of(runs) == ["fp8"]
    stock = resolve_stack("pytorch-fsdp").model_copy(update={"factors": StackFactors(),
                                                             "gpu_factors": {}})
    fitted = fit_stack_factors(stock, runs, [r.layout for r in runs])
    assert fitted.factors.precisions == ["fp8"]
    assert fitted.factors.model_copy(update={"precisions": None}) != StackFactors()
    gpu = runs[0].cluster.gpu
    layouts = [r.layout for r in bf16]
    assert np.array_equal(predict_with(fitted, bf16, layouts),
                          predict_step_times(gpu, bf16, layouts))
    layouts = [r.layout for r in runs]
    assert not np.allclose(predict_with(fitted, runs, layouts),
                           predict_step_times(gpu, runs, layouts))
    # what accuracy.py --write-stacks writes reads back with the field
    text = yaml.safe_dump(fitted.model_dump(mode="json", exclude_none=True), sort_keys=False)
    assert "precisions:\n  - fp8" in text
    assert StackPreset.model_validate(yaml.safe_load(text)).factors == fitted.factors


def test_the_cli_inputs_apply_the_factors_for_the_jobs_precision():
    """load_inputs (solve, estimate, explain, report) resolves the job's precision before the
    stack's factors: --precision bf16 keeps the stock H100 profile, fp8 gets the layer pass."""
    from planner.cli.options import PrecisionChoice, load_inputs

    gpu = load_gpu("H100-SXM")
    for choice, layer_us in ((PrecisionChoice.bf16, gpu.layer_overhead_us),
                             (PrecisionChoice.fp8, gpu.layer_overhead_us + EXTRA_US)):
        _model, cluster, job = load_inputs("llama8b", "8xH100", None, None, None,
                                           precision=choice, stack=_fp8_only())
        assert job.precision == choice.value
        assert cluster.gpu.layer_overhead_us == pytest.approx(layer_us)


def test_planner_stacks_marks_factors_of_one_kind():
    from planner.cli.stacks import _only

    assert _only(StackFactors(gemm_scale=1.8, precisions=["fp8"])) == " (fp8 only)"
    assert _only(StackFactors(gemm_scale=0.65, precisions=["fp16"])) == " (16-bit only)"
    assert _only(StackFactors(gemm_scale=1.1, precisions=["bf16", "fp8"])) == ""
    assert _only(StackFactors(gemm_scale=1.1)) == ""


def test_factors_are_not_applied_twice() -> None:
    """A profile that already carries a stack's factors (load_inputs applied them to the
    cluster's GPU) gets none again from profile_for: solve --calibrate --stack fitted from that
    profile and multiplied nemo's GEMM scale in twice (0.633 -> 0.685 -> 0.742 at one curve
    point). Checked against the stock profile scaled once by hand."""
    from planner.registry import load_gpu
    from planner.stacks import resolve_stack

    nemo = resolve_stack("nemo")
    # GB200: nemo's fitted class (its H100 factors are stock since they are kept per GPU class
    # only where they beat stock held out)
    stock = load_gpu("GB200")
    scale = nemo.factors_for(stock.name, stock.curve_is_borrowed, "bf16").gemm_scale
    assert scale != 1.0
    once = nemo.profile_for(stock, "bf16")
    again = nemo.profile_for(once, "bf16")
    assert again.gemm_efficiency == once.gemm_efficiency
    for (_, e0), (_, e1) in zip(stock.gemm_efficiency.points, once.gemm_efficiency.points,
                                strict=True):
        assert e1 == pytest.approx(min(1.0, e0 * scale))

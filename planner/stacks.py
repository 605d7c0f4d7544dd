"""Software stacks: which training software runs the job, as a first-class input.

A preset (one YAML file per stack in software_stacks/, packaged as planner.software_stacks and
validated by StackPreset) holds
- how to recognise the stack in free text ("NeMo 24.07 (Megatron-Core)", "DeepSpeed ZeRO-3"):
  regular expressions and a range of years, tried in the presets' priority order; one set of
  rules serves `--stack TEXT` and the `stack` / `framework` column of a runs table;
- its recipe: the JobSpec fields the software implies (attention kernel, gradient dtype, TP/PP/DP
  overlap, memory extras) and the layout knobs it cannot change (e.g. no interleaving);
- its efficiency factors on the GPU profiles (a GEMM scale and a host time per layer pass), each
  with provenance: the published runs it was fitted on, their count, the error left in and out of
  sample. A preset with no runs behind it keeps the stock factors and says so. The factors hold
  for the GPUs and precisions of their fit (StackPreset.factors_for); elsewhere they are stock.

    from planner.stacks import resolve_stack
    stack = resolve_stack("NeMo 24.07 (Megatron-Core)")      # StackPreset 'nemo'
    job = stack.job(job)                                      # recipe fields set
    gpu = stack.apply(gpu, job.precision)                     # efficiency factors applied
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import SpecError
from planner.specs import GpuProfile, JobSpec
from planner.specs.adjust import apply_values

DEFAULT_STACK = "megatron-core"  # what a job that names no stack runs (the stock profiles' stack)


class StackRecipe(BaseModel):
    """JobSpec fields the software implies; None = the JobSpec default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention: Literal["flash", "cudnn", "triton", "unfused"] | None = Field(
        default=None, description="Attention kernel (JobSpec.attention).")
    grad_dtype: Literal["auto", "half", "fp32", "half+fp32"] | None = Field(
        default=None, description="Gradient bytes per parameter (JobSpec.grad_dtype).")
    grad_reduce_dtype: Literal["auto", "half", "fp32"] | None = Field(
        default=None, description="Gradient width the DP reduction sends "
        "(JobSpec.grad_reduce_dtype).")
    grad_overlap: bool | None = Field(
        default=None, description="DP gradient reduction overlaps the backward.")
    param_gather_overlap: bool | None = Field(
        default=None, description="The ZeRO-1/2 parameter all-gather overlaps the next forward.")
    dp_bucket_mb: float | None = Field(
        default=None, gt=0, description="MiB of 16-bit gradients per DP reduction call.")
    zero1_grad_all_reduce: bool | None = Field(
        default=None, description="ZeRO-1 all-reduces the whole gradient buffer after the "
        "backward, blocking (JobSpec.zero1_grad_all_reduce).")
    tp_comm_overlap: bool | None = Field(
        default=None, description="TP/SP collectives overlap their GEMMs.")
    p2p_overlap: bool | None = Field(
        default=None, description="Interleaved 1F1B overlaps its pipeline sends.")
    p2p_scatter_gather: bool | None = Field(
        default=None, description="Pipeline sends split over TP, all-gathered on receipt.")
    software: Literal["current", "deepspeed-2022", "megatron-2021"] | None = Field(
        default=None, description="Runtime memory recipe (JobSpec.software).")

    def job_fields(self) -> dict[str, Any]:
        """The fields this recipe sets (the ones not None)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class TextRule(BaseModel):
    """A refinement of the recipe when the stack's text (or a table row's notes) says more."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str = Field(description="Regular expression, case-insensitive.")
    where: Literal["text", "notes"] = Field(
        default="text", description="Search the stack text or the row's notes.")
    case_sensitive: bool = False
    recipe: StackRecipe
    why: str = Field(default="", description="The source of the rule.")


class StackMatch(BaseModel):
    """How free text names this stack: any pattern matches, and when `years` is set the latest
    year written in the text (20xx) lies in it (text without a year matches only if
    `without_year`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    patterns: list[str] = Field(description="Regular expressions, case-insensitive.")
    years: tuple[int, int] | None = None
    without_year: bool = True
    priority: int = Field(description="Lower is tried first (specific stacks before general).")


Precision = Literal["bf16", "fp16", "fp8"]  # JobSpec.precision


def precision_kind(precision: str) -> str:
    """The GEMM path a matmul precision runs: '16-bit' for bf16 and fp16 (the same tensor-core
    GEMMs at the same peak from the A100 on, planner.measured.runs.precision_of, on the profile's
    one gemm_efficiency curve, costmodel.compute.matmul_peak_and_curve), 'fp8' for fp8 (its own
    curve, and Transformer Engine's per-layer scaling work in the layer pass)."""
    return "fp8" if precision == "fp8" else "16-bit"


class StackFactors(BaseModel):
    """Efficiency factors on a GPU profile. gemm_scale multiplies the BF16 and FP8 GEMM
    efficiency curves (capped at 1 per point); layer_overhead_us replaces the profile's host time
    per layer pass (None keeps the profile's). `precisions`: the job precisions of the runs they
    were fitted on; a job of another kind (precision_kind) gets stock factors
    (StackPreset.factors_for). None: any precision (stock factors; presets written before the
    field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_scale: float = Field(default=1.0, gt=0.05, le=5.0,
                              description="Factor on the GEMM efficiency curves.")
    layer_overhead_us: float | None = Field(
        default=None, ge=0.0, le=1e5,
        description="Host time per layer and micro-batch pass, us (None: the profile's).")
    precisions: list[Precision] | None = Field(
        default=None, description="Job precisions of the runs the factors were fitted on "
        "(None: any precision).")

    @property
    def is_stock(self) -> bool:
        """No factor fitted: GEMM scale 1 and the profile's layer pass."""
        return self.gemm_scale == 1.0 and self.layer_overhead_us is None

    def holds_for(self, precisions: Iterable[str]) -> bool:
        """Whether the fit saw the GEMM path (precision_kind) of any of `precisions` (one job's,
        or the runs one calibration fits a single profile to)."""
        if self.precisions is None:
            return True
        seen = {precision_kind(p) for p in self.precisions}
        return any(precision_kind(p) in seen for p in precisions)


class ErrorStats(BaseModel):
    """Absolute relative step-time error (fractions) over `n` runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    median: float
    p90: float
    n: int


class StackProvenance(BaseModel):
    """Where the factors come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fitted_on: list[str] = Field(default_factory=list,
                                 description="source_ids of planner/data/published_runs.csv.")
    runs: int = Field(default=0, description="Timed runs of the fit.")
    gpus: list[str] = Field(default_factory=list)
    method: str = ""
    in_sample: ErrorStats | None = None
    out_of_sample: ErrorStats | None = None
    out_of_sample_how: str = Field(
        default="", description="Other sources of the stack, or within its one source.")
    date: str = ""
    note: str = ""


class StackPreset(BaseModel):
    """One software stack: recognition rules, recipe, efficiency factors, provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    title: str = Field(description="What people call it.")
    description: str = ""
    aliases: list[str] = Field(default_factory=list)
    match: StackMatch
    recipe: StackRecipe = StackRecipe()
    text_rules: list[TextRule] = Field(default_factory=list)
    layout_defaults: dict[str, int | bool | str] = Field(
        default_factory=dict,
        description="Layout knobs the software fixes (pinned unless a run or the user says).")
    supports: dict[str, list[int | bool | str]] = Field(
        default_factory=dict,
        description="Layout knob values the software can run (a knob absent: any): the search "
        "leaves the others out (JobSpec.layout_support), estimate warns about them.")
    stage_split: Literal["even", "nanotron"] = Field(
        default="even",
        description="How the software places the layers on pipeline stages (vpp 1): even "
        "(Megatron's rule, planner.layout.stage_layers) or nanotron (by compute cost, the LM "
        "head counted: pipeline.nanotron_stage_counts).")
    factors: StackFactors = StackFactors()
    gpu_factors: dict[str, StackFactors] = Field(
        default_factory=dict,
        description="Factors of one GPU class (planner.published.GPU_CLASSES) that do not "
        "travel: fitted on that class's runs (stackfit.fit_stack_by_class fits every class so). "
        "`factors` serves every other GPU (stock in the fitted presets).")
    provenance: StackProvenance = StackProvenance()
    sources: dict[str, str] = Field(default_factory=dict, description="Source per recipe item.")

    @property
    def fitted(self) -> bool:
        """Whether published runs stand behind the factors."""
        return self.provenance.runs > 0

    def matches(self, text: str) -> bool:
        """Whether the free text names this stack (the rules above)."""
        if not any(re.search(p, text, re.IGNORECASE) for p in self.match.patterns):
            return False
        if self.match.years is None:
            return True
        years = [int(y) for y in re.findall(r"\b(20\d\d)\b", text)]
        if not years:
            return self.match.without_year
        lo, hi = self.match.years
        return lo <= max(years) <= hi

    def recipe_fields(self, text: str | None = "", notes: str | None = "") -> dict[str, Any]:
        """JobSpec fields of this stack, refined by its text rules on `text` and `notes` (None:
        no text)."""
        out = self.recipe.job_fields()
        if self.supports:
            out["layout_support"] = tuple((k, tuple(v)) for k, v in self.supports.items())
        for rule in self.text_rules:
            hay = (notes if rule.where == "notes" else text) or ""
            flags = 0 if rule.case_sensitive else re.IGNORECASE
            if re.search(rule.pattern, hay, flags):
                out.update(rule.recipe.job_fields())
        return out

    def unsupported(self, layout: Any) -> list[str]:
        """What of `layout` this stack's software cannot run (StackPreset.supports), one line
        each, citing the preset's source."""
        out = []
        for knob, values in self.supports.items():
            value = getattr(layout, knob)
            if value not in values:
                out.append(f"{self.name} runs {knob} {', '.join(map(str, values))} only, not "
                           f"{knob}={value} (software_stacks/{self.name}.yaml: "
                           "sources.supports)")
        return out

    def job(self, job: JobSpec, text: str | None = "", notes: str | None = "") -> JobSpec:
        """`job` with this stack's recipe."""
        fields = self.recipe_fields(text, notes)
        return job.model_copy(update=fields) if fields else job

    def fitted_factor_sets(self, borrowed_curves: bool = False) -> list[StackFactors]:
        """The factor sets fitted on runs (the transferable ones and each GPU class's, stock ones
        left out); the classes on a borrowed GEMM curve (class_curve_is_borrowed) only with
        `borrowed_curves`: there a factor also absorbs the borrowed curve's error."""
        sets = [self.factors, *(f for cls, f in self.gpu_factors.items()
                                if borrowed_curves or not class_curve_is_borrowed(cls))]
        return [f for f in sets if not f.is_stock]

    def factors_for(self, gpu_name: str, curve_is_borrowed: bool | None = None,
                    precision: str | Iterable[str] | None = None) -> StackFactors:
        """The factors on this GPU for a job of this matmul precision: its class's own (gpu_factors)
        where the preset has them; else, on a GPU whose GEMM curve is borrowed from another chip
        (GpuProfile.curve_is_borrowed), the stock factors; else the transferable ones (stock in the
        presets stackfit.fit_stack_by_class fits: every factor is kept on the GPU class of its
        runs). Transferable factors would be relative to a chip's own curve, so they do not carry to
        a borrowed one either: nemo fitted on dgxc's H100/GB200 runs and carried to
        Megatron-Bridge's GB300 (the GB200 curve) made those runs +17.8% (stock +10.0%) and the
        source's held-out p90 21.3% (stock 17.7%). Likewise a precision whose GEMM path the factors'
        fit never saw (StackFactors.holds_for) gets the stock factors: nemo fitted on Megatron-
        Bridge's FP8-only runs carried its layer pass to dgxc's BF16 runs at +21.9% (issue 19).
        `curve_is_borrowed` None: the built-in profile named `gpu_name` says. `precision`: the job's
        (JobSpec.precision), or those of the runs one calibration fits a single profile to (the
        factors are its start when they hold for any of them: dgxc's GB200 nemo group, calibrated on
        3 BF16/FP8 runs from stock instead, predicted its other 15 runs at 12.4% / 16.3% against
        9.5% / 13.2%, `benchmarks/accuracy.py --few-shot 3`); None: any.
        """
        from planner.published import gpu_class

        own = self.gpu_factors.get(gpu_class(gpu_name) or gpu_name)
        if own is None:
            if curve_is_borrowed is None:  # the built-in profile of that name says
                from planner.registry import builtin_gpus

                gpu = next((g for g in builtin_gpus().values() if g.name == gpu_name), None)
                curve_is_borrowed = gpu is not None and gpu.curve_is_borrowed
            own = StackFactors() if curve_is_borrowed else self.factors
        if precision is not None and not own.holds_for(
                [precision] if isinstance(precision, str) else precision):
            return StackFactors()
        return own

    def apply(self, profile: GpuProfile, precision: str | Iterable[str] | None = None,
              ) -> GpuProfile:
        """`profile` with this stack's efficiency factors for jobs of `precision` (factors_for;
        unchanged for stock factors)."""
        f = self.factors_for(profile.name, profile.curve_is_borrowed, precision)
        if f.is_stock:
            return profile
        # gemm_scale moves the FP8 curve too (specs.adjust.fp8_tied_values)
        values: dict[str, float] = {"gemm_scale": f.gemm_scale}
        if f.layer_overhead_us is not None:
            values["layer_overhead_us"] = max(f.layer_overhead_us, 0.0)
        out = apply_values(profile, values)
        sources = dict(out.sources)
        sources["software_stack"] = (
            f"factors of stack '{self.name}' (software_stacks/{self.name}.yaml): gemm x"
            f"{f.gemm_scale:.3g}" + ("" if f.layer_overhead_us is None else
                                     f", layer pass {f.layer_overhead_us:.4g} us"))
        return out.model_copy(update={"sources": sources})

    def profile_for(self, profile: GpuProfile, precision: str | Iterable[str] | None = None,
                    ) -> GpuProfile:
        """The profile to predict this stack's jobs of `precision` with: the factors applied to
        a built-in or measured profile (apply), none to one `planner calibrate` fitted (its fit
        already holds them) nor to one that carries a stack's factors already (apply's
        sources['software_stack']: solve --calibrate --stack fitted from the cluster's profile,
        which load_inputs had factored, and scaled its GEMMs twice)."""
        if profile.provenance and profile.provenance.get("calibrated_by"):
            return profile
        if "software_stack" in (profile.sources or {}):
            return profile
        return self.apply(profile, precision)

    def cluster_for(self, cluster: Any, precision: str | Iterable[str] | None = None) -> Any:
        """The cluster (or cluster of pools) with profile_for on every GPU profile it holds."""
        pools = getattr(cluster, "pools", None)
        if pools is None:
            return cluster.model_copy(update={"gpu": self.profile_for(cluster.gpu, precision)})
        return cluster.model_copy(update={"pools": tuple(
            p.model_copy(update={"gpu": self.profile_for(p.gpu, precision)}) for p in pools)})

    def summary(self) -> dict[str, Any]:
        """JSON-able summary for `planner stacks --json`."""
        return {
            "name": self.name, "title": self.title, "aliases": list(self.aliases),
            "recipe": self.recipe.job_fields(), "layout_defaults": dict(self.layout_defaults),
            "factors": self.factors.model_dump(),
            "gpu_factors": {k: v.model_dump() for k, v in self.gpu_factors.items()},
            "fitted": self.fitted,
            "provenance": self.provenance.model_dump(),
            "supports": {k: list(v) for k, v in self.supports.items()},
            "stage_split": self.stage_split,
        }


def class_curve_is_borrowed(cls: str) -> bool:
    """Whether a GPU class of StackPreset.gpu_factors (a planner.published.GPU_CLASSES key, or
    a GPU profile name) runs on a GEMM curve borrowed from another chip: any of its built-in
    profiles does (GpuProfile.curve_is_borrowed)."""
    from planner.published import GPU_CLASSES
    from planner.registry import builtin_gpus

    names = set(GPU_CLASSES.get(cls, (cls,)))
    return any(g.curve_is_borrowed for g in builtin_gpus().values() if g.name in names)


# ---- the presets ------------------------------------------------------------------------------

@cache
def builtin_stacks() -> dict[str, StackPreset]:
    """The presets of software_stacks/*.yaml by name, in priority order."""
    from planner.registry import _load_dir

    presets = _load_dir("planner.software_stacks", StackPreset)
    return dict(sorted(presets.items(), key=lambda kv: (kv[1].match.priority, kv[0])))


def _norm(text: str) -> str:
    return re.sub(r"[\s_./]+", "-", text.strip().lower())


def stack_names() -> list[str]:
    return list(builtin_stacks())


def resolve_stack(text: str | None) -> StackPreset:
    """The preset a name, alias or free-text framework description means. None or empty text
    is the default stack (Megatron-Core, the stock profiles' software); text no rule recognises
    is a SpecError listing the presets."""
    stacks = builtin_stacks()
    if text is None or not str(text).strip():
        return stacks[DEFAULT_STACK]
    text = str(text)
    key = _norm(text)
    for preset in stacks.values():
        if key == _norm(preset.name) or key in {_norm(a) for a in preset.aliases}:
            return preset
    for preset in stacks.values():
        if preset.matches(text):
            return preset
    raise SpecError(f"unknown software stack '{text}'; presets: {', '.join(stacks)} "
                    "(or a framework description naming one of them, see `planner stacks`)")


def recipe_of(framework: str, notes: str = "") -> dict[str, Any]:
    """JobSpec recipe fields a framework text implies (resolve_stack + its recipe rules)."""
    return resolve_stack(framework).recipe_fields(framework, notes)

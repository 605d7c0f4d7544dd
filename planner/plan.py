"""Plan = Layout + its Estimate + rank; the row of plan columns (docs/contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.layout import Layout
from planner.specs.hardware import STEP_TIME_TERMS

if TYPE_CHECKING:
    from planner.costmodel import Estimate

# Exact CSV header / JSON keys of a plan, in order (the public contract).
PLAN_COLUMNS: tuple[str, ...] = (
    "rank", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "grad_accum", "global_batch", "seq_len",
    "zero", "recompute", "sp",
    "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
    "hw_tflops_per_gpu", "mfu", "hfu", "peak_mem_gb", "mem_capacity_gb", "fits",
    *STEP_TIME_TERMS,  # time_compute_s ... time_optimizer_s (planner.specs.hardware)
    "mem_weights_gb", "mem_grads_gb", "mem_optimizer_gb", "mem_activations_gb", "mem_other_gb",
    # added by the open issues (CONTRACT.md "Names the open issues add"), in contract order
    "step_time_low_s", "step_time_high_s", "tied_with_best",
    # issue 19: above the best published MFU of its GPU class and stack (planner.published)
    "faster_than_published",
    # issue 19 section 4: what the device shows beside peak_mem_gb (what PyTorch allocates)
    "device_mem_gb",
    # issue 19: the relative 1-sigma error between layouts of one job, the tie rule's band
    # (planner.data.bands; step_time_low_s/high_s are the step time's absolute band)
    "ranking_band",
)
TIME_COLUMNS = STEP_TIME_TERMS  # the time terms (planner.specs.hardware), in PLAN_COLUMNS
MEM_COLUMNS = tuple(c for c in PLAN_COLUMNS if c.startswith("mem_") and c != "mem_capacity_gb")


@dataclass(frozen=True)
class Plan:
    """One ranked layout with its prediction. rank is 1-based (0 = not ranked, e.g. estimate)."""

    layout: Layout
    estimate: Estimate
    rank: int = 0
    run: Any = None  # planner.economics.RunCosts when the user gave --train-tokens
    # its step-time band overlaps the fastest plan's (planner.search.ties); False for estimate
    tied_with_best: bool = False
    # predicted above the best MFU of any published run of its GPU class and stack by more than
    # its band (planner.published); the last of the plan columns
    faster_than_published: bool = False

    def row(self) -> dict[str, Any]:
        """The plan columns, in contract order, plus any extra columns the estimate carries."""
        values = {**self.layout.as_dict(), **self.estimate.columns(), "rank": self.rank,
                  "tied_with_best": self.tied_with_best,
                  "faster_than_published": self.faster_than_published}
        row = {c: values[c] for c in PLAN_COLUMNS}
        row.update({k: v for k, v in values.items() if k not in row})
        if self.run is not None:  # appended after the other columns (contract)
            row.update(self.run.columns())
        return row

"""nanotron's pipeline split (pipeline.nanotron_stage_counts): its blocks go to pipeline ranks by
cumulative compute cost, the LM head counted (huggingface/nanotron models/base.py build_model @
0e0a27e); the sweep's rows carry that split (the nanotron stack preset's stage_split)."""

from __future__ import annotations

import pytest
from bench_fixtures import load_bench, nanotron_sweep

from planner.costmodel import pipeline
from planner.costmodel.checks import stage_layers_violations
from planner.layout import Layout
from planner.measured.runs import load_table
from planner.specs import ModelSpec

rk = load_bench("ranking")
SWEEP = nanotron_sweep()


def _llama(h: int, ffn: int, layers: int, vocab: int = 131072) -> ModelSpec:
    return ModelSpec(name="nanotron-bench", num_hidden_layers=layers, hidden_size=h,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=ffn,
                     vocab_size=vocab, activation="swiglu", norm="rmsnorm")


def test_1_34b_on_8_stages_by_hand():
    """1.34B (h 2048, ffn 8192, 16 layers, vocab 131072): a layer costs 4 h^2 + 3 ffn h =
    16.8M + 50.3M = 67.1M, the head 131072 x 2048 = 268.4M = 4 layers; 20 layer-units in all,
    2.5 per rank. Rank 0 takes layers until the cumulative cost passes 2.5 (layer 3 at 3.0),
    rank 1 until 5 (layer 6 at 6.0), rank 2 until 7.5 (layer 8), rank 3 until 10 (layer 11),
    rank 4 until 12.5 (layer 13), rank 5 until 15 (layer 16); the head (cumulative 20) lands on
    rank 6 and the loss on rank 7: 3, 3, 2, 3, 2, 3, 0, 0 layers."""
    assert pipeline.nanotron_stage_counts(_llama(2048, 8192, 16), 8) == [3, 3, 2, 3, 2, 3, 0, 0]


def test_8_86b_on_4_stages_by_hand():
    """8.86B (h 4096, ffn 14336, 32 layers): a layer 67.1M + 176.2M = 243.3M, the head 536.9M
    = 2.21 layers; 34.21 units, 8.55 per rank: ranks take 9 (cumulative 9 > 8.55), 9 (18 >
    17.10), 8 (26 > 25.66) and the last 6 layers with the head."""
    assert pipeline.nanotron_stage_counts(_llama(4096, 14336, 32), 4) == [9, 9, 8, 6]


def test_a_negligible_head_gives_the_even_split():
    """With the head's cost negligible (vocab 1) the thresholds sit just above 4, 8 and 12
    layers, and nanotron moves on only after the block that *exceeds* a threshold, which stays
    on the rank: rank 0 takes layers 1-5, rank 1 6-9, rank 2 10-13, rank 3 14-16."""
    assert pipeline.nanotron_stage_counts(_llama(2048, 8192, 16, vocab=1), 4) == [5, 4, 4, 3]


def test_later_stages_may_hold_no_layer():
    """A stage after the first may hold none (the head's, the loss's); the first needs one."""
    assert stage_layers_violations(16, Layout(pp=4, stage_layers=(6, 5, 5, 0))) == []
    assert stage_layers_violations(16, Layout(pp=4, stage_layers=(0, 6, 5, 5)))
    features = pipeline.stage_features(_llama(2048, 8192, 16), 4, 1, (6, 5, 5, 0), prune=False)
    assert list(features.n_dense) == [6, 5, 5, 0] and list(features.head) == [0, 0, 0, 1]


def test_sweep_rows_carry_the_split():
    runs, _ = load_table(SWEEP)
    by_pp = {}
    for run in runs:
        lay = run.layout
        if lay is not None and lay.pp > 1:
            by_pp.setdefault((run.model.hidden_size, lay.pp), set()).add(lay.stage_layers)
    assert by_pp[(2048, 8)] == {(3, 3, 2, 3, 2, 3, 0, 0)}
    assert by_pp[(4096, 4)] == {(9, 9, 8, 6)}


@pytest.mark.parametrize("framework", ["Megatron-LM", "DeepSpeed"])
def test_other_stacks_keep_the_even_rule(framework):
    from planner.stacks import resolve_stack

    assert resolve_stack(framework).stage_split == "even"


def test_stacks_json_names_the_split():
    from planner.stacks import resolve_stack

    assert resolve_stack("nanotron").summary()["stage_split"] == "nanotron"
    assert list(resolve_stack("megatron-core").summary())[-1] == "stage_split"  # at the end

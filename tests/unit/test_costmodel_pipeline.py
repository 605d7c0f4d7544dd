"""Pipeline stages, in-flight micro-batches and the candidate-stage pruning."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from costmodel_fixtures import llama_like

from planner.costmodel import pipeline
from planner.specs import ModelSpec


@pytest.mark.parametrize("layers,pp,expected", [
    (80, 4, [20, 20, 20, 20]),
    (126, 16, [7] + [8] * 14 + [7]),  # Llama 3.1 405B on 16 stages (seed 001 ch. 9)
    (10, 4, [2, 3, 3, 2]),             # extra layers go to the inner stages first
    (11, 4, [3, 3, 3, 2]),             # then to the first stage
    (5, 2, [3, 2]),
    (3, 3, [1, 1, 1]),
])
def test_uneven_split(layers, pp, expected):
    assert pipeline.stage_layer_counts(layers, pp) == expected


def test_interleaved_chunks_round_robin():
    stages = pipeline.stage_layers(16, 2, 4)  # 8 chunks of 2 layers
    assert stages[0] == [0, 1, 4, 5, 8, 9, 12, 13]
    assert stages[1] == [2, 3, 6, 7, 10, 11, 14, 15]


def test_interleaved_with_embedding_and_loss_slots():
    """Megatron's account_for_embedding/loss_in_pipeline_split: 30 layers on pp 4 x vpp 8 =
    32 chunks (the dgxc Llama 3.1 405B proxy): the first and last chunks hold no layer."""
    counts = pipeline.stage_layer_counts(30, 32)
    assert counts[0] == 0 and counts[-1] == 0 and set(counts[1:-1]) == {1}
    stages = pipeline.stage_layers(30, 4, 8)
    assert [len(s) for s in stages] == [7, 8, 8, 7]


def test_in_flight_1f1b_and_megatron_interleaved_factor():
    pp, m = 8, 64
    stages = np.arange(pp)
    assert list(pipeline.in_flight(stages, pp, 1, m)) == [8, 7, 6, 5, 4, 3, 2, 1]
    assert pipeline.in_flight(np.array([0]), pp, 1, 3)[0] == 3  # m < p: only m exist
    for v in (2, 3, 4):
        # Megatron theoretical_memory_usage: stage 0 holds pp (1 + (pp-1)/(pp v)) stages' worth
        assert pipeline.in_flight(np.array([0]), pp, v, m)[0] == pytest.approx(
            pp * (1 + (pp - 1) / (pp * v)))
    assert pipeline.in_flight(np.array([3]), pp, 1, m, schedule="gpipe")[0] == m


def test_candidate_stages_dominate_the_dropped_ones():
    """Every dropped stage has an earlier kept stage with at least its layers and parameters
    (and at least as many micro-batches in flight), so it can never be the most loaded."""
    models = [llama_like(), ModelSpec(
        name="moe", num_hidden_layers=27, hidden_size=1024, num_attention_heads=16,
        intermediate_size=4096, vocab_size=1000, activation="swiglu", num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=512, first_k_dense_replace=3)]
    for model, pp in itertools.product(models, [1, 2, 3, 5, 7, 8, 16]):
        if pp > model.num_hidden_layers:
            continue
        feats = pipeline.stage_features(model, pp, 1)
        kept = set(feats.index.astype(int))
        assert 0 in kept and pp - 1 in kept
        stages = pipeline.stage_layers(model.num_hidden_layers, pp, 1)
        counts = [(sum(not model.is_moe_layer(i) for i in s), sum(model.is_moe_layer(i) for i in s))
                  for s in stages]
        for i in set(range(pp)) - kept:
            assert any(counts[j][0] >= counts[i][0] and counts[j][1] >= counts[i][1]
                       for j in kept if j < i)

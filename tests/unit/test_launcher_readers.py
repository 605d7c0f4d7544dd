"""Launcher configs read as the launcher reads them: one function of a torchtitan registry,
bash word splitting, DeepSpeed's batch arithmetic, NeMo's optimizer names and OmegaConf
interpolations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.launchers import read_config, resolve

DATA = Path(__file__).resolve().parents[1] / "data" / "launchers"


def test_torchtitan_registry_function_is_named_or_refused_with_the_choices():
    path = DATA / "torchtitan_registry_two_functions.py"
    with pytest.raises(SpecError, match=r"2 config functions \(llama3_8b_small, "
                                        r"llama3_8b_tp2_full_ac\)"):
        read_config(path)
    small = resolve(read_config(f"{path}:llama3_8b_small"), None, "8xH100")
    assert small.pins["tp"] == 1 and small.pins["dp"] == 8
    assert small.pins["recompute"] == "selective"  # Trainer.Config's default SelectiveAC
    # the second function starts from the first and changes two things
    big = resolve(read_config(f"{path}:llama3_8b_tp2_full_ac"), None, "8xH100")
    assert big.pins["tp"] == 2 and big.pins["dp"] == 4 and big.pins["recompute"] == "full"
    assert big.job.global_batch == 64 and big.job.seq_len == 8192
    with pytest.raises(SpecError, match="no config function 'nope'; it has llama3_8b_small"):
        read_config(f"{path}:nope")


TITAN = os.environ.get("PLANNER_LAUNCHER_SRC")


@pytest.mark.skipif(not TITAN or not (Path(TITAN) / "torchtitan").is_dir(),
                    reason="torchtitan's own registry needs PLANNER_LAUNCHER_SRC/torchtitan")
def test_torchtitans_own_registry_reads_function_by_function():
    path = Path(TITAN) / "torchtitan/torchtitan/models/llama3/config_registry.py"
    with pytest.raises(SpecError, match="config functions"):
        read_config(path)
    got = resolve(read_config(f"{path}:llama3_405b"), None, "16x8xH100")
    assert (got.pins["tp"], got.pins["dp"], got.pins["recompute"]) == (8, 16, "full")
    got = resolve(read_config(f"{path}:llama3_70b"), None, "8x8xH100")
    assert got.model.name == "llama3-70b"


def test_quoted_array_words_split_as_bash_splits_them(tmp_path):
    # the constructs of Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh @ d98e8a64ddf3:
    # quoted "--flag value" array elements, expanded unquoted on the torchrun line
    script = tmp_path / "train.sh"
    script.write_text("""#!/bin/bash
DTYPE="fp8"
NUM_LAYERS=32
MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --kv-channels 128
    --position-embedding-type rope
    --rotary-base 1000000
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --bf16
)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-amax-history-len 1024"
    )
fi
DATA_ARGS_LIST=(
    "--tokenizer-type NullTokenizer"
    "--vocab-size 128256"
    "--split '99,1,0'"
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    # --pipeline-model-parallel-size $PP_SIZE # Not explicitly set
    --sequence-parallel  # Always enable sequence parallelism with TP_SIZE=2
)
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py ${MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS_LIST[@]}
""")
    got = read_config(script)
    assert got.job["precision"] == "fp8"
    assert got.shape["vocab_size"] == 128256
    assert got.shape["num_hidden_layers"] == 32 and got.shape["num_key_value_heads"] == 8
    assert got.pins["tp"] == 1 and got.pins["sp"] is False  # Megatron turns SP off at TP 1
    resolved = resolve(got, None, "H100")
    assert resolved.model.name == "llama3-8b" and resolved.pins["dp"] == 8


# ---- NeMo / Megatron-Bridge ----

PRINTED_CONFIG = """\
# the structure of a ConfigContainer printed by Megatron-Bridge (builder-backed model: the
# TransformerConfig under model.transformer; mixed_precision a MixedPrecisionConfig), written
# for the test in the form of training/config.py @ 067f987df03b
model:
  seq_length: 8192
  vocab_size: 128256
  share_embeddings_and_output_weights: false
  position_embedding_type: rope
  transformer:
    num_layers: 80
    hidden_size: 8192
    ffn_hidden_size: 28672
    num_attention_heads: 64
    num_query_groups: 8
    kv_channels: 128
    gated_linear_unit: true
    normalization: RMSNorm
    add_bias_linear: false
    tensor_model_parallel_size: 4
    pipeline_model_parallel_size: 4
    virtual_pipeline_model_parallel_size: 5
    context_parallel_size: 2
    sequence_parallel: true
    fp8: null
train:
  global_batch_size: 256
  micro_batch_size: 1
ddp:
  use_distributed_optimizer: true
mixed_precision:
  bf16: true
  fp16: false
  fp8: null
  fp8_recipe: tensorwise
"""


def test_printed_configcontainer_reads_the_nested_model_and_the_precision_fields(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(PRINTED_CONFIG)
    got = resolve(read_config(path), None, "8x8xH100")
    assert got.model.name == "llama3-70b"
    assert (got.pins["tp"], got.pins["pp"], got.pins["vpp"], got.pins["cp"], got.pins["dp"]) == \
        (4, 4, 5, 2, 2)
    assert got.job.precision == "bf16"  # fp8: null and an fp8_recipe name are not FP8


NEMO1 = """\
trainer:
  devices: 8
  num_nodes: 2
  precision: bf16
model:
  micro_batch_size: 2
  global_batch_size: 256
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  encoder_seq_length: 2048
  max_position_embeddings: ${.encoder_seq_length}
  num_layers: 24
  hidden_size: 2048
  ffn_hidden_size: ${multiply:4, ${.hidden_size}}
  num_attention_heads: 16
  optim:
    name: OPTIM
"""


def test_nemo1_interpolations_resolve_and_only_distributed_adam_is_zero1(tmp_path):
    # the forms of NeMo 1's megatron_gpt_config.yaml: ${.key} and the multiply resolver
    path = tmp_path / "megatron_gpt_config.yaml"
    path.write_text(NEMO1.replace("OPTIM", "fused_adam"))
    got = read_config(path)
    assert got.shape["intermediate_size"] == 4 * 2048
    assert got.pins["zero"] == 0
    path.write_text(NEMO1.replace("OPTIM", "distributed_fused_adam"))
    assert read_config(path).pins["zero"] == 1
    path.write_text(NEMO1.replace("${multiply:4, ${.hidden_size}}", "${oc.env:FFN}"))
    got = read_config(path)
    assert "intermediate_size" not in got.shape
    assert any("ffn_hidden_size" in n and "not resolved" in n for n in got.notes)


RECIPES = """\
# two recipe functions in the form of Megatron-Bridge's perf_recipes (the second starts from the
# first); written for the test
def small_config():
    cfg = base_config()
    cfg.model.tensor_model_parallel_size = 2
    cfg.model.pipeline_model_parallel_size = 1
    cfg.mixed_precision = "bf16_mixed"
    cfg.mixed_precision.grad_reduce_in_fp32 = False
    cfg.train.global_batch_size = 128
    return cfg


def big_config():
    cfg = small_config()
    cfg.model.transformer.tensor_model_parallel_size = 8
    return cfg
"""


def test_bridge_recipe_file_is_read_one_function_at_a_time(tmp_path):
    path = tmp_path / "recipes.py"
    path.write_text(RECIPES)
    with pytest.raises(SpecError, match=r"2 config functions \(small_config, big_config\)"):
        read_config(path)
    assert read_config(f"{path}:small_config").pins["tp"] == 2
    big = read_config(f"{path}:big_config")
    assert big.pins["tp"] == 8 and big.job["global_batch"] == 128


BRIDGE = os.environ.get("PLANNER_LAUNCHER_SRC")


@pytest.mark.skipif(not BRIDGE or not (Path(BRIDGE) / "Megatron-Bridge").is_dir(),
                    reason="Megatron-Bridge's perf recipes need PLANNER_LAUNCHER_SRC/"
                           "Megatron-Bridge")
def test_bridges_own_perf_recipes_read_or_refuse_with_one_line():
    root = Path(BRIDGE) / "Megatron-Bridge/src/megatron/bridge/perf_recipes"
    path = root / "llama/h100/llama3.py"
    with pytest.raises(SpecError, match="config functions"):
        read_config(path)
    got = read_config(f"{path}:llama3_70b_pretrain_64gpu_h100_bf16_config")
    assert (got.pins["tp"], got.pins["pp"], got.pins["cp"]) == (4, 4, 2)
    for recipe in sorted(root.glob("*/*/*.py")):
        try:
            read_config(recipe)
        except SpecError as exc:
            assert "\n" not in str(exc)

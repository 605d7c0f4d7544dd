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

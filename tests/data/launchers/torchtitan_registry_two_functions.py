# A torchtitan config registry with two config functions, written for the tests in the form of
# torchtitan/models/llama3/config_registry.py @ b5bcd76c66d0 (the second builds on the first, as
# llama3_8b_mxfp8 builds on llama3_8b there). Not copied from torchtitan.
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.trainer import Trainer

from torchtitan.models.llama3 import model_registry


def llama3_8b_small() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("8B"),
        training=TrainingConfig(
            num_tokens_per_microbatch_per_dp_rank=8192,
            num_tokens_per_train_step=64 * 8192,
            max_context_length=8192,
        ),
        parallelism=ParallelismConfig(
            data_parallel_shard_degree=-1,
            tensor_parallel_degree=1,
        ),
    )


def llama3_8b_tp2_full_ac() -> Trainer.Config:
    config = llama3_8b_small()
    config.parallelism.tensor_parallel_degree = 2
    config.activation_checkpoint = FullAC.Config()
    return config

"""Run Megatron-DeepSpeed's and DeepSpeed's own start-up checks on exported launch scripts, on
CPU (a subprocess: `python deepspeed_start.py MEGATRON_DEEPSPEED_TREE < cases.json`).

Each case {"argv", "env", "config"} goes through Megatron-DeepSpeed's megatron/arguments.py
`parse_args` (with DeepSpeed's own arguments) and `validate_args`, then DeepSpeed's
`DeepSpeedConfig` on the ds_config.json the script wrote, with the data-parallel size the
launch gives (its batch identity train_batch = micro x accumulation x dp), then the pipeline
engine's ZeRO rule (runtime/pipe/engine.py asserts ZeRO < 2 with pp > 1; the engine needs a
model to build, so the rule is applied to the config, after checking the installed engine still
states it). Printed: one JSON list of {"ok", "error"}.

Stubs: rank 0 for deepspeed.comm.get_rank (no process group here); DeepSpeed's accelerator
answers device_name() "cuda" (the checks that hold on CUDA only, e.g. CUDA_DEVICE_MAX_CONNECTIONS=1
for sequence parallelism, then run as on a GPU); the model-parallel unit `mpu` DeepSpeedConfig
asks for the data-parallel size; `transformers`, `six` and `regex` (Megatron-DeepSpeed's tokenizer
module imports them at load; no argument check calls them).
"""

from __future__ import annotations

import inspect
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import stubs


class MPU:
    """The model-parallel unit DeepSpeedConfig asks for the data-parallel size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_sequence_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_world_size(self) -> int:
        return 1


def load(tree: str):
    sys.path.insert(0, tree)
    stubs.install(("triton", "transformers", "six", "regex"))
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        import deepspeed
        import deepspeed.runtime.pipe.engine as engine
        import megatron.arguments as arguments
        from deepspeed.runtime.config import DeepSpeedConfig
    import deepspeed.runtime.config as ds_config_module

    # no process group on this machine: rank 0 (DeepSpeedConfig asks dist.get_rank() first and
    # falls back to a world of 1 when it fails; the data-parallel size then comes from mpu)
    ds_config_module.dist.get_rank = lambda *a, **k: 0
    accelerator = deepspeed.accelerator.get_accelerator()
    type(accelerator).device_name = lambda self, device_index=None: "cuda"
    rule = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    assert rule in inspect.getsource(engine), "the pipeline engine's ZeRO rule moved"
    return arguments, DeepSpeedConfig


def check(case: dict, arguments, ds_config_cls) -> dict:
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK"):
        os.environ.pop(key, None)
    os.environ.update(case["env"])
    os.environ.setdefault("RANK", "0")
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            args = arguments.parse_args()
            arguments.validate_args(args)
            dp = args.data_parallel_size
            config = ds_config_cls(case["config"], mpu=MPU(dp))
            if args.pipeline_model_parallel_size > 1 and config.zero_optimization_stage >= 2:
                raise AssertionError("ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                                     "parallelism (runtime/pipe/engine.py)")
            if config.train_batch_size != args.global_batch_size:
                raise AssertionError(f"ds_config train_batch_size {config.train_batch_size} "
                                     f"but --global-batch-size {args.global_batch_size}")
        return {"ok": True, "error": ""}
    except SystemExit as exc:
        return {"ok": False, "error": f"argparse exit {exc.code}"}
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return {"ok": False, "error": f"{type(exc).__name__}: {exc} "
                                      f"({os.path.basename(last.filename)}:{last.lineno})"}


def main() -> None:
    loaded = load(sys.argv[1])
    cases = json.load(sys.stdin)
    print(json.dumps([check(case, *loaded) for case in cases]))


if __name__ == "__main__":
    main()

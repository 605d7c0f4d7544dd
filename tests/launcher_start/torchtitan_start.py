"""Run torchtitan's own start-up checks on exported config-registry files, on CPU (a
subprocess: `python torchtitan_start.py TREE < cases.json`; TREE holds the `torchtitan` package,
or is "installed" for the installed one).

Each case {"file", "world_size", "layers"} is imported as torchtitan's `--module` would be and
its `planner_plan()` called: Trainer.Config and its sections validate themselves
(__post_init__: CUDA graphs against PP and EP, micro-batch fields, ...). Then
ParallelDims.from_config(parallelism, world_size) (its _validate), the batch arithmetic of
Trainer.__init__ (restated, with the lines cited below), and the pipeline split of
distributed/pipeline_parallel.py: _get_pipeline_metadata, then the config's
module_fqns_per_model_part or _generate_llm_fqn_per_model_part, as pipeline_llm does. Printed:
one JSON list of {"ok", "error", "chunks"} (decoder layers of each chunk, in layer order).

A model that is no torchtitan flavor is exported as flavor CUSTOM: the check registers it as
llama3's 8B with the plan's layer count (only the layer count matters to the split).

Stubs: `triton` (GPU kernels, imported at module load and never called), and `grain`,
`datasets`, `wandb`, `tensorboard` (the data loaders and metric loggers trainer.py imports at
module load; no config check calls them).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

STUBBED = ("triton", "grain", "datasets", "wandb", "tensorboard")


sys.path.insert(0, str(Path(__file__).parent))
import stubs  # noqa: E402


def load(tree: str):
    if tree != "installed":
        sys.path.insert(0, tree)
    stubs.install(STUBBED)
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        import torchtitan.distributed.pipeline_parallel as pipeline_parallel
        import torchtitan.models.llama3 as llama3
        import torchtitan.trainer  # noqa: F401
        from torchtitan.distributed.parallel_dims import ParallelDims
    return pipeline_parallel, llama3, ParallelDims


def register_custom(llama3, layers: int) -> None:
    base = llama3.llama3_configs["8B"]

    def custom(**kwargs):
        config = base(**kwargs)
        config.layers = [config.layers[0]] * layers
        return config

    llama3.llama3_configs["CUSTOM"] = custom


def check(case: dict, pipeline_parallel, llama3, parallel_dims_cls) -> dict:
    register_custom(llama3, case["layers"])
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            spec = importlib.util.spec_from_file_location("planner_export", case["file"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            config = module.planner_plan()
            par, training = config.parallelism, config.training
            dims = parallel_dims_cls.from_config(par, case["world_size"])
            batch = dims.dp_replicate * dims.dp_shard
            if hasattr(training, "num_tokens_per_train_step"):
                # trainer.py @ b5bcd76c66d0 lines 296-307 and 409-427
                divisor = (dims.tp if par.enable_sequence_parallel else 1) * \
                    (2 * dims.cp if dims.cp > 1 else 1)
                if training.num_tokens_per_microbatch_per_dp_rank % divisor:
                    raise ValueError("tokens per micro-batch not divisible by the sequence/"
                                     f"context split {divisor}")
                micro = par.num_pp_microbatches if dims.pp > 1 else 1
                per_step = training.num_tokens_per_microbatch_per_dp_rank * micro * batch
                if training.num_tokens_per_train_step % per_step:
                    raise ValueError(f"num_tokens_per_train_step not a multiple of {per_step}")
            else:
                # trainer.py of 0.3.0 lines 415-437
                if training.global_batch_size % (training.local_batch_size * batch):
                    raise ValueError("global batch size not a multiple of local x dp")
            chunks = [case["layers"]]
            if dims.pp > 1:
                stages, layers, first, last = pipeline_parallel._get_pipeline_metadata(
                    dims, par, config.model_spec.model)
                parts = par.module_fqns_per_model_part or \
                    pipeline_parallel._generate_llm_fqn_per_model_part(stages, layers, first,
                                                                       last)
                if len(parts) % dims.pp:
                    raise ValueError(f"{len(parts)} chunks on {dims.pp} pipeline ranks")
                chunks = [sum(m.startswith("layers.") for m in part) for part in parts]
                if sum(chunks) != layers:
                    raise ValueError(f"the chunks hold {sum(chunks)} of {layers} layers")
        return {"ok": True, "error": "", "chunks": chunks}
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return {"ok": False, "chunks": [],
                "error": f"{type(exc).__name__}: {exc} ({os.path.basename(last.filename)}:"
                         f"{last.lineno})"}


def main() -> None:
    loaded = load(sys.argv[1])
    cases = json.load(sys.stdin)
    print(json.dumps([check(case, *loaded) for case in cases]))


if __name__ == "__main__":
    main()

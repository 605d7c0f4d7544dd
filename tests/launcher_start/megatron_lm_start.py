"""Run Megatron-LM's own start-up checks on argument lists, on CPU (a subprocess: run as
`python megatron_lm_start.py MEGATRON_LM_TREE < cases.json`).

Each case {"argv": [...], "env": {...}, "arch": 9} goes through megatron/training/arguments.py
`parse_args` and `validate_args`, then `core_transformer_config_from_args` (TransformerConfig's
own checks) and megatron/core/transformer/transformer_block.py `get_num_layers_to_build` for
every pipeline rank and virtual stage (the split the model build uses). Printed: one JSON list of
{"ok", "error", "chunks"}: chunks[v][p] = decoder layers of virtual stage v on pipeline rank p.

Stubs, only for what needs a GPU: `triton` (imported by fused kernels at module load; never
called), `get_device_arch_version` (asks the CUDA device; answered with the case's GPU
architecture: 8 A100, 9 H100), Transformer Engine (CUDA-only: `is_te_min_version` answers as a
recent TE would and rope_utils' fused RoPE kernel is a placeholder, as in NVIDIA's PyTorch
container), and typing.override for Python < 3.12.
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
import typing
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import stubs


def load(tree: str):
    typing.override = getattr(typing, "override", lambda f: f)
    sys.path.insert(0, tree)
    stubs.install(("triton",))
    sys.argv = ["pretrain_gpt.py"]
    with redirect_stdout(io.StringIO()):
        import megatron.training.arguments as arguments
        from megatron.core.transformer.enums import LayerType
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.training.argument_utils import core_transformer_config_from_args
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.transformer_config as transformer_config

    def te_kernel(*args, **kwargs):
        raise RuntimeError("Transformer Engine kernel placeholder: never run by the checks")

    rope_utils.fused_apply_rotary_pos_emb = te_kernel
    for module in (arguments, transformer_config):
        if hasattr(module, "is_te_min_version"):
            module.is_te_min_version = lambda *a, **k: True
    return arguments, core_transformer_config_from_args, get_num_layers_to_build, LayerType


def check(case: dict, arguments, to_config, layers_to_build, layer_type) -> dict:
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK"):
        os.environ.pop(key, None)
    os.environ.update(case["env"])
    os.environ.setdefault("RANK", "0")
    arguments.get_device_arch_version = lambda: case["arch"]
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    try:
        with redirect_stdout(io.StringIO()):
            args = arguments.parse_args()
            arguments.validate_args(args)
            config = to_config(args)
        pp = args.pipeline_model_parallel_size
        vpp = args.virtual_pipeline_model_parallel_size or 1
        layout = config.pipeline_model_parallel_layout
        if layout is not None:
            layout.validate_layer_layout(config.num_layers, config.mtp_num_layers)
            chunks = [[layout.layout[p][v].count(layer_type.decoder) for p in range(pp)]
                      for v in range(vpp)]
        else:
            chunks = [[layers_to_build(config, vp_stage=v if vpp > 1 else None, pp_rank=p)
                       for p in range(pp)] for v in range(vpp)]
        return {"ok": True, "error": "", "chunks": chunks}
    except SystemExit as exc:  # argparse refused an argument
        return {"ok": False, "error": f"argparse exit {exc.code}", "chunks": []}
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return {"ok": False, "chunks": [],
                "error": f"{type(exc).__name__}: {exc} ({os.path.basename(last.filename)}:"
                         f"{last.lineno})"}


def main() -> None:
    tree = sys.argv[1]
    cases = json.load(sys.stdin)
    loaded = load(tree)
    print(json.dumps([check(case, *loaded) for case in cases]))


if __name__ == "__main__":
    main()

"""planner.validate: run a layout for real under torchrun, and measure the hardware.

    planner validate --model llama2-7b --layers 4 --hidden 256 --tp 2 --dp 2 --out runs.jsonl
    planner profile --out cpu.yaml --nproc 2

Modules: model (the torch Transformer from a ModelSpec), parallel (mesh, TP/SP, FSDP2, pipeline),
worker (the torchrun entry point), launch (predicts, starts torchrun, handles failures), bench
(profile micro-benchmarks under torchrun), profile (raw numbers -> GpuProfile YAML), accuracy
(predicted vs measured over a set of runs), config and records. Only model, parallel, worker and
bench import torch; the planner never imports this package except inside the validate/profile
commands. See docs/validate.md.
"""

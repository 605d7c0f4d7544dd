"""planner.validate: run a layout for real under torchrun, and measure the hardware.

    planner validate --model llama2-7b --layers 4 --hidden 256 --tp 2 --dp 2 --out runs.jsonl
    planner profile --out cpu.yaml --nproc 2

Modules: model (the torch Transformer from a ModelSpec), parallel (mesh, TP/SP, FSDP2, pipeline),
worker (the torchrun entry point), launch (starts torchrun, handles failures), bench (profile
micro-benchmarks), config and records (no torch). Only model, parallel, worker and bench import
torch; the planner never imports this package except inside the validate/profile commands.
"""

"""Measured runs: what a training job took, read from where people keep it.

Modules: runs (MeasuredRun; published runs tables, validate records, and training logs as
runs: load_runs reads any of them), logs (Megatron-LM / NeMo / torchtitan training logs: layout,
model and steady step times, as the launchers print them).
"""

"""Physical bounds on every size a user can give: one home, used by the pydantic schemas
(planner.specs), the CLI options (planner.cli.options) and the runs-table rows
(planner.measured.runs).

A value past a bound is refused with the bound in its one-line error, before any array is
built. Each bound sits one to two orders of magnitude above the largest real value of its kind
(cited), so no real job is refused and nothing absurd (10**30 GPUs, 2**63 sequences, an
infinite memory) reaches the search or the cost model."""

from __future__ import annotations

# ---- clusters -----------------------------------------------------------------------------
# The largest single training clusters announced hold ~10**5 GPUs (xAI Colossus, 100k-200k
# H100/H200, 2024-25; Meta's Llama 3 used 16,384 H100): 2**20 is ~5-60x that.
MAX_GPUS = 2**20
# The largest scale-up (NVLink) domain shipped or announced: NVL576 (Rubin Ultra, GTC 2025);
# a node or domain of more than 2**12 GPUs is not a machine.
MAX_GPUS_PER_NODE = 2**12

# ---- jobs ---------------------------------------------------------------------------------
# Longest trained contexts are 1M-10M tokens (Gemini 1.5, Llama 4 Scout's 10M claim): 2**24.
MAX_SEQ_LEN = 2**24
# Sequences per optimizer step: GPT-3 1,536, Llama 3 405B 2,048 (16M tokens), BERT with LAMB
# 65,536 (You et al. 2019): 2**20 is 16x the largest.
MAX_GLOBAL_BATCH = 2**20

# ---- model shapes (HF config names) -------------------------------------------------------
# Largest published: PaLM 540B hidden 18,432, 118 layers, 48 heads; vocab 256k (Gemma);
# DeepSeek-V3 256 routed experts; ffn 73,728 (PaLM). Each bound is >= 10x those.
MAX_LAYERS = 2**14
MAX_HIDDEN = 2**18
MAX_HEADS = 2**14
MAX_HEAD_DIM = 2**14
MAX_FFN = 2**20
MAX_VOCAB = 2**24
MAX_EXPERTS = 2**14

# ---- GPU profiles -------------------------------------------------------------------------
# Dense tensor peak of one GPU: GB300 15 PFLOP/s FP4, B200 2.25 PFLOP/s BF16 (NVIDIA datasheets).
MAX_TFLOPS = 1e5
# HBM per GPU: GB300 288 GB, MI355X 288 GB; 64 TiB per GPU is no device.
MAX_MEMORY_GIB = 2.0**16
# HBM bandwidth: B200/GB300 8 TB/s (NVIDIA datasheets).
MAX_HBM_TB_PER_S = 1e3
# Per-GPU link and NIC bandwidth: NVLink 5 900 GB/s per direction, ConnectX-8 800 Gbit/s.
MAX_LINK_GB_PER_S = 1e5
MAX_NIC_GBIT_PER_S = 1e6
MAX_NICS_PER_GPU = 64.0
# A collective's latency or a per-layer host overhead of a second is already a broken machine.
MAX_LATENCY_US = 1e6
MAX_STEP_OVERHEAD_S = 3600.0
MAX_SM_COUNT = 2**16
MAX_TDP_W = 1e5  # board power: GB300 1,400 W (NVIDIA); a 100 kW GPU is no GPU
MAX_CURVE_POINTS = 10_000
MAX_CURVE_X = 1e30  # curve x is bytes or FLOP: 10**30 FLOP is 10**7 s of a 10**5 TFLOP/s GPU

# ---- runs and commands ---------------------------------------------------------------------
# One optimizer step of a day is no training run (the slowest published steps are minutes).
MAX_STEP_TIME_S = 86_400.0
# Waiting on a torchrun for more than a week is a hang, not a run.
MAX_TIMEOUT_S = 7 * 86_400.0
MAX_TOP = 10_000  # ranked plans printed or written
MAX_STEPS = 1_000_000  # validate's measured / warm-up steps
MAX_SEED = 2**32 - 1  # numpy's seed range (torch takes the same values)
# The training run (planner.economics): Llama 3 trained on 15.6e12 tokens; 1e17 is 6,000x that.
MAX_TRAIN_TOKENS = 1e17
MAX_GPU_HOUR_PRICE = 1e4  # USD per GPU-hour; cloud H100s rent for 2-10
MAX_PUE = 10.0  # power usage effectiveness: 1.1-1.6 in practice (Uptime Institute surveys)
MAX_MTBF_HOURS = 1e7  # one node's mean time between failures: ~6,300 h for Llama 3's nodes
MAX_STORAGE_GB_PER_S = 1e6  # aggregate checkpoint bandwidth: TB/s-class parallel file systems
MAX_LEARNING_RATE = 1e3  # peak learning rates are 1e-5..1e-2
MAX_NNODES = MAX_GPUS
MAX_NPROC = MAX_GPUS_PER_NODE

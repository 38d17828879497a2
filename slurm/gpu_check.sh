#!/usr/bin/env bash
# GPU check of the verl backend's quantized rollouts: does a weight sync give vLLM the weights it was
# sent? One command on one GPU (about 5-8 min, mostly vLLM start-ups; nothing to download):
#
#   bash slurm/gpu_check.sh                 # on a GPU node (or: srun -N1 --gres=gpu:1 bash slurm/gpu_check.sh)
#   bash slurm/gpu_check.sh --rollouts int8 # one rollout only
#
# Needs the suite installed with the gpu extra (pip install -e '.[gpu]': verl 0.9.1 + vllm 0.24.0);
# a missing package is a FAIL that names it. The checks (suite/verl/sync_check.py):
#   platform   a CUDA device is visible to torch
#   requant    the GPU re-quantizers (int8, per-channel fp8, packed int4) equal the CPU ones bit for bit
#   vllm       vLLM and verl import (the suite's verl.plugins entry point loads)
#   sync-int8, sync-fp8_per_channel, sync-w4a16
#              an engine of model A (W8A8 INT8; QuRL's per-channel FP8; W4A16 on vLLM's int4 kernel)
#              gets B, A, B synced through verl's sender and receiver; after each sync its greedy
#              tokens and log-probs equal a fresh load of that model's checkpoint, B's differ from
#              A's, the quantized layers' live CUDA tensors (which captured CUDA graphs read) are
#              kept, and the layer-wise sync held at most two decoder layers of weights at once
#              (its peak torch.cuda memory over the sync is printed)
# Prints one "CHECK name: PASS|FAIL detail" line per check, then "CHECKS <json>"; there is no SKIP.
# Exits 0 only when every check passed. The same check runs on vLLM's CPU build in CI
# (tests/vllm_cpu/test_sync_check.py, --device cpu), which leaves only the CUDA parts unexercised there.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m suite.verl.sync_check --device cuda "$@"

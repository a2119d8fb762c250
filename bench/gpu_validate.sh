#!/usr/bin/env bash
# GPU validation of the Megatron backend on one H200 (run from the repo root; results in $OUT).
# Needs the megatron-core wheel in .whl/ (pip download ... megatron-core==0.16.1 -d .whl).
set -o pipefail
OUT=${OUT:-/tmp/vime_gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, megatron.core as m; print(torch.__version__, transformers.__version__, m.__version__)'
STAGES=${STAGES:-logprobs,mfu}
if [[ $STAGES == *logprobs* ]]; then
    timeout 150 python3 bench/megatron_logprobs.py --model qwen3-0.6b --out "$OUT/logprobs.json" \
        2>&1 | grep -v -i warn | tee "$OUT/logprobs.log"
fi
if [[ $STAGES == *mfu* ]]; then
    timeout 430 python3 bench/train_mfu.py --models "${MODELS:-qwen3-1.7b,qwen3-4b}" \
        --backends "${BACKENDS:-megatron+export,torch}" --seq-len 4096 --out "$OUT/train_mfu.json" \
        2>&1 | grep -v -i warn | tee "$OUT/train_mfu.log"
fi

#!/bin/bash
# Device check of the GPU paths (hf backend oracle, training with autocast + checkpointing).
# Env: DEV (cuda), SCALE (1 on the GPU; 8 for a CPU dry run), OUT (logs and the run's log.jsonl).
# Figures in docs/oracle.md ("On a GPU") came from this script's steps, run in two calls.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
DEV=${DEV:-cuda}; S=${SCALE:-1}
BB="python3 -m basis_bench"
step() { local t=$1; shift; echo "=== $(date +%T) $*"; local s=$(date +%s%N); timeout $t "$@"; local rc=$?; echo "=== rc=$rc wall_ms=$(( ($(date +%s%N) - s) / 1000000 ))"; }
step 5 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import torch, transformers, polars, math_verify; print('torch', torch.__version__, 'transformers', transformers.__version__, 'polars', polars.__version__, 'cuda', torch.cuda.is_available())"
step 60 python3 benchmarks/gpu_check/make_model.py .gpu/smollm2 /tmp/smol
# B: oracle at its defaults (batch 64, workers auto = one on a GPU), resumable
step 120 $BB oracle --model /tmp/smol --policy random --prompts "arithmetic:n=$((16/S)),digits=1-2,steps=1-2,seed=5" --n 16 --max-new-tokens $((128/S)) --device $DEV --out /tmp/o1
step 60 $BB oracle --model /tmp/smol --policy random --prompts "arithmetic:n=$((16/S)),digits=1-2,steps=1-2,seed=5" --n 16 --max-new-tokens $((128/S)) --device $DEV --out /tmp/o1
# D: a GPU-sized decode batch
for b in 512 2048; do
  step 120 $BB oracle --model /tmp/smol --policy random --prompts "arithmetic:n=$((64/S)),digits=1-2,steps=1-2,seed=6" --n 32 --max-new-tokens $((128/S)) --batch-size $((b/S)) --chunk-size $((b/32)) --device $DEV --out /tmp/o2-$b
done
python3 -c "
import polars as pl, sys
for d in ['/tmp/o1','/tmp/o2-512','/tmp/o2-2048']:
    f = pl.read_parquet(d + '/rollouts/**/*.parquet')
    print(d, f.height, 'rollouts; mean reward', f['reward'].mean(), '; columns', f.columns)
" 2>&1 | tail -3
# E: training on the GPU (3 steps, checkpoint at 2), then resume in place from step 2:
# the CUDA RNG state is restored, so step 3 must come out the same
sed "s/device = \"cuda\"/device = \"$DEV\"/; s/^steps = 4/steps = 3/" benchmarks/gpu_check/train.toml > /tmp/train.toml
if [ "$S" != 1 ]; then sed -i 's/^rollouts_per_step = 64/rollouts_per_step = 16/; s/^max_new_tokens = 64/max_new_tokens = 8/; s/^ref_n = 8/ref_n = 2/; s/n=64,/n=8,/; s/n=32,/n=4,/; s/^autocast = .*/autocast = "none"/; s/^micro_batch_size = 32/micro_batch_size = 16/' /tmp/train.toml; fi
step 150 $BB train --config /tmp/train.toml
cp /tmp/train/log.jsonl /tmp/first.jsonl
step 90 $BB train --resume /tmp/train/checkpoints/step-000002
cp /tmp/train/log.jsonl /tmp/train/config.json $OUT/ 2>/dev/null
python3 -c "
import json
a=[json.loads(l) for l in open('/tmp/first.jsonl')]; b=[json.loads(l) for l in open('/tmp/train/log.jsonl')]
pick=lambda r: {k: r.get(k) for k in ('step','mean_reward','loss','adv_mean','beta')}
print('first run  ', [pick(r) for r in a if r.get('step')==3])
print('resumed run', [pick(r) for r in b if r.get('step')==3])
"
# F: the fast test tier under this machine's torch/transformers/numpy (a GPU user's versions), if time is left
if [ $SECONDS -lt 330 ]; then
  step $((520 - SECONDS)) python3 -m pytest -q --maxfail=30 -n 16 -m "not slow and not vllm" -p no:cacheprovider tests > $OUT/pytest.log 2>&1; tail -15 $OUT/pytest.log
fi
echo "total ${SECONDS}s"

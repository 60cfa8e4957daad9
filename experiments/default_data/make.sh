#!/usr/bin/env bash
# Make (or resume) the real default dataset: train the checkpoints, then sample the
# reference (n = 64) and each checkpoint (n = 256 oracle + 16 pool) with `basis-bench
# oracle`, sharded over SHARDS processes. Every step resumes: rerun to continue.
#
#   experiments/default_data/make.sh [OUT] [SHARDS]     (default: data/smollm2-arith, 2)
#
# Stages: STAGES="train reference late early middle features package" (the default order:
# the late checkpoint, the one furthest from the reference, is sampled first; `features`
# stores the reference model's prompt hidden states in prompts.parquet; `package` copies
# the complete set into basis_bench/data/default with the policies in training order).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-data/smollm2-arith}
SHARDS=${2:-2}
RUN=runs/default_data/train
PROMPTS="arithmetic:n=96,digits=1,steps=1,ops=+-*,seed=1"
COMMON=(--prompts "$PROMPTS" --instruction "Answer with the number only." --answer-format number
        --max-new-tokens 24 --temperature 1.0 --device cpu --seed 0 --chunk-size 4 --out "$OUT")
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

sample() {  # policy ckpt n
    for ((i = 0; i < SHARDS; i++)); do
        basis-bench oracle --model "$2" --policy "$1" --n "$3" --shard "$i/$SHARDS" "${COMMON[@]}" &
    done
    wait
}

for stage in ${STAGES:-train reference late early middle features package}; do
    case $stage in
        train)
            last=$(ls -d "$RUN"/checkpoints/step-* 2>/dev/null | tail -1 || true)
            if [ ! -d "$RUN/checkpoints/step-000040" ]; then
                if [ -n "$last" ]; then basis-bench train --resume "$last"
                else basis-bench train --config experiments/default_data/train.toml; fi
            fi ;;
        reference) sample reference smollm2-135m 64 ;;
        early) sample early "$RUN/checkpoints/step-000005" 272 ;;
        middle) sample middle "$RUN/checkpoints/step-000015" 272 ;;
        late) sample late "$RUN/checkpoints/step-000040" 272 ;;
        features) python experiments/default_data/features.py "$OUT" ;;
        package) python experiments/package.py "$OUT" basis_bench/data/default \
                     --policies reference:64,early:272,middle:272,late:272 ;;
    esac
done

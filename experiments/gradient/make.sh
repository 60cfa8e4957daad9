#!/usr/bin/env bash
# Make (or resume) the gradient set (basis_bench/data/gradient, issue 41): train the
# checkpoints, then sample the reference and each checkpoint (32 samples per prompt each)
# with `basis-bench oracle --store-scores 256`, sharded over SHARDS processes, and package
# what is complete. Every stage resumes: rerun to continue.
#
#   experiments/gradient/make.sh [OUT] [SHARDS]     (default: data/smollm2-gradient, 1)
#
# Stages: STAGES="train reference step-012 step-004 step-008 package" (the default order;
# `package` copies every complete policy into basis_bench/data/gradient without response
# texts, in training order). One projection (--score-seed 0) for every policy, so their
# sketched gradients live in one space; top_p 1, so each sketch is the score of the
# distribution that sampled.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-data/smollm2-gradient}
SHARDS=${2:-1}
RUN=runs/gradient/train
PROMPTS="arithmetic:n=256,digits=1,steps=1,ops=+-*,seed=4"  # = train.toml's train_prompts
COMMON=(--prompts "$PROMPTS" --instruction "Answer with the number only." --answer-format number
        --max-new-tokens 16 --temperature 1.0 --top-p 1.0 --device cpu --seed 0 --chunk-size 4
        --store-scores 256 --score-seed 0 --n 32 --out "$OUT")
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

sample() {  # policy ckpt step
    for ((i = 0; i < SHARDS; i++)); do
        basis-bench oracle --model "$2" --policy "$1" --step "$3" --shard "$i/$SHARDS" "${COMMON[@]}" &
    done
    wait
}

for stage in ${STAGES:-train reference step-012 step-004 step-008 package}; do
    case $stage in
        train)
            last=$(ls -d "$RUN"/checkpoints/step-?????? 2>/dev/null | tail -1 || true)
            if [ ! -d "$RUN/checkpoints/step-000012" ]; then
                if [ -n "$last" ]; then basis-bench train --resume "$last"
                else basis-bench train --config experiments/gradient/train.toml; fi
            fi ;;
        reference) sample reference smollm2-135m 0 ;;
        step-*) sample "$stage" "$RUN/checkpoints/step-000${stage#step-}" "$((10#${stage#step-}))" ;;
        package) python experiments/package.py "$OUT" basis_bench/data/gradient --partial \
                     --drop response --policies reference:32,step-004:32,step-008:32,step-012:32 ;;
    esac
done

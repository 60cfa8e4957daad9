#!/usr/bin/env bash
# Make (or resume) the dense trajectory (basis_bench/data/dense): train the checkpoints,
# check their weights against the manifest, sample the reference (n = 64) and each
# checkpoint (n = 128) with `basis-bench oracle`, sharded over SHARDS processes, and
# package what is complete. Every stage resumes: rerun to continue.
#
#   experiments/dense/make.sh [OUT] [SHARDS]     (default: data/smollm2-dense, 1)
#
# Stages: STAGES="train verify reference step-030 step-015 ... package" (the default order
# below: the reference, then the checkpoints spread over the run first, so a partial set is
# still a trajectory from start to end; `verify` compares each checkpoint's sha256 with
# basis_bench/data/dense/manifest.json and stops on a mismatch; `package` copies every
# complete policy into basis_bench/data/dense without response texts, in training order).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-data/smollm2-dense}
SHARDS=${2:-1}
RUN=runs/dense/train
LAST=step-000030
PROMPTS="arithmetic:n=48,digits=1,steps=1,ops=+-*,seed=2"  # = train.toml's train_prompts
COMMON=(--prompts "$PROMPTS" --instruction "Answer with the number only." --answer-format number
        --max-new-tokens 16 --temperature 1.0 --device cpu --seed 0 --chunk-size 4 --out "$OUT")
ORDER="step-030 step-015 step-006 step-024 step-009 step-021 step-003 step-012 step-018 step-027"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

sample() {  # policy ckpt n
    for ((i = 0; i < SHARDS; i++)); do
        basis-bench oracle --ckpt "$2" --policy "$1" --n "$3" --shard "$i/$SHARDS" "${COMMON[@]}" &
    done
    wait
}

for stage in ${STAGES:-train verify reference $ORDER package}; do
    case $stage in
        train)
            last=$(ls -d "$RUN"/checkpoints/step-?????? 2>/dev/null | tail -1 || true)
            if [ ! -d "$RUN/checkpoints/$LAST" ]; then
                if [ -n "$last" ]; then basis-bench train --resume "$last"
                else basis-bench train --config experiments/dense/train.toml; fi
            fi ;;
        verify) python experiments/dense/manifest.py verify "$RUN" ;;
        reference) sample reference smollm2-135m 64 ;;
        step-*) sample "$stage" "$RUN/checkpoints/step-000${stage#step-}" 128 ;;
        package) python experiments/package.py "$OUT" basis_bench/data/dense --partial --drop response ;;
    esac
done

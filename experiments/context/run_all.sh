#!/usr/bin/env bash
# Every feature ablation of docs/results.md's basis_context section at once, one process per
# setting (jumps and blended), each writing its table row to $1/<name>.txt.
#   experiments/context/run_all.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=$1
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=${PYTHON:-python}
run() {  # name args...
    local name=$1
    shift
    $PY experiments/context/ablation.py "$@" > "$OUT/$name.txt" 2>&1 &
}
for mode in jumps blend; do
    extra=()
    [ "$mode" = blend ] && extra=(--blend)
    run "$mode-none" none "${extra[@]}"
    run "$mode-plain" plain "${extra[@]}"
    run "$mode-text" text "${extra[@]}"
    run "$mode-stored64" stored "${extra[@]}"
    run "$mode-stored16" stored --option components=16 "${extra[@]}"
    run "$mode-stored8" stored --option components=8 "${extra[@]}"
    run "$mode-stored4" stored --option components=4 "${extra[@]}"
    run "$mode-stored8-nolag" stored --option components=8 --option lag=false "${extra[@]}"
done
wait

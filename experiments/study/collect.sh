#!/usr/bin/env bash
# Copy the study's run logs (config.json and log.jsonl of every ARM/seed-S run) from the
# runs folder into the repository, then redraw the figures and tables from the copies: the
# committed logs are enough to redraw everything (weights and rollouts stay out of git).
#
#   experiments/study/collect.sh runs/study/pilot experiments/study/pilot
#   experiments/study/collect.sh runs/study experiments/study/logs
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:?runs folder, e.g. runs/study/pilot}
dest=${2:?destination, e.g. experiments/study/pilot}
arms=()
for run in "$src"/*/seed-*; do
    [[ -f "$run/log.jsonl" ]] || continue
    arm=$(basename "$(dirname "$run")")
    mkdir -p "$dest/$arm/$(basename "$run")"
    cp "$run/config.json" "$run/log.jsonl" "$dest/$arm/$(basename "$run")/"
    [[ " ${arms[*]-} " == *" $dest/$arm "* ]] || arms+=("$dest/$arm")
done
basis-bench train-figures "${arms[@]}" --out "$dest/figures"

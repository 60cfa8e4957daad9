#!/usr/bin/env bash
# Copy the study's finished run logs (config.json and log.jsonl of every ARM/seed-S run whose
# log reached its steps; PARTIAL=1 copies runs still going too) from the runs folder into the
# repository, then redraw the figures, tables and findings from every arm under the
# destination: the committed logs are enough to redraw everything (weights and rollouts stay
# out of git).
#
#   experiments/study/collect.sh runs/study experiments/study/logs
#   PARTIAL=1 experiments/study/collect.sh runs/study/pilot experiments/study/pilot
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:?runs folder, e.g. runs/study}
dest=${2:?destination, e.g. experiments/study/logs}
ORDER=${ORDER:-vanilla reinforce_pp grpo_g8 basis basis_track}
for run in "$src"/*/seed-*; do
    [[ -f "$run/log.jsonl" ]] || continue
    if [[ -z "${PARTIAL:-}" ]]; then
        python - "$run" <<'EOF' || continue
import json, sys
run = sys.argv[1]
steps = json.load(open(f"{run}/config.json"))["steps"]
last = max((json.loads(line)["step"] for line in open(f"{run}/log.jsonl") if line.strip()), default=0)
sys.exit(0 if last >= steps else 1)
EOF
    fi
    copy="$dest/$(basename "$(dirname "$run")")/$(basename "$run")"
    mkdir -p "$copy"
    cp "$run/config.json" "$run/log.jsonl" "$copy/"
done
arms=()
for arm in $ORDER; do [[ -d "$dest/$arm" ]] && arms+=("$dest/$arm"); done
for dir in "$dest"/*/; do
    arm=$(basename "$dir")
    [[ " $ORDER figures " == *" $arm "* ]] || arms+=("$dest/$arm")
done
basis-bench train-figures "${arms[@]}" --out "$dest/figures"

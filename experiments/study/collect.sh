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
src=${1:?runs folder, e.g. runs/study}
dest=${2:?destination, e.g. experiments/study/logs}
# relative to where the command is run, not to the repository root it then works in
src=$(realpath -m -- "$src")
dest=$(realpath -m -- "$dest")
cd "$(dirname "$0")/../.."
# inside the repository, the destination as a path from its root: training_runs.csv records
# the arms' and runs' folders as given, and a clone's absolute path is no one else's
case "$dest" in "$PWD"/*) dest=${dest#"$PWD"/} ;; esac
ORDER=${ORDER:-vanilla reinforce_pp grpo_g8 basis basis_track}
# every run is read before any is copied: a bad one stops collect.sh with nothing copied (the
# runs before it were copied, beside figures of the runs before)
collected=()
for run in "$src"/*/seed-*; do
    [[ -e "$run/log.jsonl" ]] || continue
    if [[ -z "${PARTIAL:-}" ]]; then
        # finished (0), still going (1), or a log or config that cannot be read (2: one
        # line, and collect.sh stops; it printed a traceback, skipped the seed and exited 0)
        status=0
        python - "$run" <<'EOF' || status=$?
import sys
from pathlib import Path

from basis_bench.errors import InputError
from basis_bench.train.loop import read_log
from basis_bench.train.seeds import read_run_config

run = Path(sys.argv[1])
try:
    steps = read_run_config(run / "config.json").get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise InputError(f"{run / 'config.json'}: 'steps' is {steps!r}, not an integer")
    logged = [r.get("step") for r in read_log(run)]
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in logged):
        raise InputError(f"{run / 'log.jsonl'}: a record's step is not an integer")
except InputError as err:
    print(f"collect.sh: error: {err}", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if max(logged, default=0) >= steps else 1)
EOF
        (( status == 1 )) && continue
        (( status == 0 )) || exit 2
    fi
    collected+=("$run")
done
for run in ${collected[@]+"${collected[@]}"}; do
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

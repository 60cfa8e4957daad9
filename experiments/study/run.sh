#!/usr/bin/env bash
# The study (issue 33): every arm with the same seeds, seed-major so that the arms stay
# comparable however far it got. Rerun to go on: finished runs are skipped, interrupted ones
# resume from their latest checkpoint (only the newest is kept: 1.6 GB each).
#
#   experiments/study/run.sh                  # seeds 0,1,2, all five arms, then the figures
#   SEEDS=0 ARMS="vanilla basis" experiments/study/run.sh
#   ARMS="vanilla_lr1e-4 basis_lr1e-4" experiments/study/run.sh   # the second rate
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-0,1,2}
ARMS=${ARMS:-vanilla reinforce_pp grpo_g8 basis basis_track}
export OMP_NUM_THREADS=1
for seed in ${SEEDS//,/ }; do
    for arm in $ARMS; do
        nice -n 19 basis-bench train --config "experiments/study/$arm.toml" --seeds "$seed" \
            --keep-checkpoints 1
    done
done
arms=()  # each arm's runs folder, as its config resolves it (an inherited run_dir too)
for arm in $ARMS; do
    dir=$(python -c 'import sys
from basis_bench.train import make_config
from basis_bench.train.config import read_config_file
print(make_config(read_config_file(sys.argv[1])).run_dir)' "experiments/study/$arm.toml")
    [[ -n "$dir" ]] || { echo "run.sh: error: $arm.toml resolves no run_dir" >&2; exit 2; }
    arms+=("$dir")
done
basis-bench train-figures "${arms[@]}" --out "figures/$(dirname "${arms[0]}" | sed 's|^runs/||')"

#!/usr/bin/env bash
# The strict-task pilot (issue 42 item 4): vanilla and BASIS, one seed, at lr 5e-5 and at
# 1e-4 (where vanilla first collapsed on the study's task), on a task where a collapse cannot
# be a truncation artefact (strict.toml). The study's runner does the work: finished runs are
# skipped, interrupted ones resume; the figures go to figures/study-strict.
#
#   experiments/study/strict/run.sh                      # the four pilot runs, seed 0
#   ARMS="vanilla_lr1e-4 basis_lr1e-4" experiments/study/strict/run.sh
#   SEEDS=1,2 experiments/study/strict/run.sh            # more seeds, once the pilot says so
#   experiments/study/collect.sh runs/study-strict experiments/study/strict/logs
set -euo pipefail
arms=()
for arm in ${ARMS:-vanilla basis vanilla_lr1e-4 basis_lr1e-4}; do arms+=("strict/$arm"); done
SEEDS=${SEEDS:-0} ARMS="${arms[*]}" exec "$(dirname "$0")/../run.sh"

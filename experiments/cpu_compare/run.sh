#!/usr/bin/env bash
# The CPU comparison, one run after another, then the figures. The reference cache in
# runs/cache is built by the first run and reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
for name in basis reinforce_pp vanilla grpo_g8; do
    rm -rf "runs/cpu_compare/$name"
    basis-bench train --config "experiments/cpu_compare/$name.toml"
done
basis-bench train-figures runs/cpu_compare/basis runs/cpu_compare/reinforce_pp \
    runs/cpu_compare/vanilla runs/cpu_compare/grpo_g8 --out figures/training

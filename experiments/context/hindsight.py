"""How much of the per-prompt drift each feature kind predicts, with the oracle values in
hindsight (no replay): leave-one-prompt-out ridge fits of the drift in log-odds,

    y_i = logit v_to(x_i) - logit v_from(x_i)   (values clipped to [0.01, 0.99]),

on an intercept plus the features (standardised; hidden states as their leading principal
components, as ``basis_context`` takes them). Printed: the mean squared LOO residual of y,
for the drift from the reference (what a tilt of the reference must explain) and from the
previous checkpoint (what is left once a prompt's own history is known).

    python experiments/context/hindsight.py [--ridge 4]
"""

from __future__ import annotations

import argparse

import numpy as np

from basis_bench.estimators.context import standardised
from basis_bench.evaluation.dataset import open_dataset
from basis_bench.rollouts.features import prompt_features
from basis_bench.rollouts.store import load_prompts


def loo_residual(x: np.ndarray, y: np.ndarray, ridge: float) -> float:
    """Mean squared leave-one-out residual of a ridge fit (intercept unpenalised): e_i / (1 - h_ii)."""
    penalty = np.full(x.shape[1], ridge)
    penalty[0] = 0.0
    hat = x @ np.linalg.solve(x.T @ x + np.diag(penalty), x.T)
    resid = (y - hat @ y) / (1.0 - np.diag(hat))
    return float(np.mean(resid**2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ridge", type=float, default=4.0)
    args = parser.parse_args()
    ds = open_dataset()
    prompts = load_prompts(ds.root)
    policies = [ds.reference, *ds.checkpoints]
    ids = sorted(set(prompts["prompt_id"].to_list()))  # type: ignore[index]
    values = {p: np.nanmean(ds.rewards[p].rows(ids), axis=1) for p in policies}
    logit = {
        p: np.log(np.clip(v, 0.01, 0.99) / (1 - np.clip(v, 0.01, 0.99))) for p, v in values.items()
    }
    designs = {
        "intercept": None,
        "plain": prompt_features(prompts, ids, "plain"),
        "text": prompt_features(prompts, ids, "text"),
    }
    hidden = prompt_features(prompts, ids, "stored")
    designs |= {f"hidden, {k} PCs": hidden for k in (2, 4, 8, 16, 64)}
    pairs = [(ds.reference, c) for c in ds.checkpoints]
    pairs += list(zip(ds.checkpoints, ds.checkpoints[1:], strict=False))
    print("| features | " + " | ".join(f"{a} -> {b}" for a, b in pairs) + " |")
    print("| --- " * (len(pairs) + 1) + "|")
    for name, feats in designs.items():
        k = int(name.split(", ")[1].split()[0]) if name.startswith("hidden") else 64
        x = standardised(feats, len(ids), k)
        cells = [loo_residual(x, logit[b] - logit[a], args.ridge) for a, b in pairs]
        print(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()

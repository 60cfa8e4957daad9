"""An upper bound for prompt features: ``basis_context`` on the default data's trajectory with
a feature no real featurizer has, each prompt's true drift in hindsight (the oracle values'
log-odds change from each policy to the next, reference -> early -> middle -> late, values clipped to [0.01, 0.99]). If the online fit
cannot use even this, better features cannot help it; the fit is the bottleneck.

    python experiments/context/oracle_feature.py [--blend] [--repeats R] [--ridge L]

--ridge sets the online fit's ridge (basis_context's default 4): issue 31 found the bound
this experiment gave at ridge 4 (0.0163) is one of the fit's settings, not of the form.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import polars as pl

from basis_bench.evaluation.dataset import open_dataset
from basis_bench.evaluation.replay_plan import ReplayPlan
from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
from basis_bench.rollouts.features import FEATURE_COLUMN
from basis_bench.rollouts.store import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blend", action="store_true")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--ridge", type=float, default=None)
    args = parser.parse_args()
    ds = open_dataset()
    prompts = load_prompts(ds.root)
    assert prompts is not None
    ids = prompts["prompt_id"].to_list()
    policies = [ds.reference, *ds.checkpoints]
    v = {p: np.clip(np.nanmean(ds.rewards[p].rows(ids), axis=1), 0.01, 0.99) for p in policies}
    logit = {p: np.log(x / (1 - x)) for p, x in v.items()}
    drift = np.stack([logit[b] - logit[a] for a, b in itertools.pairwise(policies)])
    table = prompts.with_columns(pl.Series(FEATURE_COLUMN, drift.T.tolist()))
    plan = ReplayPlan(
        repeats=args.repeats, features="stored",
        options={"basis_context": {"ridge": args.ridge}} if args.ridge is not None else {},
    )  # fmt: skip
    s = EpochSchedule(batch_size=16, epochs_per_checkpoint=8, blend=args.blend)
    result, _ = replay_trajectory(
        ds.rewards, ds.reference, ds.checkpoints, ["basis_context"], plan, s, prompts=table
    )
    mse = result.filter(pl.col("scope") == "checkpoint")["mse_noise_corrected"].to_list()
    cells = " | ".join(f"{x:.4f}" for x in mse)
    ridge = args.ridge if args.ridge is not None else "default"
    print(f"| true drift (hindsight), ridge {ridge} | {cells} | {sum(mse) / len(mse):.4f} |")


if __name__ == "__main__":
    main()

"""basis_context alone over the default data's trajectory, one feature kind at a time (the
same draws for every kind): which features carry the gain.

    python experiments/context/ablation.py KIND [KIND ...] [--blend] [--repeats R]
        [--option KEY=VALUE ...]     (KIND: none, plain, text, auto, stored)
"""

from __future__ import annotations

import argparse
import json

import polars as pl

from basis_bench.evaluation.dataset import open_dataset
from basis_bench.evaluation.replay_plan import ReplayPlan
from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
from basis_bench.rollouts.store import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kinds", nargs="+")
    parser.add_argument("--blend", action="store_true")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--option", action="append", default=[])
    args = parser.parse_args()
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    ds = open_dataset()
    prompts = load_prompts(ds.root)
    for kind in args.kinds:
        plan = ReplayPlan(repeats=args.repeats, options={"basis_context": options}, features=kind)
        s = EpochSchedule(batch_size=16, epochs_per_checkpoint=8, blend=args.blend)
        table, _ = replay_trajectory(
            ds.rewards, ds.reference, ds.checkpoints, ["basis_context"], plan, s, prompts=prompts
        )
        ck = table.filter(pl.col("scope") == "checkpoint")
        mse = ck["mse_noise_corrected"].to_list()
        cells = " | ".join(f"{x:.4f}" for x in mse)
        print(f"| {kind} {options or ''} | {cells} | {sum(mse) / len(mse):.4f} |")


if __name__ == "__main__":
    main()

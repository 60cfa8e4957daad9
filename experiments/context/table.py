"""Markdown tables of a trajectory replay (trajectory.csv): noise-corrected MSE per checkpoint
(and its mean over checkpoints), selected epochs, and the share of 0/1 baselines.

    python experiments/context/table.py OUT_DIR [estimator ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

EPOCHS = (1, 2, 4, 8)


def main(out: Path, estimators: list[str]) -> None:
    t = pl.read_csv(out / "trajectory.csv")
    names = estimators or list(dict.fromkeys(t["estimator"].to_list()))
    ck = t.filter(pl.col("scope") == "checkpoint")
    checkpoints = list(dict.fromkeys(ck["checkpoint"].to_list()))
    print("| estimator | " + " | ".join(checkpoints) + " | mean | 0/1 baselines |")
    print("| --- " * (len(checkpoints) + 3) + "|")
    for name in names:
        rows = ck.filter(pl.col("estimator") == name)
        mse = [
            rows.filter(pl.col("checkpoint") == c)["mse_noise_corrected"][0] for c in checkpoints
        ]
        extreme = rows["extreme_rate"].mean()
        cells = " | ".join(f"{x:.4f}" for x in mse)
        print(f"| {name} | {cells} | {sum(mse) / len(mse):.4f} | {extreme:.0%} |")
    ep = t.filter(pl.col("scope") == "epoch")
    per = ep["epoch"].max() // len(checkpoints)
    print()
    print("| checkpoint, epoch | " + " | ".join(names) + " |")
    print("| --- " * (len(names) + 1) + "|")
    for i, c in enumerate(checkpoints):
        for e in EPOCHS:
            rows = ep.filter(pl.col("epoch") == i * per + e)
            cells = " | ".join(
                f"{rows.filter(pl.col('estimator') == n)['mse_noise_corrected'][0]:.4f}"
                for n in names
            )
            print(f"| {c} {e} | {cells} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

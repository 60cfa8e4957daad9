"""Print the measured facts of the dense trajectory as the markdown tables of its CARD.md:
per policy (in training order) its step, counts, mean reward, distance from the
reference and truncation; then how the prompts moved: between consecutive checkpoints and
over the run, how many prompts rose and fell by more than 0.2 (a prompt's value is the mean
of its samples, with a standard error of at most 0.5 / sqrt(128) = 0.044 at a checkpoint).
Every number in the card comes from this script.

    python experiments/dense/card.py basis_bench/data/dense
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

from basis_bench.rollouts.store import load_rollouts

MOVE = 0.2


def values(df: pl.DataFrame, order: list[str]) -> np.ndarray:
    """(policies, prompts) success rates, policies in ``order``."""
    v = (
        df.group_by("policy", "prompt_id")
        .agg(pl.col("reward").mean())
        .pivot(on="policy", index="prompt_id", values="reward")
        .sort("prompt_id")
    )
    return np.stack([v[p].to_numpy() for p in order])


def policy_table(df: pl.DataFrame, order: list[str], steps: dict[str, int]) -> str:
    v = values(df, order)
    stats = {
        r["policy"]: r
        for r in df.group_by("policy")
        .agg(
            pl.len().alias("samples"),
            pl.col("prompt_id").n_unique().alias("prompts"),
            (pl.col("finish_reason") == "length").mean().alias("truncated"),
            pl.col("n_tokens").mean().alias("tokens"),
        )
        .iter_rows(named=True)
    }
    rows = [
        "| policy | step | prompts | samples / prompt | mean reward | mean - reference | "
        "corr. with reference | prompts in (0, 1) | truncated | mean tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, p in enumerate(order):
        s = stats[p]
        corr = np.corrcoef(v[i], v[0])[0, 1] if v[i].std() > 0 else float("nan")
        inside = int(((v[i] > 0) & (v[i] < 1)).sum())
        rows.append(
            f"| {p} | {steps[p]} | {s['prompts']} | {s['samples'] / s['prompts']:g} | "
            f"{v[i].mean():.3f} | {v[i].mean() - v[0].mean():+.3f} | {corr:.2f} | {inside} | "
            f"{s['truncated']:.1%} | {s['tokens']:.1f} |"
        )
    return "\n".join(rows)


def movement_table(df: pl.DataFrame, order: list[str]) -> str:
    """Prompts rising / falling by more than MOVE between consecutive policies, and over the
    run: rose at some point and fell at a later one (learned, then forgot)."""
    v = values(df, order)
    rows = ["| from -> to | rose > 0.2 | fell > 0.2 |", "| --- | --- | --- |"]
    for i in range(1, len(order)):
        d = v[i] - v[i - 1]
        rows.append(f"| {order[i - 1]} -> {order[i]} | {(d > MOVE).sum()} | {(d < -MOVE).sum()} |")
    peak_then_drop = (np.maximum.accumulate(v, axis=0) - v).max(axis=0) > MOVE
    rows.append(
        f"| over the run | {(v.max(0) - v[0] > MOVE).sum()} rose above the reference | "
        f"{peak_then_drop.sum()} fell from an earlier peak |"
    )
    return "\n".join(rows)


def main(root: Path) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    steps = {p["policy"]: p["step"] for p in manifest["policies"]}
    df = load_rollouts(root, optional=["n_tokens", "finish_reason"])
    present = set(df["policy"].unique())
    order = [p for p in steps if p in present]
    print(policy_table(df, order, steps), end="\n\n")
    print(movement_table(df, order))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "basis_bench/data/dense"))

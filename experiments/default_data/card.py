"""Print the measured facts of a rollouts dataset as the markdown tables of its CARD.md:
per policy the counts, mean reward, truncation and length, and how far it is from the
reference (mean difference, per-prompt correlation); then how the reference's per-prompt
success rates spread over (0, 1). Every number in the card comes from this script.

    python experiments/default_data/card.py basis_bench/data/default
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
from package import POLICIES  # the training order (this script's folder is on sys.path)

from basis_bench.rollouts.store import load_rollouts

ORDER = {p: i for i, p in enumerate(POLICIES)}


def policy_table(df: pl.DataFrame) -> str:
    """One row per policy; per-prompt values are means over that prompt's samples."""
    per_prompt = df.group_by("policy", "prompt_id").agg(pl.col("reward").mean().alias("v"))
    ref = per_prompt.filter(pl.col("policy") == "reference").select("prompt_id", ref="v")
    rows = [
        "| policy | prompts | samples / prompt | samples | mean reward | "
        "mean - reference | corr. with reference (per prompt) | truncated | mean tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    stats = df.group_by("policy").agg(
        pl.col("prompt_id").n_unique().alias("prompts"),
        pl.len().alias("samples"),
        (pl.col("finish_reason") == "length").mean().alias("truncated"),
        pl.col("n_tokens").mean().alias("tokens"),
    )
    for s in sorted(stats.iter_rows(named=True), key=lambda r: ORDER.get(r["policy"], 9)):
        v = per_prompt.filter(pl.col("policy") == s["policy"]).join(ref, on="prompt_id")
        corr = np.corrcoef(v["v"], v["ref"])[0, 1]
        diff = v["v"].mean() - v["ref"].mean()
        per = s["samples"] / s["prompts"]
        rows.append(
            f"| {s['policy']} | {s['prompts']} | {per:g} | {s['samples']:,} | {v['v'].mean():.3f} | "
            f"{diff:+.3f} | {corr:.2f} | {s['truncated']:.1%} | {s['tokens']:.1f} |"
        )
    return "\n".join(rows)


def reference_spread(df: pl.DataFrame) -> str:
    """How many prompts' reference success rates fall in each bin of [0, 1]."""
    rates = (
        df.filter(pl.col("policy") == "reference")
        .group_by("prompt_id")
        .agg(pl.col("reward").mean())["reward"]
        .to_numpy()
    )
    edges = [0.0, 1e-9, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1 - 1e-9, 1.0]
    names = ["0", "(0, .1)", *(f"[.{i}, .{i + 1})" for i in range(1, 9)), "[.9, 1)", "1"]
    counts = np.histogram(rates, bins=edges)[0]
    head = "| reference rate | " + " | ".join(names) + " |"
    return "\n".join(
        [
            head,
            "|" + " --- |" * (len(names) + 1),
            "| prompts | " + " | ".join(str(c) for c in counts) + " |",
        ]
    )


def main(root: Path) -> None:
    df = load_rollouts(root, optional=["n_tokens", "finish_reason"])
    print(policy_table(df), end="\n\n")
    print(reference_spread(df))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "basis_bench/data/default"))

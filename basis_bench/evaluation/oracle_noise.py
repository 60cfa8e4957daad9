"""When the oracle's own noise rivals the MSE it corrects, and the comparisons cannot be read.

The oracle value of a prompt is the mean of ``--oracle-n`` samples, so the raw MSE against
it holds the oracle's variance, sigma^2 / oracle_n, which ``mse_noise_corrected``
subtracts (:mod:`~basis_bench.evaluation.tables`). The noise adds the same to every
estimator, so where it is as large as their MSE (an oracle of a few samples a prompt) the
raw MSEs' ratios shrink towards 1 (the "vs R++" changes understate), and the corrected MSE
is the difference of two numbers of one size: it can go below zero, and the 95% intervals,
over the replay's draws, leave the oracle's own sampling out. An 8-prompt import with a
4-sample oracle printed "MSE-noise -0.01718, vs R++ -81%" and nothing else;
:func:`noise_warning` is the one line ``evaluate`` prints, and keeps in run.json, then.
"""

from __future__ import annotations

import polars as pl

RIVALS = 1.0
"""The oracle's noise rivals an estimator's MSE once it is at least the corrected MSE (half
the raw one), or the corrected MSE is below zero. A noise of zero (every oracle sample of
every prompt alike, as a checkpoint that never succeeds) rivals nothing, not even an MSE of
zero (it warned "noise up to 0, smallest corrected MSE 0")."""


def rivalled(table: pl.DataFrame) -> pl.DataFrame:
    """Per checkpoint of ``table`` (rows with ``checkpoint``, ``estimator``, ``mse`` and
    ``mse_noise_corrected``), where the oracle's noise rivals some estimator's MSE: the
    checkpoint, its noise (the mean over its rows of raw - corrected), the smallest corrected
    MSE, and the estimators whose corrected MSE is negative; no row where none does."""
    per = table.group_by("checkpoint", maintain_order=True).agg(
        (pl.col("mse") - pl.col("mse_noise_corrected")).mean().alias("noise"),
        pl.col("mse_noise_corrected").min().alias("smallest"),
        pl.col("estimator").filter(pl.col("mse_noise_corrected") < 0).unique().alias("negative"),
    )
    rivals = (pl.col("noise") > 0) & (pl.col("noise") >= RIVALS * pl.col("smallest"))
    return per.filter((pl.col("smallest") < 0) | rivals)


def noise_warning(table: pl.DataFrame, oracle_n: int) -> str | None:
    """One line naming the checkpoints where the oracle's noise rivals the MSE it corrects
    (:func:`rivalled`) and what to do, or None where it nowhere does."""
    if table.is_empty():
        return None
    flagged = rivalled(table)
    if flagged.is_empty():
        return None
    worst = flagged.sort("noise", descending=True).row(0, named=True)
    negative = sorted({e for names in flagged["negative"].to_list() for e in names})
    below = (
        f"; {len(negative)} estimator(s) have a negative noise-corrected MSE "
        f"({', '.join(negative)})"
        if negative
        else ""
    )
    return (
        f"the oracle's noise rivals the MSE it corrects at checkpoint(s) "
        f"{', '.join(flagged['checkpoint'].to_list())} (oracle {oracle_n} samples a prompt: "
        f"noise up to {worst['noise']:.4g}, smallest corrected MSE {worst['smallest']:.4g}"
        f"{below}): the raw MSEs there are half or more oracle noise, so their changes vs "
        "R++ understate and the corrected MSEs and intervals cannot be trusted; give the "
        "oracle more samples a prompt (--oracle-n, or sample more)"
    )

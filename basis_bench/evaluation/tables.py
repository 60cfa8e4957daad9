"""The benchmark's tables, from one checkpoint's :class:`~basis_bench.evaluation.replay.Replay`.

summary.csv (MSE with a normal 95% CI over repeats), g_sweep.csv, by_heterogeneity.csv
(batches binned by the spread of their oracle values), by_difficulty.csv (estimates binned
by oracle value), beta_choice.csv and fixed_beta.csv (the paper's Fig. 2). Because pool
and oracle samples are disjoint, E (b - oracle)^2 = MSE + Var(oracle), so
``mse_noise_corrected`` subtracts the oracle's noise. :func:`write_csv` is the one CSV
writer of the benchmark (atomic, 10 significant digits).
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators.refine import Z_95
from basis_bench.evaluation.gradient import closed_form_scale
from basis_bench.evaluation.replay import KEPT_REPEATS, Moments, Replay, Series
from basis_bench.evaluation.replay_plan import advantage_noise
from basis_bench.guards.folders import real_path
from basis_bench.guards.locks import LOCK_FILE, forget_lock, held_by_a_writer, lock_moved
from basis_bench.guards.outputs import atomic_write, claim_output_dir, lock_output
from basis_bench.settings import option_given, option_label

HETEROGENEITY_BATCHES = KEPT_REPEATS
HETEROGENEITY_BINS = 5
DIFFICULTY_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def write_csv(df: pl.DataFrame, path: str | os.PathLike[str]) -> None:
    """``df`` as CSV at ``path``, written atomically (floats to 10 digits)."""
    with atomic_write(path) as tmp:
        df.write_csv(tmp, float_precision=10)


def new_run_id() -> str:
    return uuid.uuid4().hex


def claim_results_dir(
    out: str | os.PathLike[str], rollouts: str | os.PathLike[str], force: bool = False
) -> Path:
    """``out`` as a results folder (new, empty or already results), never inside the
    rollouts dataset ``rollouts`` (its tables would then be read as rollouts)."""
    out, option = Path(out), option_label("--out")  # out in the notebook API
    root, target = Path(rollouts).resolve(), real_path(out, option)
    if target == root or root in target.parents:
        raise InputError(
            f"{option} {out} is inside the rollouts dataset {rollouts}; write results outside "
            "it (its files would be read as rollouts by every later command)"
        )
    here = Path.cwd().resolve()
    if target == here or target in here.parents or os.path.ismount(target):
        raise InputError(
            f"{option} {out} is the current folder, one above it or a mount point; a run "
            "replaces its results folder whole, which cannot be done there: give a folder "
            f"below it (e.g. {option_given('--out', 'results')})"
        )
    return claim_output_dir(out, "results", force=force, force_flag=False)


@contextlib.contextmanager
def staged_run(out: Path, produced: Iterable[str]) -> Iterator[Path]:
    """Yield a new hidden sibling folder of ``out`` to write one whole run into; on success
    swap it in for ``out`` (keeping ``out``'s files that the run does not write, such as the
    marker and sensitivity's table), on error remove it and leave ``out`` as it was.

    The staging folder takes ``out``'s mode (a group-shared folder stays shared) and its own
    writer lock, which becomes ``out``'s lock with the swap: a later run removes what a killed
    one left behind, knowing it by that lock being free, never by a process id in a name.
    """
    produced = set(produced)
    _remove_stale(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=STAGING, dir=out.parent))
    os.chmod(staging, stat.S_IMODE(out.stat().st_mode))
    try:
        lock_output(staging)
        yield staging
        for entry in out.iterdir():
            dest = staging / entry.name
            skip = entry.name in produced or entry.name == LOCK_FILE  # staging has its own
            if skip or dest.exists() or entry.name.endswith(".tmp"):
                continue
            if entry.is_dir():
                shutil.copytree(entry, dest)
            else:
                shutil.copy2(entry, dest)
        old = out.parent / f".{out.name}.{new_run_id()}{SET_ASIDE}"
        os.rename(out, old)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(old, out)
            raise
        lock_moved(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            forget_lock(staging)
            shutil.rmtree(staging, ignore_errors=True)


STAGING, SET_ASIDE = ".staging", ".old"


def _remove_stale(out: Path) -> None:
    """Remove the staging and set-aside folders a killed run into ``out`` left beside it:
    named exactly ``.OUT.TOKEN.staging`` or ``.OUT.TOKEN.old`` (TOKEN without dots, so never
    those of another output, e.g. ``OUT.777777``), real folders, whose writer lock is free."""
    exact = re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]+({re.escape(STAGING)}|{SET_ASIDE})")
    for leftover in out.parent.glob(f".{glob.escape(out.name)}.*"):
        if not exact.fullmatch(leftover.name) or leftover.is_symlink() or not leftover.is_dir():
            continue
        if not held_by_a_writer(leftover):
            shutil.rmtree(leftover, ignore_errors=True)


def _series_row(s: Series, noise: Moments, spread: Moments, batch_size: int) -> dict[str, Any]:
    n = s.batch_mse.n
    mse = s.batch_mse.mean
    half = Z_95 * s.batch_mse.std() / math.sqrt(n) if n > 1 else math.nan
    return {
        "estimator": s.estimator,
        "rollouts_per_prompt": s.rollouts_per_prompt,
        "mse": mse,
        "mse_noise_corrected": mse - noise.mean,
        "ci_low": mse - half,
        "ci_high": mse + half,
        "extreme_rate": s.extreme.mean,
        "n_estimates": n * batch_size,
        **advantage_noise(
            mse - noise.mean, spread.mean, closed_form_scale(s.estimator, s.rollouts_per_prompt)
        ),
    }


def summary_table(rep: Replay, batch_size: int) -> pl.DataFrame:
    """summary.csv rows: MSE over all (repeat, prompt) estimates with a normal 95% CI over repeats."""
    rows = [
        {"checkpoint": rep.checkpoint, **_series_row(s, rep.noise, rep.spread, batch_size)}
        for s in rep.series.values()
    ]
    return pl.DataFrame(rows)


def g_sweep_table(rep: Replay, batch_size: int) -> pl.DataFrame:
    """g_sweep.csv rows: group estimators at each G the pool allows."""
    rows = [
        {"checkpoint": rep.checkpoint, **_series_row(s, rep.noise, rep.spread, batch_size)}
        for s in rep.sweep.values()
    ]
    return (
        pl.DataFrame(rows).rename({"rollouts_per_prompt": "group_size"}) if rows else pl.DataFrame()
    )


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value for edges e_0 < ... < e_m: [e_i, e_{i+1}), the last bin closed."""
    return np.clip(np.searchsorted(edges[1:-1], values, side="right"), 0, len(edges) - 2)


def heterogeneity_edges(spread: np.ndarray, bins: int = HETEROGENEITY_BINS) -> np.ndarray:
    """Equal-width edges from the observed min to max of s_b (one bin when all are equal)."""
    lo, hi = float(spread.min()), float(spread.max())
    return np.linspace(lo, hi, bins + 1) if hi > lo else np.array([lo, hi])


def heterogeneity_table(rep: Replay, n_batches: int = HETEROGENEITY_BATCHES) -> pl.DataFrame:
    """by_heterogeneity.csv: the first ``n_batches`` batches binned by s_b = std of their oracle values.

    MSE is averaged over the prompts of a batch, then over the batches of a bin.
    """
    spread = rep.batch_spread[:n_batches]
    edges = heterogeneity_edges(spread)
    bins = bin_index(spread, edges)
    noise = rep.batch_noise[:n_batches]
    rows = []
    for s in rep.series.values():
        mse_r = s.first_mse.array()[:n_batches]
        for i in range(len(edges) - 1):
            m = bins == i
            rows.append(
                {
                    "checkpoint": rep.checkpoint,
                    "estimator": s.estimator,
                    "rollouts_per_prompt": s.rollouts_per_prompt,
                    "bin": i,
                    "bin_low": float(edges[i]),
                    "bin_high": float(edges[i + 1]),
                    "n_batches": int(m.sum()),
                    "mse": float(mse_r[m].mean()) if m.any() else math.nan,
                    "mse_noise_corrected": float((mse_r[m] - noise[m]).mean())
                    if m.any()
                    else math.nan,
                }
            )
    return pl.DataFrame(rows)


def difficulty_table(rep: Replay) -> pl.DataFrame:
    """by_difficulty.csv: estimates of the first 10 repeats binned by oracle value
    ([0,.2) [.2,.4) [.4,.6) [.6,.8) [.8,1]); MSE over the estimates in each bin."""
    edges = np.asarray(DIFFICULTY_EDGES)
    d = rep.difficulty.with_columns(
        pl.Series("bin", bin_index(rep.difficulty["oracle"].to_numpy(), edges))
    )
    grid = (
        d.select("estimator", "rollouts_per_prompt")
        .unique(maintain_order=True)
        .join(pl.DataFrame({"bin": np.arange(len(edges) - 1)}), how="cross")
    )
    agg = d.group_by("estimator", "rollouts_per_prompt", "bin").agg(
        pl.len().alias("n_estimates"),
        pl.col("sq_err").mean().alias("mse"),
        (pl.col("sq_err") - pl.col("noise")).mean().alias("mse_noise_corrected"),
    )
    out = grid.join(agg, on=["estimator", "rollouts_per_prompt", "bin"], how="left").with_columns(
        pl.col("n_estimates").fill_null(0),
        pl.col("bin").map_elements(lambda i: edges[i], return_dtype=pl.Float64).alias("bin_low"),
        pl.col("bin")
        .map_elements(lambda i: edges[i + 1], return_dtype=pl.Float64)
        .alias("bin_high"),
    )
    return out.select(
        pl.lit(rep.checkpoint).alias("checkpoint"),
        "estimator",
        "rollouts_per_prompt",
        "bin",
        "bin_low",
        "bin_high",
        pl.col("n_estimates").cast(pl.Int64),
        "mse",
        "mse_noise_corrected",
    )


def beta_table(rep: Replay) -> pl.DataFrame:
    """beta_choice.csv: how often online calibration chose each beta (one choice per repeat)."""
    total = max(int(rep.beta_counts.sum()), 1)
    return pl.DataFrame(
        {
            "checkpoint": rep.checkpoint,
            "beta_index": np.arange(len(rep.betas)),
            "beta": rep.betas,
            "count": rep.beta_counts,
            "share": rep.beta_counts / total,
        }
    )


def fixed_beta_table(rep: Replay) -> pl.DataFrame:
    """fixed_beta.csv (Fig. 2): MSE of the initial V^_beta and refined V~_beta at each fixed beta."""
    mse = rep.fixed_beta / rep.fixed_beta_n
    noise = rep.noise.mean
    return pl.DataFrame(
        {
            "checkpoint": rep.checkpoint,
            "beta": rep.betas,
            "initial_mse": mse[0],
            "refined_mse": mse[1],
            "initial_mse_noise_corrected": mse[0] - noise,
            "refined_mse_noise_corrected": mse[1] - noise,
        }
    )

"""Figures of training runs: learning curves per estimator and the calibrated beta (Fig. 8).

Reads each run's ``config.json`` and ``log.jsonl`` (written by :mod:`basis_bench.train.loop`):

==================  ==========================================================================
learning_curves     held-out greedy accuracy (left) and training mean reward, rolling mean
                    (right), against step, one line per run
beta                beta_t chosen by BASIS's calibration against step (log scale; beta = inf,
                    the reference policy, drawn on the top line)
training_summary    CSV: run, label, step, eval_accuracy, mean_reward (one row per logged step)
==================  ==========================================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.bench.figures import COLOURS, label
from basis_bench.errors import InputError
from basis_bench.train.loop import read_log

BETA_TICKS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def load_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], pl.DataFrame]:
    """A run's configuration and its log as a frame (one row per step record)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise InputError(f"{run_dir}: no config.json; is this a training run directory?")
    config = json.loads(path.read_text(encoding="utf-8"))
    columns = ("step", "mean_reward", "eval_accuracy", "beta")
    rows = [{c: r.get(c) for c in columns} for r in read_log(run_dir)]
    if not rows:
        raise InputError(f"{run_dir}: log.jsonl is empty")
    schema = {
        "step": pl.Int64,
        "mean_reward": pl.Float64,
        "eval_accuracy": pl.Float64,
        "beta": pl.Float64,
    }
    return config, pl.DataFrame(rows, schema=schema, orient="row")


def run_label(config: dict[str, Any], with_loss: bool) -> str:
    """``BASIS``, ``GRPO (G=8)``, ... plus the loss when runs differ in it."""
    from basis_bench.estimators import get

    try:
        group = get(config["estimator"]).rollouts_per_prompt(config["group_size"])
    except InputError:
        group = 1
    text = label(config["estimator"], group)
    return f"{text}, {config['loss'].upper()}" if with_loss else text


def plot_training(
    run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], smooth: int = 5
) -> list[Path]:
    """Draw ``learning_curves.png`` and ``beta.png`` and write ``training_summary.csv``."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not run_dirs:
        raise InputError("give at least one training run directory")
    if smooth < 1:
        raise InputError(f"--smooth must be at least 1, got {smooth}")
    runs = [(Path(d), *load_run(d)) for d in run_dirs]
    with_loss = len({c["loss"] for _, c, _ in runs}) > 1
    names = [run_label(c, with_loss) for _, c, _ in runs]
    estimators = [c["estimator"] for _, c, _ in runs]
    unique = len(set(estimators)) == len(estimators)
    names = [
        n if names.count(n) == 1 else f"{n} ({p.name})"
        for n, (p, _, _) in zip(names, runs, strict=True)
    ]
    colours = [
        COLOURS.get(e, f"C{i}") if unique else f"C{i % 10}" for i, e in enumerate(estimators)
    ]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, (acc_ax, rew_ax) = plt.subplots(1, 2, figsize=(6.75, 2.6), sharex=True)
    summary = []
    for (path, _, log), name, colour in zip(runs, names, colours, strict=True):
        evals = log.filter(pl.col("eval_accuracy").is_not_null())
        acc_ax.plot(
            evals["step"], evals["eval_accuracy"], marker="o", ms=3, color=colour, label=name
        )
        train = log.filter(pl.col("mean_reward").is_not_null())
        curve = train["mean_reward"].rolling_mean(smooth, min_samples=1)
        rew_ax.plot(train["step"], curve, color=colour, label=name)
        summary.append(
            log.with_columns(pl.lit(str(path)).alias("run"), pl.lit(name).alias("label"))
        )
    acc_ax.set(xlabel="step", ylabel="held-out greedy accuracy")
    rew_ax.set(xlabel="step", ylabel=f"training reward\n(rolling mean of {smooth})")
    acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    acc_ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    written.append(_save(fig, out / "learning_curves.png"))
    plt.close(fig)

    with_beta = [
        (log, name, colour)
        for (_, _, log), name, colour in zip(runs, names, colours, strict=True)
        if log["beta"].is_not_null().any()
    ]
    if with_beta:
        fig, ax = plt.subplots(figsize=(3.4, 2.4))
        betas = np.concatenate([log["beta"].drop_nulls().to_numpy() for log, _, _ in with_beta])
        finite = betas[np.isfinite(betas)]
        low = float(finite.min()) if finite.size else 1.0
        top = 2 * float(finite.max()) if finite.size else 100.0
        for log, name, colour in with_beta:
            rows = log.filter(pl.col("beta").is_not_null())
            beta = rows["beta"].to_numpy()
            ax.plot(
                rows["step"],
                np.where(np.isinf(beta), top, beta),
                marker=".",
                ms=4,
                color=colour,
                label=name,
            )
        ax.set_yscale("log")
        ax.axhline(top, color="0.8", lw=0.8, zorder=0)
        ticks = [t for t in BETA_TICKS if low / 1.5 <= t <= top / 1.5]
        ax.set_yticks([*ticks, top], [*(f"{t:g}" for t in ticks), "∞"])
        ax.minorticks_off()
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="step", ylabel=r"calibrated $\beta_t$")
        if len(with_beta) > 1:
            ax.legend(fontsize=7, frameon=False)
        fig.tight_layout()
        written.append(_save(fig, out / "beta.png"))
        plt.close(fig)

    table = pl.concat(summary, how="diagonal_relaxed").select(
        "run", "label", "step", "eval_accuracy", "mean_reward", "beta"
    )
    csv = out / "training_summary.csv"
    table.with_columns(pl.col("beta").map_elements(_beta_text, return_dtype=pl.String)).write_csv(
        csv
    )
    written.append(csv)
    return written


def _beta_text(beta: float) -> str:
    return "inf" if math.isinf(beta) else f"{beta:.6g}"


def _save(fig: Any, path: Path) -> Path:
    """Write to a temporary name, then rename: no half-written PNG under the real name."""
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=200)
    os.replace(tmp, path)
    return path

"""Figures of training runs: learning curves per estimator and the calibrated beta (Fig. 8).

Reads each run's ``config.json`` and ``log.jsonl`` (written by :mod:`basis_bench.train.loop`):

==================  ==========================================================================
learning_curves     held-out greedy accuracy (left) and training mean reward, rolling mean
                    (right), against step, one line per run
beta                beta_t chosen by BASIS's calibration against step (log scale; beta = inf,
                    the reference policy, drawn on the top line)
training_summary    CSV: run, label, step, eval_accuracy, mean_reward (one row per logged step)
==================  ==========================================================================

Display names and colours come from the caller (``basis-bench train-figures`` passes the
benchmark's, so both kinds of figure agree); this module depends on no other subsystem.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench import bounded_json
from basis_bench.errors import InputError
from basis_bench.outputs import claim_output_dir, holds_output_locks
from basis_bench.quoting import plain_math
from basis_bench.settings import check_scalar
from basis_bench.train.loop import read_log

BETA_TICKS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)

Labeller = Callable[[str, int], str]  # (estimator, rollouts per prompt) -> display name
Run = tuple[Path, dict[str, Any], pl.DataFrame]  # directory, config, log


def plain_label(estimator: str, rollouts: int) -> str:
    """The estimator's registered name, with G for group estimators: ``grpo (G=8)``."""
    return f"{estimator} (G={rollouts})" if rollouts > 1 else estimator


def load_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], pl.DataFrame]:
    """A run's configuration and its log as a frame (one row per step record)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise InputError(f"{run_dir}: no config.json; is this a training run directory?")
    try:
        config = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a JSON configuration ({err})") from err
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a JSON configuration (a {type(config).__name__})")
    for key, kind in (("estimator", str), ("group_size", int), ("loss", str)):
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            raise InputError(f"{path}: {key!r} is missing or not a {kind.__name__}")
    columns = ("step", "mean_reward", "eval_accuracy", "beta")
    rows = [{c: r.get(c) for c in columns} for r in read_log(run_dir)]
    if not rows:
        raise InputError(f"{run_dir}: log.jsonl is empty")
    for number, row in enumerate(rows, start=1):
        for column, value in row.items():
            wanted = int if column == "step" else (int, float)
            if (value is not None or column == "step") and (
                isinstance(value, bool) or not isinstance(value, wanted)
            ):
                raise InputError(
                    f"{run_dir}: step record {number} of log.jsonl: {column!r} is {value!r}, "
                    "not a number"
                )
        step = int(row["step"] or 0)  # an int: checked above
        if not 0 <= step < 2**63:  # 10^20 was a polars overflow traceback
            raise InputError(
                f"{run_dir}: step record {number} of log.jsonl: 'step' is {step}, not a step number"
            )
    schema = {
        "step": pl.Int64,
        "mean_reward": pl.Float64,
        "eval_accuracy": pl.Float64,
        "beta": pl.Float64,
    }
    return config, pl.DataFrame(rows, schema=schema, orient="row")


def run_label(config: dict[str, Any], with_loss: bool, label: Labeller = plain_label) -> str:
    """``BASIS``, ``GRPO (G=8)``, ... plus the loss when runs differ in it."""
    from basis_bench.estimators import get

    try:
        group = get(config["estimator"]).rollouts_per_prompt(config["group_size"])
    except InputError:
        group = 1
    text = label(config["estimator"], group)
    return f"{text}, {plain_math(config['loss'].upper())}" if with_loss else text


@holds_output_locks
def plot_training(
    run_dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    smooth: int = 5,
    label: Labeller = plain_label,
    colours: Mapping[str, str] | None = None,
    force: bool = False,
) -> list[Path]:
    """Draw ``learning_curves.png`` and ``beta.png`` and write ``training_summary.csv`` into
    ``out``, a new or empty folder or one of training figures (``force``: any folder).

    ``label`` names a run's estimator; ``colours`` maps estimator names to matplotlib
    colours (used when every run has its own estimator; otherwise the default cycle).
    """
    import matplotlib as mpl

    mpl.use("Agg")

    if not run_dirs:
        raise InputError("give at least one training run directory")
    check_scalar(smooth, "--smooth", int, min_val=1)
    given = [os.path.realpath(d) for d in run_dirs]
    twice = next((d for i, d in enumerate(run_dirs) if given[i] in given[:i]), None)
    if twice is not None:  # its curves would be drawn twice, under two labels
        raise InputError(f"run {str(twice)!r} is given twice; give each run once")
    runs: list[Run] = [(Path(d), *load_run(d)) for d in run_dirs]
    with_loss = len({c["loss"] for _, c, _ in runs}) > 1
    names = [run_label(c, with_loss, label) for _, c, _ in runs]
    estimators = [c["estimator"] for _, c, _ in runs]
    unique = len(set(estimators)) == len(estimators)
    names = [
        n if names.count(n) == 1 else f"{n} ({plain_math(p.name)})"
        for n, (p, _, _) in zip(names, runs, strict=True)
    ]
    palette = colours or {}
    styles = [palette.get(e, f"C{i}") if unique else f"C{i % 10}" for i, e in enumerate(estimators)]
    out = claim_output_dir(out, "training-figures", force=force)
    written = [_learning_curves(runs, names, styles, smooth, out / "learning_curves.png")]
    beta = _beta_figure(runs, names, styles, out / "beta.png")
    if beta is not None:
        written.append(beta)
    elif (out / "beta.png").is_file():  # an earlier call's, of other runs: was kept as if of these
        (out / "beta.png").unlink()
    written.append(_summary(runs, names, out / "training_summary.csv"))
    return written


def _learning_curves(
    runs: Sequence[Run], names: Sequence[str], colours: Sequence[str], smooth: int, path: Path
) -> Path:
    """Held-out accuracy (left) and the rolling-mean training reward (right) against step."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (acc_ax, rew_ax) = plt.subplots(1, 2, figsize=(6.75, 2.6), sharex=True)
    for (_, _, log), name, colour in zip(runs, names, colours, strict=True):
        evals = log.filter(pl.col("eval_accuracy").is_not_null())
        acc_ax.plot(
            evals["step"], evals["eval_accuracy"], marker="o", ms=3, color=colour, label=name
        )
        train = log.filter(pl.col("mean_reward").is_not_null())
        curve = train["mean_reward"].rolling_mean(smooth, min_samples=1)
        rew_ax.plot(train["step"], curve, color=colour, label=name)
    acc_ax.set(xlabel="step", ylabel="held-out greedy accuracy")
    rew_ax.set(xlabel="step", ylabel=f"training reward\n(rolling mean of {smooth})")
    acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    acc_ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def _beta_figure(
    runs: Sequence[Run], names: Sequence[str], colours: Sequence[str], path: Path
) -> Path | None:
    """beta_t against step for the runs that report it (None when none does)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with_beta = [
        (log, name, colour)
        for (_, _, log), name, colour in zip(runs, names, colours, strict=True)
        if log["beta"].is_not_null().any()
    ]
    if not with_beta:
        return None
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
    _save(fig, path)
    plt.close(fig)
    return path


def _summary(runs: Sequence[Run], names: Sequence[str], path: Path) -> Path:
    """training_summary.csv: run, label, step, eval_accuracy, mean_reward, beta."""
    from basis_bench.outputs import atomic_write

    table = pl.concat(
        [
            log.with_columns(pl.lit(str(p)).alias("run"), pl.lit(name).alias("label"))
            for (p, _, log), name in zip(runs, names, strict=True)
        ],
        how="diagonal_relaxed",
    ).select("run", "label", "step", "eval_accuracy", "mean_reward", "beta")
    text = table.with_columns(pl.col("beta").map_elements(_beta_text, return_dtype=pl.String))
    with atomic_write(path) as tmp:
        text.write_csv(tmp)
    return path


def _beta_text(beta: float) -> str:
    return "inf" if math.isinf(beta) else f"{beta:.6g}"


def _save(fig: Any, path: Path) -> Path:
    """A PNG through the store's atomic writer: no half-written file under the real name."""
    from basis_bench.outputs import atomic_write

    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=200, format="png")
    return path

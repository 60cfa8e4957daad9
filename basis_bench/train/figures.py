"""Figures of training runs: learning curves per arm with seed bands, and the calibrated
beta (Fig. 8).

Each argument is an **arm**: a folder of ``seed-S`` runs (``basis-bench train --seeds``) or
one run (:mod:`basis_bench.train.summary`). Reads each run's ``config.json`` and
``log.jsonl`` (written by :mod:`basis_bench.train.loop`):

==================  ==========================================================================
learning_curves     held-out greedy accuracy (left) and training mean reward, rolling mean
                    (right), against step: per arm the mean over seeds and its 95% t-interval
                    band (a line alone for one seed), on the whole [0, 1]; PNG and PDF
beta                beta_t chosen by BASIS's calibration against step, one line per run (log
                    scale; beta = inf, the reference policy, a hollow marker on the top line
                    that no line joins); PNG, PDF
value_error         the value probe's noise-corrected squared error of the baseline against
                    step (:mod:`basis_bench.train.probe`), per arm the mean over the seeds
                    that logged it and its 95% t-interval band, as the accuracy; only when
                    some run has probe records; PNG, PDF
training_summary    CSV: arm, run, label, step, eval_accuracy, mean_reward, truncated_share
                    (responses cut at max_new_tokens), beta, probe_value_error and the
                    policy measures (entropy, eval_strict_accuracy, ...; one row per
                    logged step)
training_runs       CSV: one row per run, its final, peak, peak-to-final drop, decline,
                    largest dip, half-budget accuracy, rollouts, wall hours, mean value
                    error, collapsed (:func:`basis_bench.train.summary.collapsed`)
training_table      CSV and markdown: one row per arm, each number's mean and 95% interval
training_findings   CSV and markdown: the paper's three training findings, each judged
                    reproduced / not reproduced / not resolvable / confounded / not
                    testable here, with why (:mod:`basis_bench.train.findings`); only
                    when the arms of some finding are given
==================  ==========================================================================

Display names and colours come from the caller (``basis-bench train-figures`` passes the
benchmark's, and sets its paper style, so both kinds of figure agree); this module depends
on no other subsystem.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards.outputs import claim_output_dir, holds_output_locks, save_figure
from basis_bench.guards.quoting import plain_math, printable
from basis_bench.settings import check_scalar
from basis_bench.train.findings import write_findings
from basis_bench.train.summary import (
    POLICY_MEASURES,
    VALUE_ERROR,
    Arm,
    RunLog,
    load_arm,
    step_bands,
    write_tables,
)

BETA_TICKS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)

Labeller = Callable[[str, int], str]  # (estimator, rollouts per prompt) -> display name


def plain_label(estimator: str, rollouts: int) -> str:
    """The estimator's registered name, with G for group estimators: ``grpo (G=8)``."""
    return f"{estimator} (G={rollouts})" if rollouts > 1 else estimator


def run_label(config: dict[str, Any], with_loss: bool, label: Labeller = plain_label) -> str:
    """``BASIS``, ``GRPO (G=8)``, ... plus the loss when runs differ in it."""
    from basis_bench.estimators import get

    try:
        group = get(config["estimator"]).rollouts_per_prompt(config["group_size"])
    except InputError:
        group = 1
    text = label(config["estimator"], group)
    return f"{text}, {plain_math(config['loss'].upper())}" if with_loss else text


def arm_names(arms: Sequence[Arm], label: Labeller = plain_label) -> list[str]:
    """Each arm's :func:`run_label`, with its folder's name where two labels coincide
    (``BASIS (basis_n64)``, a sweep of one estimator's settings)."""
    with_loss = len({a.config["loss"] for a in arms}) > 1
    names = [run_label(a.config, with_loss, label) for a in arms]
    return [  # a folder's name with control characters escaped (an ESC reached the tables)
        n if names.count(n) == 1 else f"{n} ({plain_math(printable(_distinct_tail(a.path, arms)))})"
        for n, a in zip(names, arms, strict=True)
    ]


def table_cell(text: str) -> str:
    """A label as a Markdown table cell: ``|`` escaped (a folder named ``a|b`` split its
    row of training_table.md), control characters too."""
    return printable(text).replace("|", "\\|")


def _distinct_tail(path: Path, arms: Sequence[Arm]) -> str:
    """The fewest trailing parts of ``path`` that no other arm's path ends in: its folder's
    name, or more (``a/run`` and ``b/run`` were two rows labelled alike)."""
    parts = Path(os.path.realpath(path)).parts
    others = [Path(os.path.realpath(a.path)).parts for a in arms if a.path != path]
    for k in range(1, len(parts) + 1):
        if all(o[-k:] != parts[-k:] for o in others):
            return str(Path(*parts[-k:]))
    return str(path)


@holds_output_locks
def plot_training(
    arm_dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    smooth: int = 5,
    label: Labeller = plain_label,
    colours: Mapping[str, str] | None = None,
    force: bool = False,
) -> list[Path]:
    """Draw the learning curves and beta (PNG + PDF) and write the summary tables into
    ``out``, a new or empty folder or one of training figures (``force``: any folder).

    ``arm_dirs``: arms, each a folder of ``seed-S`` runs or one run. ``label`` names an
    arm's estimator; ``colours`` maps estimator names to matplotlib colours (used when every
    arm has its own estimator; otherwise the default cycle).
    """
    import matplotlib as mpl

    mpl.use("Agg")

    if not arm_dirs:
        raise InputError("give at least one training run directory")
    check_scalar(smooth, "--smooth", int, min_val=1)
    given = [os.path.realpath(d) for d in arm_dirs]
    twice = next((d for i, d in enumerate(arm_dirs) if given[i] in given[:i]), None)
    if twice is not None:  # its curves would be drawn twice, under two labels
        raise InputError(f"run {str(twice)!r} is given twice; give each run once")
    from basis_bench.train.seeds import check_arm_seeds

    arms = [load_arm(d) for d in arm_dirs]
    for arm in arms:  # a run folder proves what it holds: no seed drawn twice
        check_arm_seeds(arm.path, [(run[0], run[1]) for run in arm.runs])
    seen: dict[str, Path] = {}
    for arm in arms:  # nor one run in two arms (a link to it, or an arm and its own run)
        for run_dir, _, _ in arm.runs:
            real = os.path.realpath(run_dir)
            if real in seen:
                raise InputError(
                    f"run {str(run_dir)!r} is given twice (as {str(seen[real])!r} too); "
                    "give each run once"
                )
            seen[real] = Path(run_dir)
    names = arm_names(arms, label)
    estimators = [a.config["estimator"] for a in arms]
    unique = len(set(estimators)) == len(estimators)
    palette = colours or {}
    styles = [palette.get(e, f"C{i}") if unique else f"C{i % 10}" for i, e in enumerate(estimators)]
    out = claim_output_dir(out, "training-figures", force=force)
    written = save_figure(learning_curves(arms, names, styles, smooth), out, "learning_curves")
    runs = [
        (run, name, colour)
        for a, name, colour in zip(arms, names, styles, strict=True)
        for run in a.runs
    ]
    beta = beta_figure(runs)
    written += _only_if_drawn(save_figure(beta, out, "beta") if beta else [], out, "beta")
    errors = _value_error_figure(arms, names, styles, out)
    written += _only_if_drawn(errors, out, "value_error")
    written.append(_summary(arms, names, out / "training_summary.csv"))
    cells = [table_cell(n) for n in names]  # the tables and findings are Markdown
    written += write_tables(arms, cells, out)
    findings = write_findings(arms, cells, out)
    return written + _only_if_drawn(findings, out, "training_findings", ("csv", "md"))


MARKERS = ("o", "s", "^", "D", "v", "P")
LINE_STYLES = ("-", "--", "-.", ":")


def learning_curves(
    arms: Sequence[Arm], names: Sequence[str], colours: Sequence[str], smooth: int
) -> Any:
    """Held-out accuracy (left) and the rolling-mean training reward (right) against step:
    each arm's mean over its seeds, with the 95% t-interval as a band."""
    import matplotlib.pyplot as plt
    from matplotlib import patheffects
    from matplotlib.ticker import MaxNLocator

    fig, (acc_ax, rew_ax) = plt.subplots(1, 2, figsize=(6.75, 2.6), sharex=True)
    for i, (arm, name, colour) in enumerate(zip(arms, names, colours, strict=True)):
        seeds = len(arm.runs)
        legend = name if seeds == 1 else f"{name}, {seeds} seeds"
        # arms whose means coincide hid each other, and a grey line vanished on the bands
        # (the study's vanilla): each arm has its own marker and line style, a white edge,
        # and the first-listed arms are drawn on top
        look = {
            "ls": LINE_STYLES[i % len(LINE_STYLES)],
            "zorder": 3 + len(arms) - i,
            "path_effects": [patheffects.withStroke(linewidth=2.2, foreground="white")],
        }
        for ax, column, window, marker in (
            (acc_ax, "eval_accuracy", 1, MARKERS[i % len(MARKERS)]),
            (rew_ax, "mean_reward", smooth, None),
        ):
            band = step_bands(arm, column, window)
            ax.plot(
                band["step"], band["mean"], marker=marker, ms=3, color=colour, label=legend, **look
            )
            half = band["ci95"].fill_null(0.0)  # accuracy and reward lie in [0, 1]
            low, high = (band["mean"] - half).clip(0, 1), (band["mean"] + half).clip(0, 1)
            ax.fill_between(band["step"], low, high, color=colour, alpha=0.2, lw=0)
    for ax in (acc_ax, rew_ax):  # the whole range: 0.405 -> 0.432 (one prompt) was zoomed
        ax.set_ylim(-0.02, 1.02)  # into a steep rise by an axis fitted to the data
    acc_ax.set(xlabel="step", ylabel="held-out greedy accuracy")
    rew_ax.set(xlabel="step", ylabel=f"training reward\n(rolling mean of {smooth})")
    acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    acc_ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def _only_if_drawn(
    written: list[Path], out: Path, stem: str, exts: tuple[str, ...] = ("png", "pdf")
) -> list[Path]:
    """``written``; when nothing was (no run logs it), an earlier call's ``stem`` files,
    of other runs, are deleted rather than kept as if of these."""
    if not written:
        for ext in exts:
            (out / f"{stem}.{ext}").unlink(missing_ok=True)
    return written


def _value_error_figure(
    arms: Sequence[Arm], names: Sequence[str], colours: Sequence[str], out: Path
) -> list[Path]:
    """The value probe's corrected squared error against step: per arm that logged it, the
    mean over its seeds with the 95% t-interval as a band (nothing when no arm did)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    probed = [
        (arm, name, colour)
        for arm, name, colour in zip(arms, names, colours, strict=True)
        if any(log[VALUE_ERROR].is_not_null().any() for _, _, log in arm.runs)
    ]
    if not probed:
        return []
    fig, ax = plt.subplots(figsize=(3.4, 2.6))
    for arm, name, colour in probed:
        band = step_bands(arm, VALUE_ERROR)
        seeds = int(band["n"].to_numpy().max())
        legend = name if seeds == 1 else f"{name}, {seeds} seeds"
        ax.plot(band["step"], band["mean"], marker="o", ms=3, color=colour, label=legend)
        half = band["ci95"].fill_null(0.0)  # unbounded: the corrected error may be < 0
        ax.fill_between(
            band["step"], band["mean"] - half, band["mean"] + half, color=colour, alpha=0.2, lw=0
        )
    ax.axhline(0.0, color="0.8", lw=0.8, zorder=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel="value error $(b - v)^2$\n(noise-corrected)")
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return save_figure(fig, out, "value_error")


def beta_figure(runs: Sequence[tuple[RunLog, str, str]]) -> Any:
    """beta_t against step, one line per run that reports it, coloured by arm (None when
    none does); an infinite beta is a hollow marker on the top line, joined by no line."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with_beta = [
        (log, name, colour) for (_, _, log), name, colour in runs if log["beta"].is_not_null().any()
    ]
    if not with_beta:
        return None
    fig, ax = plt.subplots(figsize=(3.4, 2.4))
    betas = np.concatenate([log["beta"].drop_nulls().to_numpy() for log, _, _ in with_beta])
    finite = betas[np.isfinite(betas)]
    low = float(finite.min()) if finite.size else 1.0
    top = 2 * float(finite.max()) if finite.size else 100.0
    labelled: set[str] = set()
    for log, name, colour in with_beta:
        rows = log.filter(pl.col("beta").is_not_null())
        beta, steps = rows["beta"].to_numpy(), rows["step"].to_numpy()
        infinite = np.isinf(beta)
        # the line joins finite betas only: a segment from inf, drawn at the top, would be a
        # slope made up by where the top line happens to be
        ax.plot(steps, np.where(infinite, np.nan, beta), marker=".", ms=4, color=colour,
                label=None if name in labelled else name)  # fmt: skip
        ax.plot(steps[infinite], np.full(infinite.sum(), top), ls="none", marker="^", ms=3.5,
                mfc="none", color=colour)  # fmt: skip
        labelled.add(name)
    ax.set_yscale("log")
    ax.axhline(top, color="0.8", lw=0.8, zorder=0)
    ticks = [t for t in BETA_TICKS if low / 1.5 <= t <= top / 1.5]
    ax.set_yticks([*ticks, top], [*(f"{t:g}" for t in ticks), "∞"])
    ax.minorticks_off()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel=r"calibrated $\beta_t$")
    if len(labelled) > 1:
        ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def _summary(arms: Sequence[Arm], names: Sequence[str], path: Path) -> Path:
    """training_summary.csv: arm, run, label, step, eval_accuracy, mean_reward,
    truncated_share, beta, probe_value_error and the policy measures (empty in runs
    logged before them)."""
    from basis_bench.guards.outputs import atomic_write

    table = pl.concat(
        [
            log.with_columns(
                pl.lit(str(arm.path)).alias("arm"),
                pl.lit(str(p)).alias("run"),
                pl.lit(name).alias("label"),
            )
            for arm, name in zip(arms, names, strict=True)
            for p, _, log in arm.runs
        ],
        how="diagonal_relaxed",
    ).select(
        "arm", "run", "label", "step", "eval_accuracy", "mean_reward", "truncated_share", "beta",
        VALUE_ERROR, *POLICY_MEASURES,
    )  # fmt: skip
    text = table.with_columns(pl.col("beta").map_elements(_beta_text, return_dtype=pl.String))
    with atomic_write(path) as tmp:
        text.write_csv(tmp)
    return path


def _beta_text(beta: float) -> str:
    return "inf" if math.isinf(beta) else f"{beta:.6g}"

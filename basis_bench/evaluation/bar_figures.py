"""The bar charts: MSE per estimator (Fig. 3a), the share of uninformative baselines
(Fig. 3d) and the betas online calibration chose, one bar per checkpoint side by side."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.evaluation.figure_style import (
    OMITTED,
    RAW_MSE,
    checkpoints,
    label,
    log_y,
    ordered,
    panels,
    stage_colours,
)
from basis_bench.guards.quoting import plain_math

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _grouped_bars(
    ax: Any,
    df: pl.DataFrame,
    value: Callable[[dict[str, Any]], float],
    error: Callable[[dict[str, Any]], tuple[float, float]] | None = None,
) -> None:
    """One bar per (estimator, G) and checkpoint, the checkpoints side by side in stage
    colours; a missing (estimator, G, checkpoint) is a gap. Without ``error`` (a share) a bar
    of exactly 0 is no bar but a hollow marker on the axis, and its group says "0%" (an
    empty bar is otherwise invisible, as if missing; a thick stub read as a small share)."""
    import numpy as np

    names = checkpoints(df)
    keys = df.select("estimator", "rollouts_per_prompt").unique(maintain_order=True).rows()
    width = 0.8 / len(names)
    shades = stage_colours(len(names))
    zeros = np.zeros((len(names), len(keys)), dtype=bool)
    for i, name in enumerate(names):
        d = df.filter(pl.col("checkpoint") == name)
        lookup = {(r["estimator"], r["rollouts_per_prompt"]): r for r in d.iter_rows(named=True)}
        rows = [lookup.get(k) for k in keys]
        x = np.arange(len(keys)) + (i - (len(names) - 1) / 2) * width
        heights = [value(r) if r else np.nan for r in rows]
        if error is None:
            ax.bar(x, heights, width=width, color=shades[i], label=plain_math(name))
            zeros[i] = np.asarray(heights) == 0
            if zeros[i].any():
                ax.plot(x[zeros[i]], np.zeros(zeros[i].sum()), ls="none", marker="o", ms=3.5,
                        mfc="none", mec=shades[i], mew=1.0, clip_on=False, zorder=3)  # fmt: skip
            continue
        err = np.array([error(r) if r else (np.nan, np.nan) for r in rows]).T
        ax.bar(
            x, heights, width=width, yerr=err, capsize=1.5, color=shades[i],
            label=plain_math(name),
            error_kw={"lw": 0.8},
        )  # fmt: skip
    for k in np.flatnonzero(zeros.any(axis=0)):
        every = "" if zeros[:, k].all() else " (" + ", ".join(
            plain_math(n) for n, z in zip(names, zeros[:, k], strict=True) if z
        ) + ")"  # fmt: skip
        ax.annotate(f"0%{every}", (k, 0), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize=6, color="0.3", rotation=90)  # fmt: skip
    ax.set_xticks(np.arange(len(keys)), [label(e, g) for e, g in keys], rotation=25, ha="right")
    ax.legend(title="checkpoint", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def fig3a_mse(summary: pl.DataFrame) -> Figure:
    """MSE per estimator over all prompts, 95% CI over repeats, one colour per checkpoint."""
    df = ordered(summary)
    omitted = df.filter(pl.col("estimator").is_in(OMITTED))
    fig, axes = panels(1, height=2.8)
    ax = axes[0]
    _grouped_bars(
        ax,
        df.filter(~pl.col("estimator").is_in(OMITTED)),
        lambda r: r["mse"],
        lambda r: (r["mse"] - r["ci_low"], r["ci_high"] - r["mse"]),
    )
    ax.set_ylabel(RAW_MSE)
    shown = df.filter(~pl.col("estimator").is_in(OMITTED) & (pl.col("mse") > 0))["mse"].to_numpy()
    if shown.size and shown.max() / shown.min() >= LOG_SPAN:  # 0.003 beside 0.44
        log_y(ax)
    note = ", ".join(f"{n}: {m:.3f}" for n, m in omitted.select("checkpoint", "mse").rows())
    title = "(a) value-estimation MSE (95% CI over repeats)"
    ax.set_title(title + (f"\nzero baseline omitted (MSE {note})" if note else ""), fontsize=9)
    return fig


LOG_SPAN = 30.0
"""Bars whose heights span this factor or more are drawn on a log axis: on a linear one the
smallest are invisible."""


def fig3d_extreme(summary: pl.DataFrame) -> Figure:
    """Share of baselines exactly 0 or 1 (a zero advantage for a binary reward)."""
    fig, axes = panels(1, height=2.6)
    ax = axes[0]
    _grouped_bars(ax, ordered(summary), lambda r: 100 * r["extreme_rate"])
    ax.set_ylabel("baselines exactly 0 or 1 (%)")
    ax.set_ylim(0, 105)
    ax.set_title("(d) uninformative baselines", fontsize=9)
    return fig


def fig_beta_choice(df: pl.DataFrame) -> Figure:
    """Share of repeats in which online calibration chose each beta, per checkpoint."""
    import numpy as np

    names = checkpoints(df)
    shades = stage_colours(len(names))
    fig, axes = panels(1, height=2.4)
    ax = axes[0]
    betas = df.filter(pl.col("checkpoint") == names[0]).sort("beta_index")["beta"].to_list()
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        d = df.filter(pl.col("checkpoint") == name).sort("beta_index")
        x = d["beta_index"].to_numpy() + (i - (len(names) - 1) / 2) * width
        ax.bar(x, 100 * d["share"].to_numpy(), width=width, color=shades[i], label=plain_math(name))
    idx = np.arange(len(betas))
    show = idx[:: max(1, len(betas) // 8)].tolist()
    if len(betas) - 1 not in show:
        show.append(len(betas) - 1)
    ax.set_xticks(show, ["$\\infty$" if math.isinf(betas[i]) else f"{betas[i]:.2g}" for i in show])
    ax.set_xlabel("chosen $\\beta$ (grid order, large to small; $\\infty$ = reference)")
    ax.set_ylabel("share of batches (%)")
    ax.set_title("online calibration: chosen $\\beta$ per batch", fontsize=9)
    ax.legend(title="checkpoint", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig

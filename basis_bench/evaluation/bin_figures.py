"""The binned line plots: MSE by batch heterogeneity (Fig. 3b) and by prompt difficulty
(Fig. 3c), one panel per checkpoint, each bin's count above it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.evaluation.figure_style import (
    OMITTED,
    RAW_MSE,
    VARIANTS,
    checkpoints,
    coinciding,
    draw_lines,
    edge_labels,
    legend_below,
    log_y,
    ordered,
    panels,
)
from basis_bench.guards.quoting import plain_math

if TYPE_CHECKING:
    from matplotlib.figure import Figure


THIN_BIN = 30
"""A bin with fewer estimates (or batches) than this is thin: its count is drawn in red over
a shaded span, so a dip there is read as the handful of prompts it is."""


def _bin_axis(ax: Any, bins: pl.DataFrame) -> None:
    """A numeric x axis with the bins' edges as ticks (at most six labelled), horizontal."""
    import numpy as np

    edges = np.unique(np.concatenate([bins["bin_low"].to_numpy(), bins["bin_high"].to_numpy()]))
    shown = edges[:: max(1, -(-len(edges) // 6))]
    ax.set_xticks(shown, edge_labels(shown))
    ax.set_xlim(edges[0], edges[-1])


def _bin_counts(ax: Any, bins: pl.DataFrame, count: str) -> None:
    """Each bin's count on a top axis at its middle; thin bins (< ``THIN_BIN``) shaded with
    the count in red, empty ones hatched and labelled "empty" (their line has no point)."""
    middles = ((bins["bin_low"] + bins["bin_high"]) / 2).to_list()
    top = ax.secondary_xaxis("top")
    top.set_xticks(middles, [str(n) if n else "empty" for n in bins[count].to_list()])
    top.tick_params(axis="x", labelsize=5.5, length=0, pad=1)
    for tick, row in zip(top.get_xticklabels(), bins.iter_rows(named=True), strict=True):
        if row[count] < THIN_BIN:
            tick.set_color("tab:red")
            ax.axvspan(row["bin_low"], row["bin_high"], color="0.9", zorder=0, lw=0,
                       hatch="///" if not row[count] else None, fill=bool(row[count]),
                       ec="0.75")  # fmt: skip
    top.grid(False)


def _by_bin(table: pl.DataFrame, xlabel: str, title: str) -> Figure:
    """Raw MSE per bin (drawn at the bin's middle), one panel per checkpoint, each bin's count
    above it (:func:`_bin_counts`)."""
    df = ordered(table).filter(~pl.col("estimator").is_in([*OMITTED, *VARIANTS]))
    df = df.with_columns(((pl.col("bin_low") + pl.col("bin_high")) / 2).alias("middle"))
    count = "n_estimates" if "n_estimates" in df.columns else "n_batches"
    names = checkpoints(df)
    twins = coinciding(df, ["checkpoint", "bin"], "mse")
    fig, axes = panels(len(names), height=2.9)
    for ax, name in zip(axes, names, strict=True):
        d = df.filter(pl.col("checkpoint") == name).sort("bin", maintain_order=True)
        draw_lines(ax, d, "middle", "mse", twins)
        bins = d.group_by("bin", maintain_order=True).agg(
            pl.col("bin_low").first(), pl.col("bin_high").first(), pl.col(count).min()
        )
        _bin_axis(ax, bins)
        _bin_counts(ax, bins, count)
        ax.tick_params(axis="x", labelsize=7)
        log_y(ax)
        ax.set_title(f"checkpoint: {plain_math(name)}")
    axes[0].set_ylabel(RAW_MSE)
    axes[len(axes) // 2].set_xlabel(xlabel)
    what = "estimates" if count == "n_estimates" else "batches"
    fig.suptitle(
        f"{title}\nnumbers above: {what} per bin (red, shaded: fewer than {THIN_BIN}; "
        "hatched: empty)",
        fontsize=9,
    )
    legend_below(fig, axes, ncol=3)
    return fig


def fig3b_heterogeneity(table: pl.DataFrame) -> Figure:
    """MSE by batch heterogeneity: 500 batches in five equal-width s_b bins."""
    return _by_bin(
        table,
        "batch heterogeneity $s_b$ (std of oracle values; ticks at bin edges)",
        "(b) MSE by batch heterogeneity (per-batch MSE averaged within each bin)",
    )  # fmt: skip


def fig3c_difficulty(table: pl.DataFrame) -> Figure:
    """MSE by prompt difficulty: oracle value bins [0,.2) ... [.8,1]."""
    return _by_bin(
        table, "oracle value of the prompt (ticks at bin edges)",
        "(c) MSE by prompt difficulty",
    )  # fmt: skip

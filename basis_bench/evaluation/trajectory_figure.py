"""The trajectory replay's figure: noise-corrected MSE over training with 95% CI bands, on
the step schedule also against the rollouts each estimator spent (the budget curve)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.evaluation.figure_style import (
    CORRECTED_MSE,
    coinciding,
    draw_lines,
    legend_below,
    log_y,
    looks,
    ordered,
    panels,
)
from basis_bench.guards.quoting import plain_math

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _trajectory_lines(ax: Any, df: pl.DataFrame, x_column: str) -> None:
    """One line per (estimator, G) against ``x_column`` in its estimator's look, with its 95%
    CI band; lines that coincide drawn apart (:func:`~basis_bench.evaluation.figure_style.draw_lines`)."""
    keys = df.select("estimator", "rollouts_per_prompt").unique(maintain_order=True).rows()
    style = looks([str(e) for e, _ in keys])
    every = max(1, df.height // max(len(keys), 1) // 12)  # about 12 markers a line
    draw_lines(
        ax,
        df,
        x_column,
        "mse_noise_corrected",
        coinciding(df, ["step"], "mse_noise_corrected"),
        every,
    )
    for name, g in keys:
        d = df.filter((pl.col("estimator") == name) & (pl.col("rollouts_per_prompt") == g))
        y = d["mse_noise_corrected"].to_numpy()
        half = (d["ci_high"] - d["ci_low"]).to_numpy() / 2
        ax.fill_between(d[x_column].to_numpy(), y - half, y + half, color=style[str(name)].colour,
                        alpha=0.12, lw=0)  # fmt: skip
    if (df["mse_noise_corrected"] > 0).all():
        log_y(ax)
    ax.set_ylabel(CORRECTED_MSE)


def _checkpoint_marks(ax: Any, df: pl.DataFrame, moving: bool, at: str = "first") -> None:
    """Dotted lines where the checkpoints are, each labelled above the axes (inside, the
    labels sat on the lines and could not be read). ``at="first"`` (step schedule):
    checkpoint c is the policy at its first step, the line there names it; ``"last"`` (epoch
    schedule): its epochs end at its last step ("a -> b" while blending a into b)."""
    import matplotlib.ticker as mticker

    ends = df.group_by("checkpoint", maintain_order=True).agg(
        pl.col("step").min().alias("first"), pl.col("step").max().alias("last")
    )
    names = ends["checkpoint"].to_list()
    for k, (name, first, last) in enumerate(ends.rows()):
        x = first if at == "first" else last
        if at == "first" or k + 1 < len(names):
            ax.axvline(x, color="0.5", ls=":", lw=0.8)
        text = f"{name} -> {names[k + 1]}" if moving and k + 1 < len(names) else name
        ax.annotate(plain_math(text), (x, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points",
                    ha="center" if at == "first" else "right", va="bottom", fontsize=6.5,
                    color="0.35")  # fmt: skip
    ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    lo, hi = (int(x) for x in df["step"].to_numpy()[[0, -1]])
    if lo == hi:  # one step: a readable axis around it
        ax.set_xlim(lo - 1, hi + 1)


def fig_trajectory(table: pl.DataFrame) -> Figure:
    """Trajectory replay: noise-corrected MSE against the training step (95% CI bands); on the
    step schedule a second panel against the rollouts each estimator has spent (the budget
    curve). Dotted lines where the checkpoint changes; log scale."""
    table = ordered(table)
    if (table["scope"] == "step").any():
        df = table.filter(pl.col("scope") == "step")
        fig, axes = panels(2, height=3.0)
        _trajectory_lines(axes[0], df, "step")
        _checkpoint_marks(axes[0], df, moving=False)
        axes[0].set_xlabel("training step")
        _trajectory_lines(axes[1], df, "rollouts_spent")
        if (df["rollouts_spent"] > 0).all():  # budgets differ by G: 2,000 against 18,000
            axes[1].set_xscale("log")
        axes[1].set_xlabel("rollouts spent")
        axes[1].set_ylabel("")
        fig.suptitle(f"trajectory replay, {df['schedule'][0]}: value error over training",
                     fontsize=9)  # fmt: skip
        legend_below(fig, axes, ncol=3)
        return fig
    df = table.filter(pl.col("scope") == "epoch")
    fig, axes = panels(1, height=3.0)
    _trajectory_lines(axes[0], df, "step")
    moving = "next_share" in df.columns and bool((df["next_share"] > 0).any())
    _checkpoint_marks(axes[0], df, moving=moving, at="last")
    axes[0].set_xlabel("replay step (end of epoch)")
    axes[0].set_title("trajectory replay (epochs per checkpoint): value error", fontsize=9,
                      pad=12)  # above the checkpoint labels  # fmt: skip
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return fig

"""The gradient benchmark's figure: each arm's policy-gradient variance as a ratio to RLOO(8)'s
against the rollouts a step R (gradient.csv), over the checkpoints, with 95% intervals."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from basis_bench.evaluation.figure_style import label, looks, panels
from basis_bench.evaluation.gradient import ORACLE_ARM

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = (
    "estimator", "rollouts_per_prompt", "rollouts_per_step", "checkpoint",
    "variance_ratio_rloo8", "ci_low", "ci_high",
)  # fmt: skip


def fig_gradient(table: pl.DataFrame) -> Figure:
    """Variance ratio to RLOO(8) (GRPO on RLOO's scale) against R, one line per (arm, G); a
    ratio below 1 is a less noisy gradient than RLOO(8)'s at the same rollouts a step."""
    rows = table.filter(pl.col("checkpoint") == "all")
    import matplotlib.ticker as mticker

    keys = rows.select("estimator", "rollouts_per_prompt").unique(maintain_order=True).rows()
    style = looks([str(e) for e, _ in keys])
    fig, (ax,) = panels(1, height=3.0)
    for name, g in keys:
        d = rows.filter((pl.col("estimator") == name) & (pl.col("rollouts_per_prompt") == g))
        d = d.sort("rollouts_per_step")
        y = d["variance_ratio_rloo8"].to_numpy()
        ax.errorbar(
            d["rollouts_per_step"], y, yerr=[y - d["ci_low"].to_numpy(), d["ci_high"].to_numpy() - y],
            marker=style[str(name)].marker, markersize=3, lw=1.2, capsize=2,
            ls=style[str(name)].linestyle if g == 1 else "--", color=style[str(name)].colour,
            label=f"oracle b = v{f' (G={g})' if g > 1 else ''}" if name == ORACLE_ARM else label(str(name), g),
        )  # fmt: skip
    ax.axhline(1.0, color="0.5", ls=":", lw=0.8)
    ax.set_xscale("log", base=2)
    budgets = sorted(rows["rollouts_per_step"].unique().to_list())
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%.2g"))
    ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%.2g"))
    ax.set_xlabel("rollouts per step R (every arm spends the same)")
    ax.set_ylabel("gradient variance / RLOO(8)'s")
    ax.set_title("policy-gradient variance at an equal budget (GRPO on RLOO's scale)", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return fig

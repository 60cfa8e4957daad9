"""The sweeps: initial vs refined MSE against a fixed beta (Fig. 2), GRPO/RLOO against the
group size G, and BASIS against each of its knobs (Fig. 5), one line per checkpoint."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.estimators.baselines import REINFORCE_PP_NAME
from basis_bench.estimators.basis import BASIS_NAME, REFERENCE_MEAN_NAME
from basis_bench.evaluation.figure_style import (
    RAW_MSE,
    checkpoints,
    label,
    legend_below,
    log_y,
    looks,
    panels,
    stage_colours,
)
from basis_bench.guards.quoting import plain_math

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def fig2_fixed_beta(df: pl.DataFrame) -> Figure:
    """Initial vs refined MSE against a fixed beta (beta = inf drawn as dotted levels)."""
    names = checkpoints(df)
    fig, axes = panels(len(names))
    for ax, name in zip(axes, names, strict=True):
        d = df.filter(pl.col("checkpoint") == name)
        fin = d.filter(pl.col("beta").is_finite()).sort("beta")
        inf = d.filter(~pl.col("beta").is_finite())
        for col, colour, text in (
            ("initial_mse", "tab:orange", "initial $\\hat V_\\beta$"),
            ("refined_mse", "tab:blue", "refined $\\tilde V_\\beta$"),
        ):
            ax.plot(
                fin["beta"],
                fin[col],
                color=colour,
                marker="o",
                markersize=2.5,
                lw=1.2,
                label=text,
            )
            if inf.height:
                ax.axhline(
                    float(inf[col][0]),
                    color=colour,
                    ls=":",
                    lw=1,
                    label=f"{text.split()[0]} at $\\beta=\\infty$",
                )
        ax.set_xscale("log")
        log_y(ax)
        ax.set_title(f"checkpoint: {plain_math(name)}")
        ax.set_xlabel("fixed $\\beta$")
    axes[0].set_ylabel(RAW_MSE)
    legend_below(fig, axes, ncol=4)
    return fig


def fig3_group_sweep(sweep: pl.DataFrame, summary: pl.DataFrame) -> Figure:
    """GRPO/RLOO MSE against G, with the single-rollout estimators as horizontal lines."""
    single = summary.filter(
        (pl.col("rollouts_per_prompt") == 1)
        & pl.col("estimator").is_in([BASIS_NAME, REINFORCE_PP_NAME, REFERENCE_MEAN_NAME])
    )
    names = checkpoints(sweep)
    style = looks(summary["estimator"].unique().to_list())
    fig, axes = panels(len(names), height=2.5)
    for ax, name in zip(axes, names, strict=True):
        d = sweep.filter(pl.col("checkpoint") == name)
        for (est,), part in d.group_by("estimator", maintain_order=True):
            part = part.sort("group_size")
            ax.errorbar(
                part["group_size"], part["mse"], yerr=[part["mse"] - part["ci_low"], part["ci_high"] - part["mse"]],
                marker=style[str(est)].marker, markersize=3, lw=1.2, capsize=2,
                ls=style[str(est)].linestyle, color=style[str(est)].colour, label=label(str(est)),
            )  # fmt: skip
        for row in single.filter(pl.col("checkpoint") == name).iter_rows(named=True):
            what = "cache only" if row["estimator"] == REFERENCE_MEAN_NAME else "1 rollout"
            ax.axhline(
                row["mse"],
                color=style[row["estimator"]].colour,
                ls="-",
                lw=1,
                alpha=0.8,
                label=f"{label(row['estimator'])} ({what})",
            )
        gs = sorted(d["group_size"].unique().to_list())
        ax.set_xscale("log", base=2)
        ax.set_xticks(gs, [str(g) for g in gs])
        log_y(ax)
        ax.set_title(f"checkpoint: {plain_math(name)}")
        ax.set_xlabel("rollouts per prompt $G$")
    axes[0].set_ylabel(RAW_MSE)
    legend_below(fig, axes, ncol=3)
    return fig


SENSITIVITY_AXES = {
    "eps": ("active-set threshold $\\epsilon$", True),
    "ref_n": ("reference samples $n$", True),
    "batch_size": ("batch size $B$", True),
    "grid_size": ("candidate betas $K$", True),
}


def fig5_sensitivity(table: pl.DataFrame, held: dict[str, Any]) -> Figure:
    """BASIS's MSE as one knob moves, per checkpoint; ``held``: the values the run held the
    other knobs at (None where unknown)."""
    # "n": ref_n in tables of 0.1.0 and before
    df = table.with_columns(pl.col("parameter").replace("n", "ref_n"))
    params = [p for p in SENSITIVITY_AXES if p in df["parameter"].unique().to_list()]
    names = checkpoints(df)
    shades = stage_colours(len(names))
    styles = ["-", "--", ":", "-."]
    estimators = list(dict.fromkeys(df["estimator"].to_list()))
    fig, axes = panels(len(params), height=2.3, sharey=True)
    for ax, param in zip(axes, params, strict=True):
        for i, name in enumerate(names):
            for j, est in enumerate(estimators):
                d = df.filter(
                    (pl.col("parameter") == param)
                    & (pl.col("checkpoint") == name)
                    & (pl.col("estimator") == est)
                ).sort("value")
                text = name if len(estimators) == 1 else f"{name}, {label(est)}"
                ax.errorbar(
                    d["value"], d["mse"], yerr=[d["mse"] - d["ci_low"], d["ci_high"] - d["mse"]],
                    marker="o", markersize=3, lw=1.2, capsize=2, elinewidth=0.8,
                    ls=styles[j % 4], color=shades[i], label=text,
                )  # fmt: skip
        xlabel, log = SENSITIVITY_AXES[param]
        if _never_binds(df.filter(pl.col("parameter") == param)):
            xlabel += "\n(never binds on this data)"
        if log:
            ax.set_xscale("log", base=10 if param == "eps" else 2)
        if param != "eps":
            values = sorted(df.filter(pl.col("parameter") == param)["value"].unique().to_list())
            ax.set_xticks(values, [f"{v:g}" for v in values], rotation=45 if len(values) > 4 else 0)
        log_y(ax)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(RAW_MSE)
    swept = " and ".join(label(e) for e in estimators)  # was always "BASIS": basis_vop alone too
    fig.suptitle(
        f"{swept} sensitivity (others at {_held_title(held)}; 95% CI over repeats)",
        fontsize=9,
    )
    legend_below(fig, axes)
    return fig


def _never_binds(rows: pl.DataFrame) -> bool:
    """Whether one knob's rows give every (checkpoint, estimator) the same MSE at each of its
    values (to 1e-9): the knob changed nothing on this data, and its panel says so rather
    than showing flat lines as a finding of robustness."""
    import numpy as np

    if rows["value"].n_unique() < 2:
        return False
    return all(
        np.allclose(part["mse"].to_numpy(), part["mse"][0], rtol=1e-9, atol=0)
        for _, part in rows.group_by("checkpoint", "estimator")
    )


def _held_title(held: dict[str, Any]) -> str:
    """The title's values of the knobs the run held fixed, ? for one that is no number."""
    number = {
        k: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in held.items()
    }
    shown = {k: f"{v:g}" if number[k] else "?" for k, v in held.items()}
    eps = held["eps"]
    if number["eps"] and eps > 0 and math.log10(eps) == int(math.log10(eps)):
        shown["eps"] = f"10^{{{int(math.log10(eps))}}}"
    return (
        f"$\\epsilon={shown['eps']}$, $n={shown['ref_n']}$, $B={shown['batch_size']}$, "
        f"$K={shown['grid_size']}$"
    )

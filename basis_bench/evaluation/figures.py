"""The paper's value-estimation figures, drawn from the tables `evaluate` and `sensitivity` write.

=========================  =====================  ==========================================
file (PNG and PDF)         table                  what it shows
=========================  =====================  ==========================================
fig2_fixed_beta            fixed_beta.csv         initial V^_beta vs refined V~_beta MSE
                                                  against a fixed beta, one panel per checkpoint
fig3a_mse                  summary.csv            MSE per estimator with 95% CI (log axis where
                                                  the bars span decades)
fig3b_heterogeneity        by_heterogeneity.csv   MSE by batch heterogeneity s_b, batches per
                                                  bin above (thin and empty bins marked)
fig3c_difficulty           by_difficulty.csv      MSE by prompt difficulty (oracle value),
                                                  estimates per bin above (likewise)
fig3d_extreme              summary.csv            share of baselines exactly 0 or 1 (0% bars
                                                  drawn as stubs, labelled)
fig3_group_sweep           g_sweep.csv            GRPO/RLOO MSE against G, single-rollout lines
fig5_sensitivity           sensitivity.csv        BASIS MSE against eps, n, B and grid size with
                                                  95% CIs; a knob that changes nothing says so
fig_beta_choice            beta_choice.csv        how often calibration chose each beta
=========================  =====================  ==========================================

The zero baseline (``vanilla``) has an MSE an order of magnitude above the rest; panels
(a)-(c) leave it out and say so, (d) keeps it. The line plots (b), (c) leave out the
BASIS-VOP and BASIS-RVG variants so the lines stay readable; (a) and (d) show them. Sizes fit a two-column paper page (6.75 in).
Every y label says which MSE it is: raw (with the oracle's noise) in the one-step figures,
noise-corrected in the trajectory (``RAW_MSE``, ``CORRECTED_MSE``).
Estimators are drawn in registration order, with the display name and colour each declared
at registration, the line style of their family and a marker of their own
(:mod:`~basis_bench.evaluation.figure_style`); lines that coincide are drawn apart
(hollow, dashed, "(= BASIS)" in the legend). Each figure function returns its matplotlib Figure; :func:`make_figures`
saves them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.errors import InputError, first_line
from basis_bench.estimators.baselines import REINFORCE_PP_NAME, ZERO_BASELINE_NAME
from basis_bench.estimators.basis import BASIS_NAME, BASIS_VARIANTS, REFERENCE_MEAN_NAME
from basis_bench.evaluation.config import SensitivityConfig
from basis_bench.evaluation.figure_style import (
    CORRECTED_MSE,
    RAW_MSE,
    coinciding,
    colours,
    draw_lines,
    edge_labels,
    label,
    legend_below,
    log_y,
    looks,
    ordered,
    panels,
    paper_style,
    stage_colours,
)
from basis_bench.evaluation.gradient_figure import COLUMNS as GRADIENT_COLUMNS
from basis_bench.evaluation.gradient_figure import fig_gradient
from basis_bench.evaluation.record import (
    SENSITIVITY_FILE,
    SensitivityRecord,
    check_one_run,
    sensitivity_mismatch,
)
from basis_bench.outputs import (
    claim_output_dir,
    holds_output_locks,
    read_output_marker,
    save_figure,
)
from basis_bench.quoting import plain_math

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SUMMARY_COLUMNS = (
    "checkpoint", "estimator", "rollouts_per_prompt", "mse", "mse_noise_corrected", "ci_low",
    "ci_high", "extreme_rate", "n_estimates",
)  # fmt: skip
BIN_COLUMNS = ("checkpoint", "estimator", "rollouts_per_prompt", "bin", "bin_low", "bin_high")
COLUMNS: dict[str, tuple[str, ...]] = {
    "summary.csv": SUMMARY_COLUMNS,
    "g_sweep.csv": ("checkpoint", "estimator", "group_size", "mse", "ci_low", "ci_high"),
    "by_heterogeneity.csv": (*BIN_COLUMNS, "n_batches", "mse"),
    "by_difficulty.csv": (*BIN_COLUMNS, "n_estimates", "mse"),
    "beta_choice.csv": ("checkpoint", "beta_index", "beta", "count", "share"),
    "fixed_beta.csv": ("checkpoint", "beta", "initial_mse", "refined_mse"),
    "sensitivity.csv": ("checkpoint", "parameter", "value", *SUMMARY_COLUMNS[1:]),
    "trajectory.csv": ("scope", "step", *SUMMARY_COLUMNS[:3], "mse_noise_corrected", "ci_low",
                       "ci_high"),
    "gradient.csv": GRADIENT_COLUMNS,
}  # fmt: skip
"""The columns each figure reads from each table; a table without them is refused."""

OMITTED = (ZERO_BASELINE_NAME,)
# Line plots (b), (c) keep to the paper's comparison; the variants appear in (a) and (d).
VARIANTS = BASIS_VARIANTS


def _read(path: Path) -> pl.DataFrame:
    """One table of the results, or an InputError that names what is wrong with it."""
    try:
        df = pl.read_csv(path)
    except Exception as err:  # empty, garbage, ragged rows, not UTF-8, a folder
        raise InputError(
            f"{path} is not a readable table ({first_line(err)}); rerun the command that wrote it"
        ) from err
    missing = [c for c in COLUMNS.get(path.name, ()) if c not in df.columns]
    if missing:
        raise InputError(
            f"{path} lacks the column(s) {', '.join(missing)}; rerun the command that wrote it"
        )
    if df.height == 0:
        raise InputError(f"{path} has no rows; rerun the command that wrote it")
    if path.name in ("summary.csv", "sensitivity.csv") and df.null_count().sum_horizontal().item():
        raise InputError(f"{path} has empty fields (cut short?); rerun the command that wrote it")
    return df


def _checkpoints(df: pl.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["checkpoint"].to_list()))


def fig2_fixed_beta(results: Path) -> Figure:
    """Initial vs refined MSE against a fixed beta (beta = inf drawn as dotted levels)."""
    df = _read(results / "fixed_beta.csv")
    names = _checkpoints(df)
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


def _grouped_bars(
    ax: Any,
    df: pl.DataFrame,
    value: Callable[[dict[str, Any]], float],
    error: Callable[[dict[str, Any]], tuple[float, float]] | None = None,
) -> None:
    """One bar per (estimator, G) and checkpoint, the checkpoints side by side in stage
    colours; a missing (estimator, G, checkpoint) is a gap. Without ``error`` (a share) a bar
    of exactly 0 is drawn as a stub on the axis and its group says "0%" (an empty bar is
    otherwise invisible, as if missing)."""
    import numpy as np

    names = _checkpoints(df)
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
            for at in x[zeros[i]]:
                ax.plot([at - width / 2, at + width / 2], [0, 0], color=shades[i], lw=3,
                        solid_capstyle="butt", clip_on=False, zorder=3)  # fmt: skip
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
        ax.annotate(f"0%{every}", (k, 0), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=6, color="0.3", rotation=90)  # fmt: skip
    ax.set_xticks(np.arange(len(keys)), [label(e, g) for e, g in keys], rotation=25, ha="right")
    ax.legend(title="checkpoint", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def fig3a_mse(results: Path) -> Figure:
    """MSE per estimator over all prompts, 95% CI over repeats, one colour per checkpoint."""
    df = ordered(_read(results / "summary.csv"))
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


def _bin_axis(ax: Any, bins: pl.DataFrame) -> None:
    """A numeric x axis with the bins' edges as ticks (at most six labelled), horizontal."""
    import numpy as np

    edges = np.unique(np.concatenate([bins["bin_low"].to_numpy(), bins["bin_high"].to_numpy()]))
    shown = edges[:: max(1, -(-len(edges) // 6))]
    ax.set_xticks(shown, edge_labels(shown))
    ax.set_xlim(edges[0], edges[-1])


THIN_BIN = 30
"""A bin with fewer estimates (or batches) than this is thin: its count is drawn in red over
a shaded span, so a dip there is read as the handful of prompts it is."""


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


def _by_bin(results: Path, file: str, xlabel: str, title: str) -> Figure:
    """Raw MSE per bin (drawn at the bin's middle), one panel per checkpoint, each bin's count
    above it (:func:`_bin_counts`)."""
    df = ordered(_read(results / file)).filter(~pl.col("estimator").is_in([*OMITTED, *VARIANTS]))
    df = df.with_columns(((pl.col("bin_low") + pl.col("bin_high")) / 2).alias("middle"))
    count = "n_estimates" if "n_estimates" in df.columns else "n_batches"
    names = _checkpoints(df)
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


def fig3b_heterogeneity(results: Path) -> Figure:
    """MSE by batch heterogeneity: 500 batches in five equal-width s_b bins."""
    return _by_bin(
        results, "by_heterogeneity.csv",
        "batch heterogeneity $s_b$ (std of oracle values; ticks at bin edges)",
        "(b) MSE by batch heterogeneity (per-batch MSE averaged within each bin)",
    )  # fmt: skip


def fig3c_difficulty(results: Path) -> Figure:
    """MSE by prompt difficulty: oracle value bins [0,.2) ... [.8,1]."""
    return _by_bin(
        results, "by_difficulty.csv", "oracle value of the prompt (ticks at bin edges)",
        "(c) MSE by prompt difficulty",
    )  # fmt: skip


def fig3d_extreme(results: Path) -> Figure:
    """Share of baselines exactly 0 or 1 (a zero advantage for a binary reward)."""
    fig, axes = panels(1, height=2.6)
    ax = axes[0]
    _grouped_bars(ax, ordered(_read(results / "summary.csv")), lambda r: 100 * r["extreme_rate"])
    ax.set_ylabel("baselines exactly 0 or 1 (%)")
    ax.set_ylim(0, 105)
    ax.set_title("(d) uninformative baselines", fontsize=9)
    return fig


def fig3_group_sweep(results: Path) -> Figure:
    """GRPO/RLOO MSE against G, with the single-rollout estimators as horizontal lines."""
    sweep = _read(results / "g_sweep.csv")
    summary = _read(results / "summary.csv")
    single = summary.filter(
        (pl.col("rollouts_per_prompt") == 1)
        & pl.col("estimator").is_in([BASIS_NAME, REINFORCE_PP_NAME, REFERENCE_MEAN_NAME])
    )
    names = _checkpoints(sweep)
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


def fig5_sensitivity(results: Path) -> Figure:
    """BASIS's MSE as one knob moves (the others as the run held them), per checkpoint."""

    df = _read(results / "sensitivity.csv")  # "n": ref_n in tables of 0.1.0 and before
    df = df.with_columns(pl.col("parameter").replace("n", "ref_n"))
    params = [p for p in SENSITIVITY_AXES if p in df["parameter"].unique().to_list()]
    names = _checkpoints(df)
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
        f"{swept} sensitivity (others at {_held_fixed(results)}; 95% CI over repeats)",
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


def _held_fixed(results: Path) -> str:
    """The values the other knobs held, from sensitivity.json (the title said the defaults
    whatever --eps, --ref-n, --batch-size, --grid-size the run used); the defaults for a
    table written before the record existed, ? for a value the record does not hold."""
    knobs = ("eps", "ref_n", "batch_size", "grid_size")
    held: dict[str, Any] = {f.name: f.default for f in fields(SensitivityConfig) if f.name in knobs}
    if (results / SENSITIVITY_FILE).is_file():
        config = SensitivityRecord.read(results / SENSITIVITY_FILE).config
        config = config if isinstance(config, dict) else {}
        held = {k: config.get(k) for k in held}
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


def fig_beta_choice(results: Path) -> Figure:
    """Share of repeats in which online calibration chose each beta, per checkpoint."""
    import numpy as np

    df = _read(results / "beta_choice.csv")
    names = _checkpoints(df)
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


def _trajectory_lines(ax: Any, df: pl.DataFrame, x_column: str) -> None:
    """One line per (estimator, G) against ``x_column`` in its estimator's look, with its 95%
    CI band; lines that coincide drawn apart (:func:`_draw_lines`)."""
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
    """Dotted lines where the checkpoints are, each labelled. ``at="first"`` (step schedule):
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
        ax.annotate(plain_math(text), (x, 0.98), xycoords=("data", "axes fraction"),
                    xytext=(2 if at == "first" else -2, 0), textcoords="offset points",
                    ha="left" if at == "first" else "right", va="top", fontsize=6.5,
                    color="0.35", rotation=90 if at == "first" else 0)  # fmt: skip
    ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    lo, hi = (int(x) for x in df["step"].to_numpy()[[0, -1]])
    if lo == hi:  # one step: a readable axis around it
        ax.set_xlim(lo - 1, hi + 1)


def fig_trajectory(results: Path) -> Figure:
    """Trajectory replay: noise-corrected MSE against the training step (95% CI bands); on the
    step schedule a second panel against the rollouts each estimator has spent (the budget
    curve). Dotted lines where the checkpoint changes; log scale."""
    table = ordered(pl.read_csv(results / "trajectory.csv"))
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
    axes[0].set_title("trajectory replay (epochs per checkpoint): value error", fontsize=9)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return fig


FIGURES: dict[str, tuple[str, Callable[[Path], Figure]]] = {
    "fig2_fixed_beta": ("fixed_beta.csv", fig2_fixed_beta),
    "fig3a_mse": ("summary.csv", fig3a_mse),
    "fig3b_heterogeneity": ("by_heterogeneity.csv", fig3b_heterogeneity),
    "fig3c_difficulty": ("by_difficulty.csv", fig3c_difficulty),
    "fig3d_extreme": ("summary.csv", fig3d_extreme),
    "fig3_group_sweep": ("g_sweep.csv", fig3_group_sweep),
    "fig5_sensitivity": ("sensitivity.csv", fig5_sensitivity),
    "fig_beta_choice": ("beta_choice.csv", fig_beta_choice),
    "fig_trajectory": ("trajectory.csv", fig_trajectory),
    "fig_gradient": ("gradient.csv", lambda results: fig_gradient(_read(results / "gradient.csv"))),
}


@holds_output_locks
def make_figures(
    results: str | os.PathLike[str], out: str | os.PathLike[str]
) -> tuple[list[Path], dict[str, str]]:
    """Draw every figure whose table exists; returns (files written, {figure: why skipped})."""
    results, out = Path(results), Path(out)
    run = check_one_run(results)
    sensitivity_from = sensitivity_mismatch(results, run)
    for table in {t for t, _ in FIGURES.values()}:  # every table checked before any figure
        if (results / table).exists() and not (table == "sensitivity.csv" and sensitivity_from):
            _read(results / table)
    _claim_figures_dir(out)
    paper_style()
    written: list[Path] = []
    skipped: dict[str, str] = {}
    for name, (table, draw) in FIGURES.items():
        if not (results / table).exists():
            skipped[name] = f"{table} not in {results}" + (
                " (run `basis-bench sensitivity`)" if table == "sensitivity.csv" else ""
            )
        elif table == "sensitivity.csv" and sensitivity_from is not None:
            skipped[name] = sensitivity_from
        else:
            written += save_figure(draw(results), out, name)
            continue
        skipped[name] += _drop_earlier(out, name)
    return written, skipped


def _drop_earlier(out: Path, stem: str) -> str:
    """Remove a skipped figure's files left by an earlier call, which would otherwise sit
    beside this run's figures as if drawn from it; says what was removed."""
    gone = [p.name for p in (out / f"{stem}.png", out / f"{stem}.pdf") if p.is_file()]
    for name in gone:
        (out / name).unlink()
    return f"; removed the earlier {' and '.join(gone)} from {out}" if gone else ""


def _claim_figures_dir(out: Path) -> None:
    """``out`` as a figures folder; one holding only this module's figures (written before
    markers existed, like the committed figures/default) counts as one."""
    force = False
    if out.is_dir() and read_output_marker(out, force_flag=False) is None:
        names = {f"{stem}.{ext}" for stem in FIGURES for ext in ("png", "pdf")}
        files = [f.name for f in out.iterdir() if not f.name.startswith(".")]
        force = bool(files) and all(f in names for f in files)
    claim_output_dir(out, "figures", force=force, force_flag=False)


__all__ = ["FIGURES", "colours", "label", "make_figures", "paper_style"]  # colours, label: the
# training figures' too (figure_style)

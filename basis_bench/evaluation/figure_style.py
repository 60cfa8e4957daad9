"""How the figures draw estimators: names, colours, line styles and markers, one look everywhere.

Estimators fall into families by what they use (:func:`family`): the reference cache
(BASIS and its kin), a group of rollouts per prompt (GRPO, RLOO), state carried across
steps (the SPO tracker, BASIS memory), or the batch alone (REINFORCE++). A family has
one line style, its members colours of one group (:data:`STYLES`: blues for the cache
family, greens for groups, ...) and each member its own marker, so two estimators
whose lines coincide stay told apart; :func:`same_as` finds lines that coincide (within
2% at every point, as one at printed size), which the figures draw hollow and name in the
legend ("Offline V^ (≈ BASIS)", equal or nearly: one wording in every figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from basis_bench.estimators import available
from basis_bench.estimators.baselines import ZERO_BASELINE_NAME
from basis_bench.estimators.basis import BASIS_NAME, BASIS_VARIANTS
from basis_bench.guards.quoting import plain_math

PAGE_WIDTH = 6.75  # inches, a two-column paper's text width
RAW_MSE = "MSE vs oracle\n(raw)"
CORRECTED_MSE = "MSE vs oracle\n(noise-corrected)"
"""The y labels: every figure says which MSE it draws, in these words (the raw MSE holds the
oracle's own noise, Var(oracle); the corrected one has it taken out and may fall below 0)."""
OMITTED = (ZERO_BASELINE_NAME,)
"""Left out of the MSE panels (a)-(c): its MSE is an order of magnitude above the rest."""
VARIANTS = BASIS_VARIANTS
"""Left out of the line plots (b), (c), which keep to the paper's comparison; (a), (d) show them."""
FAMILIES = ("cache", "group", "stateful", "batch")
LINESTYLES = {"cache": "-", "group": "--", "stateful": (0, (1, 1)), "batch": "-."}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


@dataclass(frozen=True)
class Style:
    """How the figures name an estimator and the colour of its line (a matplotlib colour)."""

    label: str
    colour: str


STYLES: dict[str, Style] = {
    "vanilla": Style("REINFORCE (b=0)", "#969696"),
    "reinforce_pp": Style("REINFORCE++", "#252525"),
    "grpo": Style("GRPO", "#006d2c"),
    "rloo": Style("RLOO", "#41ab5d"),
    "james_stein": Style("James-Stein", "#a1d99b"),
    "reference_mean": Style("Reference mean", "#807dba"),
    "offline": Style("Offline $\\hat V$", "#6baed6"),
    "basis": Style("BASIS", "#08519c"),
    "basis_paper": Style("BASIS (paper)", "#2171b5"),
    "basis_vop": Style("BASIS-VOP", "#17becf"),
    "basis_rvg": Style("BASIS-RVG", "#9ecae1"),
    "apo": Style("A*-PO", "#54278f"),
    "basis_track": Style("BASIS track", "darkorange"),
    "basis_memory": Style("BASIS memory", "#e08214"),
    "basis_context": Style("BASIS context", "#7f3b08"),
    "spo_tracker": Style("SPO tracker", "#b35806"),
}
"""Estimator name -> its label and colour, the same in every figure. A name not here (a
plug-in's, a test's) is labelled by its name and drawn in a spare colour that no entry
uses; a plug-in may add its own entry."""


def label(estimator: str, rollouts: int | None = None) -> str:
    """Display name (:data:`STYLES`), with G for group estimators: ``GRPO (G=8)``."""
    style = STYLES.get(estimator)
    name = style.label if style is not None else plain_math(estimator)
    return f"{name} (G={rollouts})" if rollouts is not None and rollouts > 1 else name


def colours() -> dict[str, str]:
    """The colour of each estimator of :data:`STYLES`, the same in every figure."""
    return {name: style.colour for name, style in STYLES.items()}


def family(estimator: str) -> str:
    """What the estimator's baseline draws on: ``stateful`` (state across steps), ``group``
    (G rollouts of the prompt), ``cache`` (the reference cache) or ``batch`` (the batch's
    other prompts, or nothing); an unregistered name counts as ``batch``."""
    e = available().get(estimator)
    if e is None:
        return "batch"
    if e.stateful:
        return "stateful"
    return "group" if e.group else "cache" if e.uses_cache else "batch"


@dataclass(frozen=True)
class Look:
    """How one estimator's line is drawn."""

    colour: Any
    linestyle: Any
    marker: str


def looks(names: Sequence[str]) -> dict[str, Look]:
    """One look per estimator, the same in every figure: its colour (:data:`STYLES`; spare
    dark ones for estimators not there), the family's line style, and a marker that
    differs between members of a family (counted in registration order)."""
    import seaborn as sns

    declared = colours()
    extra = sorted(set(names) - set(declared))
    spare = sns.color_palette("dark", n_colors=max(1, len(extra)))
    palette = {**declared, **{n: spare[i] for i, n in enumerate(extra)}}
    order = [*available(), *extra]
    member: dict[str, int] = {}
    seen: dict[str, int] = {}
    for name in order:
        kind = family(name)
        member[name] = seen.get(kind, 0)
        seen[kind] = member[name] + 1
    return {
        n: Look(palette[n], LINESTYLES[family(n)], MARKERS[member[n] % len(MARKERS)]) for n in names
    }


SAME_RTOL = 0.02
"""Lines within 2% of each other at every point look as one at a figure's printed size."""


def same_as(lines: dict[Any, np.ndarray]) -> dict[Any, Any]:
    """For each line that coincides with an earlier one (same length, within ``SAME_RTOL`` at
    every point), that earlier line: the figures draw it hollow over the other and say "≈"
    in its legend, whether the two are equal or only nearly."""
    twins: dict[Any, Any] = {}
    firsts: list[Any] = []
    for key, values in lines.items():
        match = next(
            (
                k
                for k in firsts
                if lines[k].shape == values.shape
                and np.allclose(lines[k], values, rtol=SAME_RTOL, atol=0, equal_nan=True)
            ),
            None,
        )
        if match is None:
            firsts.append(key)
        else:
            twins[key] = match
    return twins


def stage_colours(n: int) -> list[Any]:
    """Distinguishable colours for ordered checkpoints (early to late)."""
    import matplotlib as mpl

    if n <= 1:
        return [mpl.colormaps["viridis"](0.3)]
    return [mpl.colormaps["viridis"](x) for x in np.linspace(0.05, 0.72, n)]


def paper_style() -> None:
    """The figures' look (Agg backend, seaborn paper theme); make_figures sets it first."""
    import matplotlib as mpl
    import seaborn as sns

    mpl.use("Agg")
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.0)
    mpl.rcParams.update({"figure.dpi": 100, "legend.frameon": False, "pdf.fonttype": 42})


def panels(n: int, height: float = 2.4, sharey: bool = False) -> tuple[Any, list[Any]]:
    """``n`` panels side by side across the page width."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, n, figsize=(PAGE_WIDTH, height), sharey=sharey, squeeze=False, layout="constrained"
    )
    return fig, list(axes[0])


def legend_below(fig: Any, axes: Sequence[Any], ncol: int = 5) -> None:
    """One legend under the panels, each label once."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(ncol, len(labels)))


def log_y(ax: Any) -> None:
    """A log y axis labelled in plain numbers (0.02, 0.05, 0.1) at 1, 2 and 5 times the powers
    of ten (and 3 within one decade), or at the powers alone over more than two and a half
    decades: matplotlib's
    default labels every minor tick (2x10^-2, 3x10^-2, ...) and crowds a short axis. Call it
    after drawing (it reads the data's range)."""
    import matplotlib.ticker as mticker

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    decades = np.log10(hi / lo)
    subs = (1.0,) if decades > 2.5 else (1.0, 2.0, 5.0) if decades > 1 else (1.0, 2.0, 3.0, 5.0)
    ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())


def edge_labels(edges: np.ndarray) -> list[str]:
    """Bin edges as short labels with just enough decimals (1 to 4) to tell them apart."""
    for digits in range(1, 5):
        labels = [f"{v:.{digits}f}" for v in edges]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{v:.4g}" for v in edges]


def ordered(df: pl.DataFrame) -> pl.DataFrame:
    """``df``'s rows in registration order of their estimators (then by G), stably."""
    rank = {n: i for i, n in enumerate(available())}  # registration order
    return (
        df.with_columns(
            pl.col("estimator")
            .replace_strict(rank, default=len(rank), return_dtype=pl.Int64)
            .alias("_rank")
        )
        .sort(
            "_rank",
            "rollouts_per_prompt" if "rollouts_per_prompt" in df.columns else "_rank",
            maintain_order=True,
        )
        .drop("_rank")
    )


def draw_lines(
    ax: Any, d: pl.DataFrame, x: str, y: str, twins: dict[Any, Any], every: int = 1
) -> None:
    """One line per (estimator, G) of ``d``, each in its estimator's look (figure_style); a
    line that coincides with an earlier one (``twins``, :func:`same_as`) is drawn over it
    dashed with hollow markers, its legend saying which it (nearly) equals ("≈")."""
    keys = d.select("estimator", "rollouts_per_prompt").unique(maintain_order=True).rows()
    style = looks([str(e) for e, _ in keys])
    for est, g in keys:
        part = d.filter((pl.col("estimator") == est) & (pl.col("rollouts_per_prompt") == g))
        look, main = style[str(est)], est == BASIS_NAME
        twin = twins.get((est, g))
        text = label(str(est), int(g))
        if twin:
            other, other_g = twin
            text += f" (≈ {label(str(other), int(other_g))})"
        ax.plot(
            part[x], part[y], color=look.colour, ls=(0, (3, 2)) if twin else look.linestyle,
            marker=look.marker, markevery=every, ms=5 if twin else 3.5 if main else 3,
            mfc="none" if twin else look.colour, mew=1.1, lw=1.1 if twin else 1.8 if main else 1.1,
            zorder=4 if twin else 3 if main else 2, label=text,
        )  # fmt: skip


def coinciding(df: pl.DataFrame, order: Sequence[str], column: str) -> dict[Any, Any]:
    """The (estimator, G) lines of ``df`` whose ``column`` coincides with an earlier line's
    (:func:`same_as`) at every point (all checkpoints together, so a legend entry means the same in every panel)."""
    keyed = df.sort([*order, "estimator", "rollouts_per_prompt"], maintain_order=True)
    lines = {
        (e, g): part[column].to_numpy()
        for (e, g), part in keyed.group_by("estimator", "rollouts_per_prompt", maintain_order=True)
    }
    ranked = ordered(df).select("estimator", "rollouts_per_prompt").unique(maintain_order=True)
    keys = sorted(ranked.rows(), key=lambda k: k[0] != BASIS_NAME)  # BASIS the one drawn plain
    return same_as({k: lines[k] for k in keys})


def checkpoints(df: pl.DataFrame) -> list[str]:
    """The checkpoints of a table, in the order it gives them."""
    return list(dict.fromkeys(df["checkpoint"].to_list()))

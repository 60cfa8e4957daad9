"""How the figures draw estimators: names, colours, line styles and markers, one look everywhere.

Estimators fall into families by what they use (:func:`family`): the reference cache
(BASIS and its kin), a group of rollouts per prompt (GRPO, RLOO), state carried across
steps (the SPO tracker, BASIS memory), or the batch alone (REINFORCE++). A family has
one line style, its members colours of one group (declared at registration: blues for the
cache family, greens for groups, ...) and each member its own marker, so two estimators
whose lines coincide stay told apart; :func:`same_as` finds lines that coincide exactly,
which the figures draw hollow and name in the legend ("Offline V^ (= BASIS)").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.estimators import available

PAGE_WIDTH = 6.75  # inches, a two-column paper's text width
FAMILIES = ("cache", "group", "stateful", "batch")
LINESTYLES = {"cache": "-", "group": "--", "stateful": (0, (1, 1)), "batch": "-."}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def label(estimator: str, rollouts: int | None = None) -> str:
    """Display name (declared at registration), with G for group estimators: ``GRPO (G=8)``."""
    registered = available().get(estimator)
    name = registered.label if registered is not None else estimator
    return f"{name} (G={rollouts})" if rollouts is not None and rollouts > 1 else name


def colours() -> dict[str, str]:
    """The colour each registered estimator declared, the same in every figure."""
    return {n: e.colour for n, e in available().items() if e.colour is not None}


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
    """One look per estimator, the same in every figure: the declared colour (spare dark
    ones for estimators that declared none), the family's line style, and a marker that
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


def same_as(lines: dict[Any, np.ndarray]) -> dict[Any, Any]:
    """For each line whose values equal an earlier line's (same length, equal up to float
    rounding), that earlier line: the figures draw it hollow and say so in its legend."""
    twins: dict[Any, Any] = {}
    firsts: list[Any] = []
    for key, values in lines.items():
        match = next(
            (
                k
                for k in firsts
                if lines[k].shape == values.shape
                and np.allclose(lines[k], values, rtol=1e-9, atol=0, equal_nan=True)
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

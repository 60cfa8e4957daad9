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
fig3d_extreme              summary.csv            share of baselines exactly 0 or 1 (a 0% bar
                                                  is a hollow marker at 0, labelled)
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
Estimators are drawn in registration order, with their display name and colour (``STYLES``,
keyed by name), the line style of their family and a marker of their own
(:mod:`~basis_bench.evaluation.figure_style`); lines that coincide are drawn apart
(hollow, dashed, "(≈ BASIS)" in the legend). Each figure family has its module
(:mod:`.bar_figures`, :mod:`.bin_figures`, :mod:`.sweep_figures`, :mod:`.trajectory_figure`,
:mod:`.gradient_figure`), whose functions draw tables into a matplotlib Figure; this module
reads and checks the tables (:data:`COLUMNS`), and :func:`make_figures` saves the figures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from basis_bench.errors import InputError, first_line
from basis_bench.evaluation.bar_figures import fig3a_mse, fig3d_extreme, fig_beta_choice
from basis_bench.evaluation.bin_figures import fig3b_heterogeneity, fig3c_difficulty
from basis_bench.evaluation.config import SensitivityConfig
from basis_bench.evaluation.figure_style import paper_style
from basis_bench.evaluation.gradient_figure import COLUMNS as GRADIENT_COLUMNS
from basis_bench.evaluation.gradient_figure import fig_gradient
from basis_bench.evaluation.record import (
    SENSITIVITY_FILE,
    SensitivityRecord,
    check_one_run,
    sensitivity_mismatch,
)
from basis_bench.evaluation.sweep_figures import fig2_fixed_beta, fig3_group_sweep, fig5_sensitivity
from basis_bench.evaluation.trajectory_figure import fig_trajectory
from basis_bench.guards.outputs import (
    claim_output_dir,
    holds_output_locks,
    read_output_marker,
    save_figure,
)

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


def _held_fixed(results: Path) -> dict[str, Any]:
    """The values the other knobs of the sensitivity run held, from sensitivity.json (the
    title said the defaults whatever --eps, --ref-n, --batch-size, --grid-size the run used);
    the defaults for a table written before the record existed, None for a value the record
    does not hold."""
    knobs = ("eps", "ref_n", "batch_size", "grid_size")
    held: dict[str, Any] = {f.name: f.default for f in fields(SensitivityConfig) if f.name in knobs}
    if (results / SENSITIVITY_FILE).is_file():
        config = SensitivityRecord.read(results / SENSITIVITY_FILE).config
        config = config if isinstance(config, dict) else {}
        held = {k: config.get(k) for k in held}
    return held


FIGURES: dict[str, tuple[str, Callable[[Path], Figure]]] = {
    "fig2_fixed_beta": ("fixed_beta.csv", lambda r: fig2_fixed_beta(_read(r / "fixed_beta.csv"))),
    "fig3a_mse": ("summary.csv", lambda r: fig3a_mse(_read(r / "summary.csv"))),
    "fig3b_heterogeneity": (
        "by_heterogeneity.csv",
        lambda r: fig3b_heterogeneity(_read(r / "by_heterogeneity.csv")),
    ),
    "fig3c_difficulty": (
        "by_difficulty.csv",
        lambda r: fig3c_difficulty(_read(r / "by_difficulty.csv")),
    ),
    "fig3d_extreme": ("summary.csv", lambda r: fig3d_extreme(_read(r / "summary.csv"))),
    "fig3_group_sweep": (
        "g_sweep.csv",
        lambda r: fig3_group_sweep(_read(r / "g_sweep.csv"), _read(r / "summary.csv")),
    ),
    "fig5_sensitivity": (
        "sensitivity.csv",
        lambda r: fig5_sensitivity(_read(r / "sensitivity.csv"), _held_fixed(r)),
    ),
    "fig_beta_choice": ("beta_choice.csv", lambda r: fig_beta_choice(_read(r / "beta_choice.csv"))),
    "fig_trajectory": ("trajectory.csv", lambda r: fig_trajectory(_read(r / "trajectory.csv"))),
    "fig_gradient": ("gradient.csv", lambda r: fig_gradient(_read(r / "gradient.csv"))),
}
"""Each figure: the table whose presence draws it, and how it is drawn from a results folder."""


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

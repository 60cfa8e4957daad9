"""Commands of the value-estimation benchmark: simulate, evaluate, sensitivity, figures."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from basis_bench.cli.app import app
from basis_bench.cli.from_config import Cli, comma, options_from
from basis_bench.cli.options import (
    OPTIONS,
    RESULTS_DIR,
    ROLLOUTS,
    basis_group,
    comma_list,
    estimator_names,
)
from basis_bench.errors import reraise_swallowed_interrupt
from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
from basis_bench.guards.quoting import shown
from basis_bench.rollouts.simulation import DEFAULT_STAGES, SimulationConfig, parse_stages

if TYPE_CHECKING:
    from collections.abc import Mapping

    import polars as pl


def _load_plugins(console: Console) -> None:
    """Import the estimator plug-ins now, turning a broken one into one warning line."""
    import warnings

    from basis_bench.estimators import PluginWarning, load_plugins

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PluginWarning)
        load_plugins()
    for w in caught:
        if issubclass(w.category, PluginWarning):
            Console(stderr=True, soft_wrap=True).print(
                f"[yellow]warning:[/] {shown(w.message)}", highlight=False
            )
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _checkpoint_bars(bar: Any) -> Callable[[str, int, int], None]:
    """A replay's progress callback: one bar per checkpoint, made on its first tick."""
    tasks: dict[str, Any] = {}

    def tick(name: str, done: int, total: int) -> None:
        reraise_swallowed_interrupt()
        if name not in tasks:
            tasks[name] = bar.add_task(f"checkpoint {shown(name)}", total=total)
        bar.update(tasks[name], completed=done)

    return tick


def _progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


@app.command()
@options_from(
    SimulationConfig,
    param="cfg",
    skip=("mixture",),
    cli={"stages": Cli(list[str] | None, lambda v: parse_stages(v) if v else DEFAULT_STAGES, None)},
)
def simulate(
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write the simulated rollouts dataset to.")
    ],
    cfg: SimulationConfig,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into --out even when it holds something else (real rollouts, results).",
        ),
    ] = False,
) -> None:
    """Write a simulated rollouts dataset (labelled simulated in its metadata)."""
    from basis_bench.rollouts.simulate import simulate as run_simulation

    path = run_simulation(cfg, out, force=force)
    Console().print(
        f"wrote simulated dataset ({cfg.setting}, {cfg.n_prompts} prompts, policies reference, {shown(', '.join(cfg.stages))}) to {shown(path)}"
    )


@app.command()
@options_from(
    EvaluateConfig,
    param="cfg",
    cli={
        "rollouts": ROLLOUTS,
        "estimators": comma(estimator_names, "all"),
        "basis_options": basis_group("calibration", "criterion", "loss", "eps", "fixed_beta"),
        "estimator_options": OPTIONS,
    },
)
def evaluate(
    cfg: EvaluateConfig,
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Directory for estimates.parquet, summary.csv and the other tables."
        ),
    ] = RESULTS_DIR,
) -> None:
    """Replay repeated batch draws of stored rollouts through every estimator (the paper's Fig. 3).

    Cost (docs/scale.md): peak memory is about 0.37 GB + the data (2 bytes a 0/1 rollout) + 2 KB a prompt + at most 64 MiB for the trajectory replay, whatever --repeats (about 0.5 GB at the paper's 17,398 prompts x 880 rollouts); the one-step replay's time grows with repeats, the trajectory replay's (200 streams) with prompts (about 16 CPU-minutes at 17,398 prompts). A run that would not fit in free memory stops before the replay and names the option that fits.
    """
    from basis_bench.evaluation.record import RUN_FILE
    from basis_bench.evaluation.run import evaluate as run_evaluate

    console = Console()
    _load_plugins(console)
    with _progress(console) as bar:
        result = run_evaluate(cfg, out, progress=_checkpoint_bars(bar))
    run = result.run
    if run.simulated:
        console.print(
            f"[yellow]dataset is simulated[/]: {shown(run.dataset_label)}", highlight=False
        )
    if run.synthetic_order_policies:
        console.print(
            f"note: order: synthetic: rewards of {shown(', '.join(run.synthetic_order_policies))} were "
            "expanded from counts in a seeded random order; samples are exchangeable given the "
            "prompt, so the replay is statistically faithful, but sample_idx is not a generation order",
            highlight=False,
        )
    for name, info in run.checkpoints.items():
        if info["dropped_no_reference"]:
            console.print(
                f"[yellow]checkpoint {shown(name)}: dropped {info['dropped_no_reference']} prompt(s) missing from the reference cache[/]"
            )
    print_summary(result.summary, console)
    if result.trajectory is not None and run.trajectory is not None:
        print_trajectory(result.trajectory, run.trajectory, console)
    if result.gradient is not None:
        print_gradient(result.gradient, console)
    for warning in run.warnings:  # last, beside the tables it qualifies (and in run.json)
        console.print(f"[yellow]warning:[/] {shown(warning)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {shown(result.out)}/: {', '.join([*(run.tables or {}), RUN_FILE])}")


def print_summary(summary: pl.DataFrame, console: Console) -> None:
    """One rich table per checkpoint: rollouts per prompt (G), raw MSE, noise-corrected MSE,
    95% CI half-width, share of baselines exactly 0 or 1, the change in MSE against REINFORCE++
    (the title and caption say so where the oracle's noise rivals the MSEs:
    :mod:`~basis_bench.evaluation.oracle_noise`) and
    the advantage noise a rollout feeds the gradient beyond the oracle baseline's (b = v), on
    RLOO's scale (GRPO's (G - 1) / G taken out: GRPO(G)'s like-for-like target is RLOO(G))."""
    import polars as pl
    from rich import box
    from rich.table import Table

    from basis_bench.estimators.baselines import REINFORCE_PP_NAME
    from basis_bench.evaluation.oracle_noise import rivalled

    if summary.is_empty():  # only stateful estimators (basis_memory): no one-step rows
        console.print(
            "no one-step estimates: the estimators asked for are stateful and run in the "
            "trajectory replay only (below, and trajectory.csv)"
        )
        return
    noisy = set(rivalled(summary)["checkpoint"].to_list())
    for (name,), df in summary.group_by("checkpoint", maintain_order=True):
        base = df.filter(pl.col("estimator") == REINFORCE_PP_NAME)["mse"]
        ref = float(base[0]) if base.len() else None
        within = " (within the oracle's noise)" if name in noisy else ""
        table = Table(
            title=f"checkpoint {shown(name)}: value-estimation MSE against the oracle{within}",
            caption="the oracle's noise rivals these MSEs: the corrected MSEs and the changes "
            "vs R++ are within it (warning below)"
            if within
            else None,
            box=box.SIMPLE_HEAD,
        )
        table.add_column("estimator", no_wrap=True)
        for col in ("G", "raw MSE", "corrected", "±95%", "0/1 base", "vs R++", "noise\nvs b=v"):
            table.add_column(col, justify="right", no_wrap=True)
        for row in df.iter_rows(named=True):
            change = f"{100 * (row['mse'] / ref - 1):+.0f}%" if ref else ""
            table.add_row(
                shown(row["estimator"]),
                str(row["rollouts_per_prompt"]),
                f"{row['mse']:.5f}",
                f"{row['mse_noise_corrected']:.5f}",
                f"{(row['ci_high'] - row['ci_low']) / 2:.5f}",
                f"{100 * row['extreme_rate']:.1f}%",
                change,
                _percent_over_one(row["adv_noise_ratio"]),
            )
        console.print(table)


def _percent_over_one(ratio: float | None) -> str:
    """``ratio`` - 1 in percent; "n/a" where it is undefined (every prompt's oracle value
    0 or 1 leaves no reward variance to compare against: it printed "+nan%")."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    return f"{100 * (ratio - 1):+.1f}%"


def print_gradient(gradient: pl.DataFrame, console: Console) -> None:
    """The gradient benchmark over the checkpoints: each arm's step-gradient variance as a
    ratio to RLOO(G)'s on the same repeats (GRPO's (G - 1) / G taken out), one column per
    rollouts a step R, with the half-width of its 95% interval."""
    import polars as pl
    from rich import box
    from rich.table import Table

    rows = gradient.filter(pl.col("checkpoint") == "all")
    budgets = sorted(rows["rollouts_per_step"].unique().to_list())
    table = Table(
        title="policy-gradient variance at an equal rollout budget, ratio to RLOO(8)'s",
        caption="GRPO on RLOO's scale; grpo_std (GRPO over its group's std) on G*'s, measured, "
        "its direction cos(E G, G*) in gradient.csv; oracle_baseline: b = v, the prompt's value "
        "(not the least-variance baseline, which weighs rollouts by ||s||^2); every column in "
        "gradient.csv",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("estimator", no_wrap=True)
    table.add_column("G", justify="right")
    for r in budgets:
        table.add_column(f"R={r}", justify="right", no_wrap=True)
    for (name, g), df in rows.group_by("estimator", "rollouts_per_prompt", maintain_order=True):
        by = {row["rollouts_per_step"]: row for row in df.iter_rows(named=True)}
        cells = [
            f"{by[r]['variance_ratio_rloo8']:.2f}±{(by[r]['ci_high'] - by[r]['ci_low']) / 2:.2f}"
            if r in by else ""
            for r in budgets
        ]  # fmt: skip
        table.add_row(shown(name), str(g), *cells)
    console.print(table)


PRINTED_INTERVALS = 3  # step schedule: more interval columns than this do not fit 80 columns


def _shown_intervals(
    rows: pl.DataFrame, info: Mapping[str, Any]
) -> tuple[list[str], list[str], str]:
    """The step schedule's interval columns to print: (checkpoints, headers, note), each
    headed by its checkpoints and training steps; of more than PRINTED_INTERVALS, the first
    and the last, headed by their steps alone (every one is in trajectory.csv)."""
    checkpoints = rows["checkpoint"].unique(maintain_order=True).to_list()
    last_step = dict(zip(rows["checkpoint"], rows["step"], strict=False))
    at = info.get("steps", {})
    spans = [f"steps {at.get(c, '?')}-{last_step[c]}" for c in checkpoints]
    if len(checkpoints) <= PRINTED_INTERVALS:
        names = [f"{a} -> {b}" for a, b in itertools.pairwise(checkpoints)] + checkpoints[-1:]
        return checkpoints, [f"{n}\n{span}" for n, span in zip(names, spans, strict=True)], ""
    note = f"the first and last of {len(checkpoints)} intervals; every one in trajectory.csv"
    return [checkpoints[0], checkpoints[-1]], [spans[0], spans[-1]], note


def print_trajectory(trajectory: pl.DataFrame, info: Mapping[str, Any], console: Console) -> None:
    """The trajectory replay per checkpoint (per interval between checkpoints, on the step
    schedule: :func:`_step_table`): noise-corrected MSE, one row per estimator, and the
    share of 0/1 baselines over the whole replay."""
    import polars as pl
    from rich import box
    from rich.table import Table

    if info.get("schedule") == "steps":
        console.print(_step_table(trajectory, info))
        return
    rows = trajectory.filter(pl.col("scope") == "checkpoint")
    checkpoints = rows["checkpoint"].unique(maintain_order=True).to_list()
    heads = list(checkpoints)
    if info.get("blend"):  # a checkpoint's visits move towards the next one
        heads = [f"{a} -> {b}" for a, b in itertools.pairwise(heads)] + heads[-1:]
    title = (
        f"trajectory replay ({info['epochs_per_checkpoint']} epoch(s) per checkpoint per "
        "visit, state carried): noise-corrected MSE"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("estimator", no_wrap=True)
    table.add_column("G", justify="right")
    for head in heads:
        table.add_column(shown(head), justify="right", no_wrap=True)
    table.add_column("0/1 base", justify="right", no_wrap=True)
    for (name, g), df in rows.group_by("estimator", "rollouts_per_prompt", maintain_order=True):
        by = dict(zip(df["checkpoint"], df["mse_noise_corrected"], strict=True))
        counts = df["n_estimates"].to_numpy()
        extreme = float((df["extreme_rate"].to_numpy() * counts).sum() / counts.sum())
        cells = [f"{by[c]:.5f}" for c in checkpoints]
        table.add_row(shown(name), str(g), *cells, f"{100 * extreme:.1f}%")
    console.print(table)


def _step_table(trajectory: pl.DataFrame, info: Mapping[str, Any]) -> Any:
    """The step replay's table, in 80 columns: per estimator its prompts a step x G, the
    rollouts it spent, the MSE per interval with its training steps (:func:`_shown_intervals`)
    and over the whole replay, and its share of 0/1 baselines."""
    import polars as pl
    from rich import box
    from rich.table import Table

    rows = trajectory.filter(pl.col("scope") == "checkpoint")
    checkpoints, heads, note = _shown_intervals(rows, info)
    title = f"trajectory replay ({trajectory['schedule'][0]}, state carried): noise-corrected MSE"
    table = Table(title=title, caption=note or None, box=box.SIMPLE_HEAD)
    table.add_column("estimator", no_wrap=True)
    table.add_column("prompts\nx G", justify="right", no_wrap=True)
    table.add_column("roll-\nouts", justify="right", no_wrap=True)
    for head in [*heads, "whole"]:
        table.add_column(shown(head), justify="right", min_width=6)
    table.add_column("0/1\nbase", justify="right", no_wrap=True)
    whole = trajectory.filter(pl.col("scope") == "trajectory")
    for row in whole.iter_rows(named=True):
        by = rows.filter(pl.col("estimator") == row["estimator"])
        mse = dict(zip(by["checkpoint"], by["mse_noise_corrected"], strict=True))
        cells = [f"{mse[c]:.4f}" for c in checkpoints] + [f"{row['mse_noise_corrected']:.4f}"]
        spent = [
            f"{row['prompts_per_step']} x {row['rollouts_per_prompt']}",
            f"{row['rollouts_spent']:,}",
        ]
        table.add_row(shown(row["estimator"]), *spent, *cells, f"{100 * row['extreme_rate']:.1f}%")
    return table


@app.command()
@options_from(
    SensitivityConfig,
    param="cfg",
    cli={
        "rollouts": ROLLOUTS,
        # 'all' kept: sensitivity refuses it (was basis alone)
        "estimators": comma(estimator_names),
        "parameters": comma(comma_list),
        "basis_options": basis_group("calibration", "criterion", "loss", "fixed_beta"),
        "estimator_options": OPTIONS,
    },
)
def sensitivity(
    cfg: SensitivityConfig,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for sensitivity.csv.")
    ] = RESULTS_DIR,
) -> None:
    """Sensitivity of BASIS to eps, cache size n, batch size B and grid size (the paper's Fig. 5)."""
    from basis_bench.evaluation.sensitivity import sensitivity as run_sensitivity

    console = Console()
    _load_plugins(console)
    notes: list[str] = []
    with _progress(console) as bar:
        df = run_sensitivity(cfg, out, progress=_checkpoint_bars(bar), notice=notes.append)
    for note in notes:
        console.print(f"[yellow]{shown(note)}[/]")
    from rich.table import Table

    table = Table(title="sensitivity: MSE as one knob moves")
    for col in ("checkpoint", "estimator", "parameter", "value", "raw MSE", "95% CI"):
        table.add_column(col)
    for row in df.iter_rows(named=True):
        table.add_row(
            shown(row["checkpoint"]),
            shown(row["estimator"]),
            row["parameter"],
            f"{row['value']:g}",
            f"{row['mse']:.5f}",
            f"\\[{row['ci_low']:.5f}, {row['ci_high']:.5f}]",
        )
    console.print(table)
    console.print(f"wrote {shown(Path(out) / 'sensitivity.csv')}")


@app.command()
def figures(
    results: Annotated[
        Path,
        typer.Option(
            "--results", help="Directory written by `evaluate` (and `sensitivity` for Fig. 5)."
        ),
    ] = RESULTS_DIR,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the PNG and PDF figures.")
    ] = Path("figures/value-estimation"),  # "figures" holds the clone's committed folders
) -> None:
    """Plot the paper's Fig. 2, Fig. 3(a)-(d), Fig. 5 and the G sweep from evaluate's tables."""
    from basis_bench.evaluation.figures import make_figures

    console = Console()
    written, skipped = make_figures(results, out)
    for path in written:
        console.print(f"wrote {shown(path)}")
    for name, why in skipped.items():
        console.print(f"[yellow]skipped {shown(name)}[/]: {shown(why)}")

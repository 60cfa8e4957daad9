"""Commands of the value-estimation benchmark: simulate, evaluate, sensitivity, figures."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from basis_bench.cli.app import app
from basis_bench.cli.options import (
    EVALUATE,
    RESULTS_DIR,
    SENSITIVITY,
    BatchOpt,
    CalibrationOpt,
    CheckpointOpt,
    CriterionOpt,
    EpsOpt,
    EstimatorOptionOpt,
    FixedBetaOpt,
    GridOpt,
    LossOpt,
    OracleOpt,
    ReferenceOpt,
    RefNOpt,
    ResultsOutOpt,
    RolloutsOpt,
    SeedOpt,
    basis_options,
    comma_list,
    estimator_options,
    split_names,
)
from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
from basis_bench.quoting import shown
from basis_bench.rollouts.simulation import SimulationConfig, parse_stages
from basis_bench.settings import cli_option

SIMULATION = SimulationConfig()

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
def simulate(
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write the simulated rollouts dataset to.")
    ],
    prompts: Annotated[int, cli_option(SimulationConfig, "n_prompts")] = SIMULATION.n_prompts,
    reference_n: Annotated[
        int, cli_option(SimulationConfig, "reference_n")
    ] = SIMULATION.reference_n,
    checkpoint_n: Annotated[
        int, cli_option(SimulationConfig, "checkpoint_n")
    ] = SIMULATION.checkpoint_n,
    setting: Annotated[str, cli_option(SimulationConfig, "setting")] = SIMULATION.setting,
    stage: Annotated[list[str] | None, cli_option(SimulationConfig, "stages")] = None,
    seed: Annotated[int, cli_option(SimulationConfig, "seed")] = SIMULATION.seed,
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

    cfg = SimulationConfig(
        n_prompts=prompts,
        reference_n=reference_n,
        checkpoint_n=checkpoint_n,
        setting=setting,
        stages=parse_stages(stage) if stage else SIMULATION.stages,
        seed=seed,
    )
    path = run_simulation(cfg, out, force=force)
    Console().print(
        f"wrote simulated dataset ({cfg.setting}, {cfg.n_prompts} prompts, policies reference, {shown(', '.join(cfg.stages))}) to {shown(path)}"
    )


@app.command()
def evaluate(
    rollouts: RolloutsOpt = None,
    checkpoint: CheckpointOpt = None,
    reference: ReferenceOpt = None,
    estimators: Annotated[str, cli_option(EvaluateConfig, "estimators")] = "all",
    batch_size: BatchOpt = EVALUATE.batch_size,
    repeats: Annotated[int, cli_option(EvaluateConfig, "repeats")] = EVALUATE.repeats,
    group_size: Annotated[int, cli_option(EvaluateConfig, "group_size")] = EVALUATE.group_size,
    oracle_n: OracleOpt = EVALUATE.oracle_n,
    ref_n: RefNOpt = EVALUATE.ref_n,
    seed: SeedOpt = EVALUATE.seed,
    out: ResultsOutOpt = RESULTS_DIR,
    calibration: CalibrationOpt = None,
    criterion: CriterionOpt = None,
    loss: LossOpt = None,
    eps: EpsOpt = None,
    grid_size: GridOpt = EVALUATE.grid_size,
    fixed_beta: FixedBetaOpt = None,
    option: EstimatorOptionOpt = None,
    write_estimates: Annotated[
        bool, cli_option(EvaluateConfig, "write_estimates")
    ] = EVALUATE.write_estimates,
    trajectory: Annotated[bool, cli_option(EvaluateConfig, "trajectory")] = EVALUATE.trajectory,
    trajectory_epochs: Annotated[
        int, cli_option(EvaluateConfig, "trajectory_epochs")
    ] = EVALUATE.trajectory_epochs,
    trajectory_blend: Annotated[
        bool, cli_option(EvaluateConfig, "trajectory_blend")
    ] = EVALUATE.trajectory_blend,
    trajectory_schedule: Annotated[
        str, cli_option(EvaluateConfig, "trajectory_schedule")
    ] = EVALUATE.trajectory_schedule,
    rollouts_per_step: Annotated[
        int | None, cli_option(EvaluateConfig, "rollouts_per_step")
    ] = EVALUATE.rollouts_per_step,
    folds: Annotated[int, cli_option(EvaluateConfig, "folds")] = EVALUATE.folds,
    standing_steps: Annotated[
        int, cli_option(EvaluateConfig, "standing_steps")
    ] = EVALUATE.standing_steps,
    features: Annotated[str, cli_option(EvaluateConfig, "features")] = EVALUATE.features,
) -> None:
    """Replay repeated batch draws of stored rollouts through every estimator (the paper's Fig. 3).

    Cost (docs/scale.md): peak memory is about 0.37 GB + the data (2 bytes a 0/1 rollout) + 2 KB a prompt + at most 64 MiB for the trajectory replay, whatever --repeats (about 0.5 GB at the paper's 17,398 prompts x 880 rollouts); the one-step replay's time grows with repeats, the trajectory replay's (200 streams) with prompts (about 16 CPU-minutes at 17,398 prompts). A run that would not fit in free memory stops before the replay and names the option that fits.
    """
    from basis_bench.evaluation.record import RUN_FILE
    from basis_bench.evaluation.run import evaluate as run_evaluate

    console = Console()
    _load_plugins(console)
    cfg = EvaluateConfig(
        rollouts=str(rollouts) if rollouts is not None else None,
        checkpoints=tuple(checkpoint or ()),
        reference=reference,
        estimators=split_names(estimators),
        batch_size=batch_size,
        repeats=repeats,
        group_size=group_size,
        oracle_n=oracle_n,
        ref_n=ref_n,
        seed=seed,
        grid_size=grid_size,
        basis_options=basis_options(calibration, criterion, loss, eps, fixed_beta),
        estimator_options=estimator_options(option),
        write_estimates=write_estimates,
        trajectory=trajectory,
        trajectory_epochs=trajectory_epochs,
        trajectory_blend=trajectory_blend,
        trajectory_schedule=trajectory_schedule,
        rollouts_per_step=rollouts_per_step,
        folds=folds,
        standing_steps=standing_steps,
        features=features,
    )
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
    console.print(f"wrote {shown(result.out)}/: {', '.join([*(run.tables or {}), RUN_FILE])}")


def print_summary(summary: pl.DataFrame, console: Console) -> None:
    """One rich table per checkpoint: rollouts per prompt (G), MSE, noise-corrected MSE, 95% CI
    half-width, share of baselines exactly 0 or 1 and the change in MSE against REINFORCE++."""
    import polars as pl
    from rich import box
    from rich.table import Table

    from basis_bench.estimators.baselines import REINFORCE_PP_NAME

    if summary.is_empty():  # only stateful estimators (basis_memory): no one-step rows
        console.print(
            "no one-step estimates: the estimators asked for are stateful and run in the "
            "trajectory replay only (below, and trajectory.csv)"
        )
        return
    for (name,), df in summary.group_by("checkpoint", maintain_order=True):
        base = df.filter(pl.col("estimator") == REINFORCE_PP_NAME)["mse"]
        ref = float(base[0]) if base.len() else None
        table = Table(
            title=f"checkpoint {shown(name)}: value-estimation MSE against the oracle",
            box=box.SIMPLE_HEAD,
        )
        table.add_column("estimator", no_wrap=True)
        for col in ("G", "MSE", "MSE-noise", "±95%", "0/1 base", "vs R++"):
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
            )
        console.print(table)


def print_trajectory(trajectory: pl.DataFrame, info: Mapping[str, Any], console: Console) -> None:
    """The trajectory replay per checkpoint (per interval between checkpoints, on the step
    schedule): noise-corrected MSE, one row per estimator, and the share of 0/1 baselines
    over the whole replay."""
    import polars as pl
    from rich import box
    from rich.table import Table

    rows = trajectory.filter(pl.col("scope") == "checkpoint")
    checkpoints = rows["checkpoint"].unique(maintain_order=True).to_list()
    heads = list(checkpoints)
    steps = info.get("schedule") == "steps"
    if info.get("blend") or steps:  # a checkpoint's visits move towards the next one
        heads = [f"{a} -> {b}" for a, b in itertools.pairwise(heads)] + heads[-1:]
    if steps:
        spent = trajectory["schedule"][0]
        title = f"trajectory replay ({spent}, state carried): noise-corrected MSE"
    else:
        title = (
            f"trajectory replay ({info['epochs_per_checkpoint']} epoch(s) per checkpoint per "
            "visit, state carried): noise-corrected MSE"
        )
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("estimator", no_wrap=True)
    table.add_column("G", justify="right")
    if steps:
        table.add_column("prompts/step", justify="right")
        table.add_column("rollouts", justify="right")
    for head in heads:
        table.add_column(shown(head), justify="right", no_wrap=True)
    if steps:
        table.add_column("whole", justify="right", no_wrap=True)
    table.add_column("0/1 base", justify="right", no_wrap=True)
    whole = trajectory.filter(pl.col("scope") == "trajectory")
    for (name, g), df in rows.group_by("estimator", "rollouts_per_prompt", maintain_order=True):
        by = dict(zip(df["checkpoint"], df["mse_noise_corrected"], strict=True))
        counts = df["n_estimates"].to_numpy()
        extreme = float((df["extreme_rate"].to_numpy() * counts).sum() / counts.sum())
        cells = [f"{by[c]:.5f}" for c in checkpoints]
        if steps:
            row = whole.filter(pl.col("estimator") == name).row(0, named=True)
            spent = [str(row["prompts_per_step"]), f"{row['rollouts_spent']:,}"]
            cells = [*spent, *cells, f"{row['mse_noise_corrected']:.5f}"]
        table.add_row(shown(name), str(g), *cells, f"{100 * extreme:.1f}%")
    console.print(table)


@app.command()
def sensitivity(
    rollouts: RolloutsOpt = None,
    checkpoint: CheckpointOpt = None,
    reference: ReferenceOpt = None,
    estimators: Annotated[str, cli_option(SensitivityConfig, "estimators")] = ",".join(
        SENSITIVITY.estimators
    ),
    parameters: Annotated[str, cli_option(SensitivityConfig, "parameters")] = ",".join(
        SENSITIVITY.parameters
    ),
    batch_size: BatchOpt = SENSITIVITY.batch_size,
    repeats: Annotated[int, cli_option(SensitivityConfig, "repeats")] = SENSITIVITY.repeats,
    oracle_n: OracleOpt = SENSITIVITY.oracle_n,
    ref_n: RefNOpt = SENSITIVITY.ref_n,
    eps: Annotated[float, cli_option(SensitivityConfig, "eps")] = SENSITIVITY.eps,
    grid_size: GridOpt = SENSITIVITY.grid_size,
    seed: SeedOpt = SENSITIVITY.seed,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for sensitivity.csv.")
    ] = RESULTS_DIR,
    calibration: CalibrationOpt = None,
    criterion: CriterionOpt = None,
    loss: LossOpt = None,
    fixed_beta: FixedBetaOpt = None,
    option: EstimatorOptionOpt = None,
) -> None:
    """Sensitivity of BASIS to eps, cache size n, batch size B and grid size (the paper's Fig. 5)."""
    from basis_bench.evaluation.sensitivity import sensitivity as run_sensitivity

    console = Console()
    _load_plugins(console)
    cfg = SensitivityConfig(
        rollouts=str(rollouts) if rollouts is not None else None,
        checkpoints=tuple(checkpoint or ()),
        reference=reference,
        estimators=comma_list(estimators)
        or SENSITIVITY.estimators,  # 'all' kept: sensitivity refuses it (was basis alone)
        parameters=comma_list(parameters),
        batch_size=batch_size,
        repeats=repeats,
        oracle_n=oracle_n,
        ref_n=ref_n,
        eps=eps,
        grid_size=grid_size,
        seed=seed,
        basis_options=basis_options(calibration, criterion, loss, None, fixed_beta),
        estimator_options=estimator_options(option),
    )
    notes: list[str] = []
    with _progress(console) as bar:
        df = run_sensitivity(cfg, out, progress=_checkpoint_bars(bar), notice=notes.append)
    for note in notes:
        console.print(f"[yellow]{shown(note)}[/]")
    from rich.table import Table

    table = Table(title="sensitivity: MSE as one knob moves")
    for col in ("checkpoint", "estimator", "parameter", "value", "MSE", "95% CI"):
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

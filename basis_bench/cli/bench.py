"""Commands of the value-estimation benchmark: simulate, evaluate, sensitivity, figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from basis_bench.cli.app import app
from basis_bench.errors import InputError

if TYPE_CHECKING:
    import polars as pl

RolloutsOpt = Annotated[
    Path | None,
    typer.Option(
        "--rollouts",
        help="Rollouts directory in the store schema (docs/schema.md). Default: the simulated "
        "dataset shipped in basis_bench/data/default.",
    ),
]
CheckpointOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--checkpoint",
        help="Checkpoint policy to evaluate; repeat for several. Default: every policy except the reference.",
    ),
]
ReferenceOpt = Annotated[
    str | None,
    typer.Option(
        "--reference",
        help="Reference policy whose first --ref-n samples form BASIS's cache. Default: the "
        "'reference_policy' in the files' metadata, else the policy named 'reference'.",
    ),
]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Prompts per batch draw (B).")]
OracleOpt = Annotated[
    int,
    typer.Option(
        "--oracle-n",
        help="A checkpoint's first N samples per prompt (by sample_idx) form the held-out oracle value.",
    ),
]
RefNOpt = Annotated[
    int, typer.Option("--ref-n", help="Reference samples per prompt in BASIS's offline cache (n).")
]
SeedOpt = Annotated[
    int, typer.Option("--seed", help="Random seed: the same seed writes the same files.")
]
CalibrationOpt = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        help="How BASIS picks beta: current (on this batch), previous (on the previous batch), "
        "fixed (--fixed-beta). Default: the estimator's own.",
    ),
]
CriterionOpt = Annotated[
    str | None,
    typer.Option(
        "--criterion",
        help="In-batch loss BASIS minimises over beta: initial (of the offline V^) or refined (of V~). "
        "Default: the estimator's own.",
    ),
]
LossOpt = Annotated[
    str | None,
    typer.Option("--loss", help="Calibration loss: squared or log. Default: the estimator's own."),
]
GridOpt = Annotated[
    int,
    typer.Option(
        "--grid-size",
        help="Finite candidate betas (log-spaced in [0.05, 50]); beta = inf is always added.",
    ),
]


def _basis_options(
    calibration: str | None,
    criterion: str | None,
    loss: str | None,
    eps: float | None,
    fixed_beta: float | None,
    grid_size: int,
) -> dict[str, Any]:
    """BASIS options the user set; unset ones keep the estimator's defaults."""
    from basis_bench.estimators import default_betas

    opts: dict[str, Any] = {
        k: v
        for k, v in {
            "calibration": calibration,
            "criterion": criterion,
            "loss": loss,
            "eps": eps,
        }.items()
        if v is not None
    }
    if calibration == "fixed":
        if fixed_beta is None or not fixed_beta > 0:
            raise InputError(
                "--calibration fixed needs --fixed-beta, a positive beta of the grid (or inf)"
            )
        betas = default_betas(grid_size)
        finite = math.isfinite(fixed_beta)
        distance = [
            abs(math.log(b / fixed_beta))
            if finite and math.isfinite(b)
            else (0.0 if b == fixed_beta else math.inf)
            for b in betas
        ]
        opts["fixed_index"] = min(range(len(betas)), key=lambda i: (distance[i], i))
    elif fixed_beta is not None:
        raise InputError("--fixed-beta only applies with --calibration fixed")
    return opts


def _split(names: str) -> tuple[str, ...]:
    items = tuple(n.strip() for n in names.split(",") if n.strip())
    return () if items in ((), ("all",)) else items


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
    prompts: Annotated[int, typer.Option("--prompts", help="Number of prompts.")] = 600,
    reference_n: Annotated[
        int,
        typer.Option("--reference-n", help="Reference-policy samples per prompt (BASIS's cache)."),
    ] = 64,
    checkpoint_n: Annotated[
        int,
        typer.Option(
            "--checkpoint-n",
            help="Samples per prompt for each checkpoint: the oracle (--oracle-n of evaluate) plus the pool.",
        ),
    ] = 320,
    setting: Annotated[
        str,
        typer.Option(
            "--setting",
            help="Generative setting: tilt (BASIS's model holds up to small noise), noisy, sharpen or "
            "forget (misspecified; see basis_bench/rollouts/simulate.py).",
        ),
    ] = "tilt",
    stage: Annotated[
        list[str] | None,
        typer.Option(
            "--stage",
            help="Checkpoint as NAME=LOGODDS_SHIFT; repeat. Default: early=0.3 middle=0.8 late=1.5.",
        ),
    ] = None,
    seed: SeedOpt = 0,
) -> None:
    """Write a simulated rollouts dataset (labelled simulated in its metadata)."""
    from basis_bench.rollouts.simulate import SimulationConfig, parse_stages, with_overrides
    from basis_bench.rollouts.simulate import simulate as run_simulation

    cfg = with_overrides(
        SimulationConfig(),
        n_prompts=prompts,
        reference_n=reference_n,
        checkpoint_n=checkpoint_n,
        setting=setting,
        stages=parse_stages(stage) if stage else None,
        seed=seed,
    )
    path = run_simulation(cfg, out)
    Console().print(
        f"wrote simulated dataset ({cfg.setting}, {cfg.n_prompts} prompts, policies reference, {', '.join(cfg.stages)}) to {path}"
    )


@app.command()
def evaluate(
    rollouts: RolloutsOpt = None,
    checkpoint: CheckpointOpt = None,
    reference: ReferenceOpt = None,
    estimators: Annotated[
        str,
        typer.Option("--estimators", help="Comma-separated registered estimator names, or 'all'."),
    ] = "all",
    batch_size: BatchOpt = 64,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Batch draws (repeats) per checkpoint.")
    ] = 1000,
    group_size: Annotated[
        int, typer.Option("--group-size", help="Rollouts per prompt (G) for GRPO and RLOO.")
    ] = 8,
    oracle_n: OracleOpt = 256,
    ref_n: RefNOpt = 64,
    seed: SeedOpt = 0,
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Directory for estimates.parquet, summary.csv and the other tables."
        ),
    ] = Path("results/value-estimation"),
    calibration: CalibrationOpt = None,
    criterion: CriterionOpt = None,
    loss: LossOpt = None,
    eps: Annotated[
        float | None,
        typer.Option(
            "--eps",
            help="Active-set threshold of BASIS's refinement. Default: the estimator's own.",
        ),
    ] = None,
    grid_size: GridOpt = 32,
    fixed_beta: Annotated[
        float | None,
        typer.Option(
            "--fixed-beta", help="Beta for --calibration fixed (nearest grid value; inf allowed)."
        ),
    ] = None,
    write_estimates: Annotated[
        bool,
        typer.Option(
            "--estimates/--no-estimates",
            help="Write the per-estimate rows (estimates.parquet); the tables are written either way.",
        ),
    ] = True,
) -> None:
    """Replay repeated batch draws of stored rollouts through every estimator (the paper's Fig. 3)."""
    from basis_bench.bench.evaluate import EvaluateConfig
    from basis_bench.bench.evaluate import evaluate as run_evaluate

    console = Console()
    cfg = EvaluateConfig(
        rollouts=str(rollouts) if rollouts is not None else None,
        checkpoints=tuple(checkpoint or ()),
        reference=reference,
        estimators=_split(estimators),
        batch_size=batch_size,
        repeats=repeats,
        group_size=group_size,
        oracle_n=oracle_n,
        ref_n=ref_n,
        seed=seed,
        grid_size=grid_size,
        basis_options=_basis_options(calibration, criterion, loss, eps, fixed_beta, grid_size),
        write_estimates=write_estimates,
    )
    with _progress(console) as bar:
        tasks: dict[str, Any] = {}

        def tick(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"checkpoint {name}", total=total)
            bar.update(tasks[name], completed=done)

        result = run_evaluate(cfg, out, progress=tick)
    run = result.run
    if run["simulated"]:
        console.print(f"[yellow]dataset is simulated[/]: {run['dataset_label']}", highlight=False)
    for name, info in run["checkpoints"].items():
        if info["dropped_no_reference"]:
            console.print(
                f"[yellow]checkpoint {name}: dropped {info['dropped_no_reference']} prompt(s) missing from the reference cache[/]"
            )
    print_summary(result.summary, console)
    console.print(
        f"wrote {result.out}/: summary.csv, by_heterogeneity.csv, by_difficulty.csv, g_sweep.csv, beta_choice.csv, fixed_beta.csv, run.json"
        + (", estimates.parquet" if write_estimates else "")
    )


def print_summary(summary: pl.DataFrame, console: Console) -> None:
    """One rich table per checkpoint: rollouts per prompt (G), MSE, noise-corrected MSE, 95% CI
    half-width, share of baselines exactly 0 or 1 and the change in MSE against REINFORCE++."""
    import polars as pl
    from rich import box
    from rich.table import Table

    for (name,), df in summary.group_by("checkpoint", maintain_order=True):
        base = df.filter(pl.col("estimator") == "reinforce_pp")["mse"]
        ref = float(base[0]) if base.len() else None
        table = Table(
            title=f"checkpoint {name}: value-estimation MSE against the oracle", box=box.SIMPLE_HEAD
        )
        table.add_column("estimator", no_wrap=True)
        for col in ("G", "MSE", "MSE-noise", "±95%", "0/1 base", "vs R++"):
            table.add_column(col, justify="right", no_wrap=True)
        for row in df.iter_rows(named=True):
            change = f"{100 * (row['mse'] / ref - 1):+.0f}%" if ref else ""
            table.add_row(
                row["estimator"],
                str(row["rollouts_per_prompt"]),
                f"{row['mse']:.5f}",
                f"{row['mse_noise_corrected']:.5f}",
                f"{(row['ci_high'] - row['ci_low']) / 2:.5f}",
                f"{100 * row['extreme_rate']:.1f}%",
                change,
            )
        console.print(table)


@app.command()
def sensitivity(
    rollouts: RolloutsOpt = None,
    checkpoint: CheckpointOpt = None,
    reference: ReferenceOpt = None,
    estimators: Annotated[
        str,
        typer.Option("--estimators", help="Comma-separated single-rollout estimators to sweep."),
    ] = "basis",
    parameters: Annotated[
        str,
        typer.Option(
            "--parameters", help="Knobs to vary one at a time: any of eps,n,batch_size,grid_size."
        ),
    ] = "eps,n,batch_size,grid_size",
    batch_size: BatchOpt = 64,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Batch draws per setting and checkpoint.")
    ] = 200,
    oracle_n: OracleOpt = 256,
    ref_n: RefNOpt = 64,
    eps: Annotated[
        float, typer.Option("--eps", help="Active-set threshold while another knob varies.")
    ] = 1e-6,
    grid_size: GridOpt = 32,
    seed: SeedOpt = 0,
    out: Annotated[Path, typer.Option("--out", help="Directory for sensitivity.csv.")] = Path(
        "results/value-estimation"
    ),
    calibration: CalibrationOpt = None,
    criterion: CriterionOpt = None,
    loss: LossOpt = None,
) -> None:
    """Sensitivity of BASIS to eps, cache size n, batch size B and grid size (the paper's Fig. 5)."""
    from basis_bench.bench.sensitivity import SensitivityConfig
    from basis_bench.bench.sensitivity import sensitivity as run_sensitivity

    console = Console()
    cfg = SensitivityConfig(
        rollouts=str(rollouts) if rollouts is not None else None,
        checkpoints=tuple(checkpoint or ()),
        reference=reference,
        estimators=_split(estimators) or ("basis",),
        parameters=tuple(p.strip() for p in parameters.split(",") if p.strip()),
        batch_size=batch_size,
        repeats=repeats,
        oracle_n=oracle_n,
        ref_n=ref_n,
        eps=eps,
        grid_size=grid_size,
        seed=seed,
        basis_options=_basis_options(calibration, criterion, loss, None, None, grid_size),
    )
    with _progress(console) as bar:
        tasks: dict[str, Any] = {}

        def tick(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"checkpoint {name}", total=total)
            bar.update(tasks[name], completed=done)

        df = run_sensitivity(cfg, out, progress=tick)
    from rich.table import Table

    table = Table(title="sensitivity: MSE as one knob moves")
    for col in ("checkpoint", "estimator", "parameter", "value", "MSE", "95% CI"):
        table.add_column(col)
    for row in df.iter_rows(named=True):
        table.add_row(
            row["checkpoint"],
            row["estimator"],
            row["parameter"],
            f"{row['value']:g}",
            f"{row['mse']:.5f}",
            f"[{row['ci_low']:.5f}, {row['ci_high']:.5f}]",
        )
    console.print(table)
    console.print(f"wrote {Path(out) / 'sensitivity.csv'}")


@app.command()
def figures(
    results: Annotated[
        Path,
        typer.Option(
            "--results", help="Directory written by `evaluate` (and `sensitivity` for Fig. 5)."
        ),
    ] = Path("results/value-estimation"),
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the PNG and PDF figures.")
    ] = Path("figures"),
) -> None:
    """Plot the paper's Fig. 2, Fig. 3(a)-(d), Fig. 5 and the G sweep from evaluate's tables."""
    from basis_bench.bench.figures import make_figures

    console = Console()
    written, skipped = make_figures(results, out)
    for path in written:
        console.print(f"wrote {path}")
    for name, why in skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")

"""`basis-bench import`: rollouts researchers already have (counts, evaluator JSONL, GRPO
accuracy histories, long tables, lm-evaluation-harness samples) written as a rollouts
dataset."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from basis_bench.cli.app import app
from basis_bench.cli.from_config import options_from
from basis_bench.errors import InputError
from basis_bench.guards.quoting import shown
from basis_bench.rollouts.importers import IMPORTERS, ImportOptions
from basis_bench.rollouts.training_record import record_step

if TYPE_CHECKING:
    import polars as pl

    from basis_bench.rollouts.importers import Imported, WriteReport


@app.command("import")
@options_from(ImportOptions, param="options")
def import_(
    fmt: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT",
            help=f"{' | '.join(IMPORTERS)} (docs/schema.md, 'Importing').",
        ),
    ],
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="SRC...",
            help="Source files (.csv/.tsv/.parquet/.jsonl tables; .jsonl for eval-jsonl; a JSON "
            "map for acc-history; lm-eval's samples_*.jsonl). Several files are read as one "
            "table; for eval-jsonl and lm-eval the same problem in several files (e.g. one per "
            "seed) gets its samples appended in file order.",
        ),
    ],
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="Policy name written in the 'policy' column. acc-history: the prefix of the "
            "visit policies (--policy visit gives visit-000, visit-001, ...). long: if the source "
            "has a --policy-col column, only this policy's rows are imported.",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Dataset directory (created; other policies are kept).")
    ],
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite the policy if --out already holds it.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into --out even if it holds something other than a dataset of real "
            "rollouts (another command's output, simulated data, foreign files).",
        ),
    ] = False,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="Mark this policy as the dataset's reference (BASIS's cache) in the metadata.",
        ),
    ] = False,
    label: Annotated[
        str | None,
        typer.Option("--label", help="Dataset label stored in the metadata (evaluate prints it)."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help="A prompts table (prompt_id, problem, answer[, level, subject]; .parquet/.csv/"
            ".jsonl) merged into DIR/prompts.parquet.",
        ),
    ] = None,
    step: Annotated[
        int | None,
        typer.Option(
            "--step",
            min=0,
            help="The training step the imported policy was saved at, recorded in its parts' "
            "metadata and the dataset's training.json for the trajectory replay's step schedule "
            "(not with acc-history, "
            "whose visits are policies of their own).",
        ),
    ] = None,
    *,
    options: ImportOptions,
) -> None:
    """Import existing multi-sample evaluation results into a rollouts dataset at --out
    (one policy per run; rerun with other sources and --policy to add more)."""
    from basis_bench.rollouts.importers import import_sources, write_import

    if step is not None and fmt == "acc-history":
        raise InputError("--step records one policy's training step; acc-history writes one "
                         "policy per visit: drop --step")  # fmt: skip
    start = time.perf_counter()
    extra = _prompts_table(prompts) if prompts is not None else None
    result = import_sources(fmt, sources, policy, options)
    if extra is not None:
        _check_prompts_cover(extra, result.rollouts, str(prompts))
    report = write_import(
        result, out, replace=replace, reference=reference, label=label, prompts=extra,
        force=force, step=step,
    )  # fmt: skip
    if step is not None:
        record_step(out, policy, step)
    _print_summary(result, report, out, time.perf_counter() - start)


def _prompts_table(path: Path) -> pl.DataFrame:
    """The --prompts table, checked like a dataset's prompts.parquet."""
    from basis_bench.rollouts.features import FEATURE_COLUMN, stored_features
    from basis_bench.rollouts.importers.checks import prompt_texts, report_prompt_values
    from basis_bench.rollouts.importers.reading import Problems, read_table
    from basis_bench.rollouts.store import conform_prompts

    table, src = read_table(path, text_cols=prompt_texts("problem", "answer"))
    problems = Problems()  # conform_prompts would cast: 0.1 + 0.2 -> "0.30000000000000004"
    report_prompt_values(table, src, "problem", "answer", problems)
    problems.raise_if_any(str(path))
    table = conform_prompts(table.drop("_loc"), what=str(path))
    if FEATURE_COLUMN in table.columns:
        stored_features(table)  # one finite vector per prompt, all of one length
    return table


def _check_prompts_cover(prompts: pl.DataFrame, rollouts: pl.DataFrame, path: str) -> None:
    """Every imported prompt id must be in the --prompts table."""
    import polars as pl

    from basis_bench.errors import InputError

    missing = rollouts.filter(~pl.col("prompt_id").is_in(prompts["prompt_id"].implode()))
    if missing.height:
        raise InputError(
            f"--prompts {path} lacks prompt {missing['prompt_id'][0]!r} "
            f"({missing['prompt_id'].n_unique()} missing); check --id-col/--id-format"
        )


def _print_summary(result: Imported, report: WriteReport, out: Path, seconds: float) -> None:
    console = Console(stderr=True)
    rows = result.rollouts
    names = (
        ", ".join(result.policies)
        if len(result.policies) <= 4
        else (f"{result.policies[0]} .. {result.policies[-1]} ({len(result.policies)} policies)")
    )
    console.print(
        f"imported {rows.height:,} rollouts ({rows['prompt_id'].n_unique():,} prompts, mean reward "
        f"{float(rows['reward'].to_numpy().mean()):.4f}) as {shown(names)} -> {shown(out)}"
        + (" (replaced)" if report.replaced else "")
        + (", prompts.parquet" if report.prompts_written else "")
        + f" in {seconds:.2f}s",
        highlight=False,
    )
    if result.order == "synthetic":
        console.print(
            "[yellow]order: synthetic[/]: rewards were expanded from counts in a seeded random "
            "order (statistically faithful; sample_idx is not a generation order)",
            highlight=False,
        )

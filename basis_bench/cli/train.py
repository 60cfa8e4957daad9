"""`basis-bench train` and `basis-bench train-figures`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from basis_bench.cli.app import app
from basis_bench.cli.oracle import ConsoleProgress
from basis_bench.errors import reraise_swallowed_interrupt
from basis_bench.guards.quoting import shown


class _CacheProgress(ConsoleProgress):
    """The reference cache's build, shown as `basis-bench oracle` shows a run (a live bar on
    a terminal, a line every 30 s in a log), introduced as the cache it is."""

    def planned(self, job: Any, n_prompts: int, todo: int, done: int, workers: int) -> None:
        if not todo:
            self.console.print(f"reference cache: reusing {job.out}", highlight=False)
            return
        self.console.print(
            f"reference cache: sampling {job.n} responses to each of {n_prompts} training "
            f"prompts from the reference policy into {job.out} ({done} of {todo + done} "
            "chunk(s) already there; later runs with the same settings reuse it)",
            highlight=False,
        )


def _describe(record: dict[str, Any]) -> str:
    """One progress line per log record."""
    parts = [f"step {record['step']:>4}"]
    if "mean_reward" in record:
        beta = record.get("beta")
        parts += [
            f"reward {record['mean_reward']:.3f}",
            f"beta {beta:.3g}" if beta is not None else "",
            f"adv {record['adv_mean']:+.3f}±{record['adv_std']:.3f}",
            f"zero-adv {record['zero_adv_share']:.0%}",
            f"loss {record['loss']:+.4f}",
        ]
    if "eval_accuracy" in record:
        parts.append(f"[bold]held-out {record['eval_accuracy']:.3f}[/]")
    parts.append(" ".join(f"{k} {v:.1f}s" for k, v in record.get("seconds", {}).items()))
    return "  ".join(p for p in parts if p)


@app.command()
def train(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML file of training settings (see experiments/ and docs/training.md); "
            "'extends = \"base.toml\"' inherits from another file. Not needed with --resume.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override one setting, key=value with a TOML value (repeatable): "
            "--set loss=grpo --set lr=3e-6 --set estimator_options.calibration=previous.",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue a run from its checkpoint directory RUN/checkpoints/step-T: the run's "
            "own settings (plus --set, e.g. steps=60), optimizer and RNG state; the step count "
            "goes on from T and log records after T are replaced.",
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds",
            help="Train once per seed (comma-separated, e.g. 0,1,2), each in run_dir/seed-S; "
            "rerun the same command to go on: finished runs are skipped, interrupted ones "
            "resume from their latest checkpoint.",
        ),
    ] = None,
    keep_checkpoints: Annotated[
        int,
        typer.Option(
            "--keep-checkpoints",
            help="With --seeds: keep only each run's newest N checkpoints (0: all).",
            min=0,
        ),
    ] = 0,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into run_dir even if it holds something other than a training run "
            "(a rollouts dataset, results, foreign files).",
        ),
    ] = False,
) -> None:
    """Train a policy with RL on verifiable rewards, with the advantage estimator as a plug-in:
    sample, score with math-verify, baselines from any registered estimator, then a GPG, GRPO
    or GSPO update. Logs to RUN/log.jsonl; checkpoints load with `basis-bench oracle --model`."""
    from basis_bench.train import train as run_training

    settings = _settings(config, resume, list(set_ or []), seeds, keep_checkpoints)
    console = Console(stderr=True)

    def announce(run: Any, state: str = "new") -> None:
        what = {
            "new": "training",
            "resume": "resuming",
            "restart": "no checkpoint yet, restarting",
            "finished": "finished, skipping",
        }
        console.print(
            f"{what[state]} {shown(run.generation.model)} with {run.estimator} + {run.loss}, "
            f"{run.rollouts_per_step} rollouts/step, {run.steps} steps -> {shown(run.run_dir)}",
            highlight=False,
        )

    def progress(record: dict[str, Any]) -> None:
        reraise_swallowed_interrupt()
        console.print(_describe(record))

    if seeds is not None:
        from basis_bench.cli.options import comma_list
        from basis_bench.train.seeds import train_seeds

        numbers = [_seed(s) for s in comma_list(seeds)]
        runs = train_seeds(
            settings, numbers, progress, announce, keep_checkpoints, force, _CacheProgress()
        )
        console.print(f"done: {', '.join(shown(str(r)) for r in runs)}")
        return
    announce(settings)
    run_dir = run_training(
        settings, resume, on_record=progress, force=force, progress=_CacheProgress()
    )
    console.print(f"done: {shown(run_dir)}")


def _settings(
    config: Path | None,
    resume: Path | None,
    overrides: list[str],
    seeds: str | None,
    keep_checkpoints: int,
) -> Any:
    """The run's settings from --config or --resume and --set; a flag that does not go with
    the others is one line."""
    from basis_bench.errors import InputError
    from basis_bench.train import make_config, read_config_file, resume_config

    if seeds is not None and resume is not None:
        raise InputError("--seeds resumes each seed's run itself; drop --resume")
    if keep_checkpoints and seeds is None:
        raise InputError("--keep-checkpoints applies to --seeds runs; add --seeds")
    if resume is not None:
        if config is not None:
            raise InputError("--resume continues a run with its own settings; drop --config")
        return resume_config(resume, overrides)
    if config is None:
        raise InputError("pass --config FILE (or --resume CHECKPOINT)")
    return make_config(read_config_file(config), overrides)


def _seed(text: str) -> int:
    from basis_bench.errors import InputError

    if not text.isdigit():
        raise InputError(f"--seeds: {text!r} is not a seed (a whole number >= 0)")
    return int(text)


@app.command("train-figures")
def train_figures(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Arms: each a training run directory (with log.jsonl) or a folder of its "
            "seed-S runs (train --seeds), drawn as the mean over seeds with a 95% band."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the PNG figures and summary CSV.")
    ] = Path("figures/training"),
    smooth: Annotated[
        int,
        typer.Option("--smooth", help="Steps in the rolling mean of the training reward curve."),
    ] = 5,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into --out even if it holds something else than training figures.",
        ),
    ] = False,
) -> None:
    """Learning curves per arm (held-out greedy accuracy and training reward against step, mean
    over seeds with a 95% t-interval band), the calibrated beta against step (the paper's
    Fig. 8), the value probe's error of the baseline against step (runs that logged it),
    PNG + PDF, and the summary table per arm with intervals (CSV and markdown)."""
    from basis_bench.evaluation.figure_style import colours, label, paper_style
    from basis_bench.train.figures import plot_training

    paper_style()

    for path in plot_training(runs, out, smooth, label=label, colours=colours(), force=force):
        typer.echo(str(path))

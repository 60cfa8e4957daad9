"""The `basis-bench` command line: one typer app, one module per command group.

Each command module exposes plain functions; they are registered here so that
`basis-bench --help` lists them all. Heavy imports (torch, transformers, vllm) stay
inside the command bodies, so `--help` is instant.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from basis_bench.errors import InputError

app = typer.Typer(
    name="basis-bench",
    help="Value and advantage estimation for RLVR: sample rollouts, replay them through "
    "BASIS, GRPO, RLOO and REINFORCE++, and plot the paper's figures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules register themselves on `app` when imported.
from basis_bench.cli import commands  # noqa: E402, F401


def main() -> None:
    """Console-script entry point: user mistakes become one clear line, exit code 2."""
    try:
        app()
    except InputError as err:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {err}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        Console(stderr=True, soft_wrap=True).print(
            "[yellow]interrupted[/]: completed parts are kept; rerun to resume"
        )
        sys.exit(130)

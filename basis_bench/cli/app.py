"""The typer app every command registers on, and the entry point that turns user mistakes
into one line."""

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

"""The typer app every command registers on, and the entry point that turns user mistakes
and failed writes into one line."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from basis_bench.errors import (
    WRITE_ERRNOS,
    InputError,
    OneLineWarning,
    interrupt_exit,
    os_errno,
    swallowed_interrupt,
)
from basis_bench.guards.extras import missing_extra
from basis_bench.guards.quoting import printable, shown
from basis_bench.settings import RenamedSetting

app = typer.Typer(
    name="basis-bench",
    help="Value and advantage estimation for RLVR: sample rollouts, replay them through "
    "BASIS, GRPO, RLOO and REINFORCE++, and plot the paper's figures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(given: bool) -> None:
    if given:
        from basis_bench.guards.provenance import __version__

        typer.echo(f"basis-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Options before the command (basis-bench --version)."""


# What an interrupted or failed run of each command leaves behind, and what to do next
# (docs/failure_behaviour.md says the same at length).
AFTER_FAILURE: dict[str, str] = {
    "oracle": "completed parts are kept; rerun the same command to resume",
    "import": "nothing of this import was published; rerun it",
    "simulate": "the dataset in --out may be incomplete; rerun the same command to rewrite it",
    "train": "checkpoints already written are kept; continue with --resume "
    "RUN/checkpoints/step-T (the steps after T are redone)",
    "train-figures": "figures already written are complete; rerun to write the rest",
    "evaluate": "the results folder still holds the earlier run whole (or nothing); rerun",
    "sensitivity": "sensitivity.csv is the earlier run's, whole (or absent); rerun",
    "figures": "figures already written are complete; rerun to write the rest",
}
DEFAULT_AFTER_FAILURE = (
    "files already written are complete, but the output may be missing some; rerun the command"
)


def running_command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first argument that is a registered command)."""
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    return next((a for a in argv[1:] if a in names), None)


def after_failure(argv: list[str]) -> str:
    """What the user should know after the command in ``argv`` stopped early."""
    return AFTER_FAILURE.get(running_command(argv) or "", DEFAULT_AFTER_FAILURE)


def refuse_empty_paths(args: list[str]) -> None:
    """A path option given an empty value (``--rollouts ''``, ``--out "$UNSET"``) is one
    line: typer read it as the current folder, which a reader then walked whole (with its
    link loops: out of memory) and a writer claimed."""
    if not any(a == "" or a.endswith("=") for a in args):
        return
    flags = _path_flags(app)
    for flag, value in zip(args, [*args[1:], None], strict=True):
        name, eq, inline = flag.partition("=")
        if name in flags and ((eq and not inline) or (not eq and value == "")):
            raise InputError(f"{name} is empty; give a path (. for the current folder)")


def _path_flags(typer_app: typer.Typer) -> set[str]:
    """The flags of every option of every command that takes a path (or a list of them)."""
    import typing

    from typer.models import OptionInfo

    flags: set[str] = set()
    for callback in filter(None, (c.callback for c in typer_app.registered_commands)):
        for hint in typing.get_type_hints(callback, include_extras=True).values():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            kind, *extras = typing.get_args(hint)
            takes = (kind, *typing.get_args(kind), *map(typing.get_args, typing.get_args(kind)))
            if any(t is Path or (isinstance(t, tuple) and Path in t) for t in takes):
                for info in (e for e in extras if isinstance(e, OptionInfo)):
                    flags |= {str(info.default), *(info.param_decls or ())}  # flag first
    return {f for f in flags if f.startswith("--")}


def main() -> None:
    """Console-script entry point: user mistakes become one clear line (exit code 2), as does
    a module an optional extra installs (:mod:`basis_bench.guards.extras`), a
    failed write (disk full, read-only, no permission) one line saying what is kept
    (exit code 1), Ctrl-C the same (exit code 130), SIGTERM too (exit code 143; the
    handler is armed by :mod:`basis_bench.__main__`)."""
    from basis_bench.cli.progress_bars import quiet_progress_bars

    quiet_progress_bars()  # before transformers or the Hub is imported
    console = Console(stderr=True, soft_wrap=True)
    swallowed_interrupt(forget=True)
    _show_warnings_quoted(console)
    try:
        refuse_empty_paths(sys.argv[1:])
        app()
    except InputError as err:
        console.print(f"[bold red]error:[/] {shown(err)}", highlight=False)
        sys.exit(2)
    except ModuleNotFoundError as err:
        hint = missing_extra(err)
        if hint is None:
            raise
        console.print(f"[bold red]error:[/] {shown(hint)}", highlight=False)
        sys.exit(2)
    except OSError as err:
        code = os_errno(err)  # polars gives a full disk's errno in its text alone
        if code not in WRITE_ERRNOS:
            raise
        where = f" ({shown(err.filename)})" if err.filename else ""
        console.print(
            f"[bold red]error:[/] {WRITE_ERRNOS[code]}{where}; {after_failure(sys.argv)}",
            highlight=False,
        )
        sys.exit(1)
    except KeyboardInterrupt as stop:
        _say_interrupted(console, stop)
    except SystemExit as stop:
        # typer turns Ctrl-C into a silent exit 130; say what the interrupted run kept.
        cause = _interrupted(stop)
        if cause is not None:
            _say_interrupted(console, cause)
        swallowed = swallowed_interrupt() if stop.code in (0, None) else None
        if swallowed is not None:  # a library ignored it and the command ran to its end
            word, code = interrupt_exit(swallowed)
            console.print(
                f"[yellow]{word}[/] inside a library call that ignored it; the command ran to "
                "its end, so its output is complete",
                highlight=False,
            )
            sys.exit(code)
        raise


def _show_warnings_quoted(console: Console) -> None:
    """Every warning with its control characters escaped, as errors are (a prompt file's
    name in "skipped 2 problem(s) with no answer" reached the terminal raw); a setting
    given by its old name, or any :class:`OneLineWarning`, is one ``warning:`` line (Python's
    default shows the file, the line and the source of the warning call too)."""
    show = warnings.showwarning

    def showwarning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, (RenamedSetting, OneLineWarning)):
            console.print(f"[yellow]warning:[/] {shown(message)}", highlight=False)
        else:
            show(printable(message), category, *args, **kwargs)

    warnings.showwarning = showwarning


def _say_interrupted(console: Console, stop: KeyboardInterrupt) -> None:
    """One line on what an interrupted (Ctrl-C, 130) or terminated (SIGTERM, 143) run kept."""
    word, code = interrupt_exit(stop)
    console.print(f"[yellow]{word}[/]: {after_failure(sys.argv)}", highlight=False)
    sys.exit(code)


def _interrupted(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt ``error`` came from (through typer's Exit(130)), if any."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None

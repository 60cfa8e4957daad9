"""The `basis-bench` command line: one typer app (:mod:`.app`), one module per command group.

Importing this package registers every command: ``evaluation`` (evaluate, sensitivity, figures,
simulate), ``oracle`` and ``train``. Heavy imports (torch, transformers, vllm) stay inside
the command bodies, so `--help` is instant.
"""

from basis_bench.cli import evaluation, importer, oracle, train  # noqa: F401  (each registers its commands)
from basis_bench.cli.app import app, main

__all__ = ["app", "main"]

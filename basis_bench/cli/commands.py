"""Imports every command module so each registers its commands on the app."""

from basis_bench.cli import evaluate  # noqa: F401
from basis_bench.cli import oracle  # noqa: F401
from basis_bench.cli import train  # noqa: F401

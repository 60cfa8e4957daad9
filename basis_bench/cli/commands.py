"""Imports every command module so each registers its commands on the app."""

from basis_bench.cli import (
    evaluate,  # noqa: F401
    oracle,  # noqa: F401
    train,  # noqa: F401
)

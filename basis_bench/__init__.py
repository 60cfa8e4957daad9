"""basis-bench: value and advantage estimation for RL with verifiable rewards.

The estimators live in :mod:`basis_bench.estimators`; the rollout store in
:mod:`basis_bench.rollouts.store`; the command line in :mod:`basis_bench.cli`; the benchmark's commands as functions
returning polars frames (``basis_bench.evaluate``, ``sensitivity``, ``load_rollouts``,
``simulate``) in :mod:`basis_bench.api`.
"""

from basis_bench.guards.provenance import __version__

__all__ = ["__version__"]

_API = ("evaluate", "sensitivity", "load_rollouts", "simulate", "EvaluateResult")


def __getattr__(name: str) -> object:
    """The notebook API (:mod:`basis_bench.api`), imported on first use so that
    ``import basis_bench`` stays light for the command line."""
    if name in _API:
        from basis_bench import api

        return getattr(api, name)
    raise AttributeError(f"module 'basis_bench' has no attribute {name!r}")

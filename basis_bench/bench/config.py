"""The settings of the benchmark commands, light to import (the CLI reads its defaults here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from basis_bench.estimators.options import DEFAULT_EPS, DEFAULT_GRID_SIZE


@dataclass(frozen=True)
class EvaluateConfig:
    """Options of ``basis-bench evaluate`` (see its --help)."""

    rollouts: str | None = None
    checkpoints: tuple[str, ...] = ()
    reference: str | None = None
    estimators: tuple[str, ...] = ()  # empty = every registered estimator
    batch_size: int = 64
    repeats: int = 1000
    group_size: int = 8
    oracle_n: int = 256
    ref_n: int = 64
    seed: int = 0
    grid_size: int = DEFAULT_GRID_SIZE
    basis_options: dict[str, Any] = field(default_factory=dict)  # to every BASIS-type estimator
    estimator_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # {name: {k: v}}
    write_estimates: bool = True
    trajectory: bool = True  # trajectory replay of every estimator (trajectory.csv)
    trajectory_epochs: int = 1  # epochs over the prompts per checkpoint in trajectory replay
    trajectory_blend: bool = False  # move between checkpoints over the epochs (mixture policy)


DEFAULT_VALUES: dict[str, tuple[float, ...]] = {
    "eps": (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
    "n": (8, 16, 32, 64),
    "batch_size": (16, 32, 64, 128, 256),
    "grid_size": (8, 16, 32, 64),
}


@dataclass(frozen=True)
class SensitivityConfig:
    """Options of ``basis-bench sensitivity`` (see its --help); the defaults are Fig. 5's."""

    rollouts: str | None = None
    checkpoints: tuple[str, ...] = ()
    reference: str | None = None
    estimators: tuple[str, ...] = ("basis",)
    parameters: tuple[str, ...] = tuple(DEFAULT_VALUES)
    batch_size: int = 64
    repeats: int = 200
    oracle_n: int = 256
    ref_n: int = 64
    eps: float = DEFAULT_EPS
    grid_size: int = DEFAULT_GRID_SIZE
    seed: int = 0
    basis_options: dict[str, Any] = field(default_factory=dict)  # to every BASIS-type estimator
    estimator_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # {name: {k: v}}

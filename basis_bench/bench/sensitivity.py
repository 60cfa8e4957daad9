"""Sensitivity of BASIS to its knobs, as in the paper's Figure 5.

One knob at a time moves while the others stay at their defaults (eps = 1e-6, n = 64
cached reference samples, B = 64, a 32-value beta grid plus beta = inf), per checkpoint:

* ``eps``: the active-set threshold of the refinement, 1e-8 .. 1e-2;
* ``n``: reference samples in the cache, 8 .. 64 (the first n by sample_idx);
* ``batch_size``: B, 16 .. 256 (values above the number of prompts are skipped);
* ``grid_size``: finite candidate betas, 8 .. 64.

Every setting replays the same seeded draws (common random numbers: the same batches and
rollouts for the same B), so differences between settings are not sampling noise of the
batch draws. Output: ``sensitivity.csv`` with one row per (checkpoint, parameter, value,
estimator) and the columns of ``summary.csv``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.bench.evaluate import (
    ReplaySettings,
    Tilt,
    _write_csv,
    checkpoint_data,
    open_dataset,
    replay,
    resolve_estimators,
    summary_table,
)
from basis_bench.errors import InputError
from basis_bench.estimators import default_betas

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
    eps: float = 1e-6
    grid_size: int = 32
    seed: int = 0
    basis_options: dict[str, Any] = field(default_factory=dict)


def _settings(cfg: SensitivityConfig) -> list[tuple[str, float]]:
    """(parameter, value) for every point of the sweep."""
    unknown = [p for p in cfg.parameters if p not in DEFAULT_VALUES]
    if unknown:
        raise InputError(
            f"unknown sensitivity parameter(s) {unknown}; choose from {', '.join(DEFAULT_VALUES)}"
        )
    return [(p, v) for p in cfg.parameters for v in DEFAULT_VALUES[p]]


def sensitivity(
    cfg: SensitivityConfig,
    out: str | os.PathLike[str],
    progress: Callable[[str, int, int], None] | None = None,
) -> pl.DataFrame:
    """Run the sweep and write ``out/sensitivity.csv``; returns its rows.

    Values the data cannot support (n above the cached reference samples, B above the
    number of prompts) are skipped, so they have no row.
    """
    estimators = resolve_estimators(cfg.estimators)
    if any(e.group for e in estimators):
        raise InputError(
            "sensitivity studies single-rollout estimators; drop grpo/rloo from --estimators"
        )
    points = _settings(cfg)
    ds = open_dataset(cfg.rollouts, cfg.reference, cfg.checkpoints)
    rows: list[pl.DataFrame] = []
    for name in ds.checkpoints:
        full = checkpoint_data(ds, name, cfg.oracle_n, None, 1)
        if cfg.ref_n > full.cache.shape[1]:
            raise InputError(
                f"--ref-n {cfg.ref_n} exceeds the {full.cache.shape[1]} cached reference samples"
            )
        for done, (param, value) in enumerate(points, start=1):
            n = int(value) if param == "n" else cfg.ref_n
            b = int(value) if param == "batch_size" else cfg.batch_size
            k = int(value) if param == "grid_size" else cfg.grid_size
            eps = float(value) if param == "eps" else cfg.eps
            if n <= full.cache.shape[1] and b <= full.n_prompts:
                data = replace(full, cache=full.cache[:, :n])
                settings = ReplaySettings(
                    batch_size=b,
                    repeats=cfg.repeats,
                    group_size=1,
                    seed=cfg.seed,
                    basis_options={**cfg.basis_options, "eps": eps},
                    extras=False,
                )
                rep = replay(
                    data, Tilt.from_cache(data.cache, default_betas(k)), estimators, settings
                )
                rows.append(
                    summary_table(rep, b).with_columns(
                        pl.lit(param).alias("parameter"), pl.lit(float(value)).alias("value")
                    )
                )
            if progress is not None:
                progress(name, done, len(points))
    df = pl.concat(rows).select(
        "checkpoint", "parameter", "value", pl.exclude("checkpoint", "parameter", "value")
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(df, out / "sensitivity.csv")
    return df

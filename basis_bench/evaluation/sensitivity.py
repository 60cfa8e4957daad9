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
from dataclasses import asdict, replace
from pathlib import Path

import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Estimator, TiltTable, default_betas
from basis_bench.estimators.table import grid_beta_index
from basis_bench.evaluation.config import (
    DEFAULT_REF_N,
    DEFAULT_VALUES,
    SensitivityConfig,
    given,
    named,
)
from basis_bench.evaluation.dataset import CheckpointData, checkpoint_data, open_dataset
from basis_bench.evaluation.record import SENSITIVITY_FILE, SensitivityRecord
from basis_bench.evaluation.replay import ReplaySettings, replay
from basis_bench.evaluation.run import resolve_estimators, resolve_options
from basis_bench.evaluation.tables import (
    claim_results_dir,
    new_run_id,
    summary_table,
    write_csv,
)
from basis_bench.guards.outputs import holds_output_locks, write_text_atomic
from basis_bench.guards.provenance import file_sha256
from basis_bench.guards.work_limit import check_draws
from basis_bench.rollouts.fingerprint import dataset_sha256

"""sensitivity's own run record beside sensitivity.csv: its run id, the table's sha256 and
the dataset, so `figures` knows the table is whole and which data it came from."""


def _settings(cfg: SensitivityConfig) -> list[tuple[str, float]]:
    """(parameter, value) for every point of the sweep; a parameter named twice is swept once
    (its rows were written twice)."""
    unknown = [p for p in cfg.parameters if p not in DEFAULT_VALUES]
    if unknown:
        raise InputError(
            f"unknown sensitivity parameter(s) {unknown}; choose from {', '.join(DEFAULT_VALUES)}"
        )
    if not cfg.parameters:  # an empty sweep: polars' "cannot concat empty list" traceback
        raise InputError(
            f"{named('parameters')} names none; choose from {', '.join(DEFAULT_VALUES)}"
        )
    return [(p, v) for p in dict.fromkeys(cfg.parameters) for v in DEFAULT_VALUES[p]]


def _check_fixed_betas(
    cfg: SensitivityConfig, estimators: list[Estimator], points: list[tuple[str, float]]
) -> None:
    """A fixed beta must be on every grid the sweep uses: one off a grid_size point's grid
    stopped the sweep midway, blaming --grid-size (on whose grid it was)."""
    options, _ = resolve_options(estimators, cfg.basis_options, cfg.estimator_options)
    fixed = {o.fixed_beta for o in options.values() if getattr(o, "calibration", "") == "fixed"}
    sizes = sorted({int(v) for p, v in points if p == "grid_size"} - {cfg.grid_size})
    for beta in fixed:
        grid_beta_index(default_betas(cfg.grid_size), beta)  # names --grid-size
        for k in sizes:
            try:
                grid_beta_index(default_betas(k), beta)
            except InputError:
                raise InputError(
                    f"fixed_beta {beta:g} is not on the {k}-beta grid that --parameters "
                    "grid_size sweeps to; drop grid_size from --parameters, or fix beta at a "
                    "value on every grid (0.05, 50 or inf)"
                ) from None


def _point(
    cfg: SensitivityConfig,
    full: CheckpointData,
    estimators: list[Estimator],
    param: str,
    value: float,
) -> pl.DataFrame | None:
    """summary.csv rows of one point of the sweep, or None where the data cannot support it."""
    n = int(value) if param == "ref_n" else cfg.ref_n or min(DEFAULT_REF_N, full.cache.shape[1])
    b = int(value) if param == "batch_size" else cfg.batch_size
    k = int(value) if param == "grid_size" else cfg.grid_size
    eps = float(value) if param == "eps" else cfg.eps
    if n > full.cache.shape[1] or b > full.n_prompts:
        return None
    data = replace(full, cache=full.cache[:, :n])
    options, beta_options = resolve_options(
        estimators, {**cfg.basis_options, "eps": eps}, cfg.estimator_options
    )
    settings = ReplaySettings(
        batch_size=b, repeats=cfg.repeats, group_size=1, seed=cfg.seed, options=options,
        beta_options=beta_options, extras=False,
    )  # fmt: skip
    rep = replay(data, TiltTable.from_cache(data.cache, default_betas(k)), estimators, settings)
    return summary_table(rep, b).with_columns(
        pl.lit(param).alias("parameter"), pl.lit(float(value)).alias("value")
    )


def _swept_estimators(cfg: SensitivityConfig) -> list[Estimator]:
    """The estimators named, each one-step and single-rollout (what the sweep can vary)."""
    names = list(cfg.estimators)
    if not names or "all" in names:  # was basis alone, silently
        raise InputError(
            f"sensitivity sweeps the estimators {named('estimators')} names, not 'all' (group "
            "and stateful ones cannot be swept): e.g. "
            f"{given('estimators', ('basis', 'basis_vop'))}"
        )
    estimators = resolve_estimators(names)
    unfit = [e.name for e in estimators if e.group or e.stateful]
    if unfit:
        raise InputError(
            "sensitivity studies one-step single-rollout estimators; drop "
            f"{', '.join(unfit)} from {named('estimators')}"
        )
    return estimators


@holds_output_locks
def sensitivity(
    cfg: SensitivityConfig,
    out: str | os.PathLike[str] | None,
    progress: Callable[[str, int, int], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """Run the sweep and write ``out/sensitivity.csv`` (nothing when ``out`` is None);
    returns its rows.

    Values the data cannot support (n above the cached reference samples, B above the
    number of prompts) are skipped, so they have no row. ``notice`` hears of prompts
    dropped for want of reference samples (as evaluate says; they were dropped silently).
    """
    estimators = _swept_estimators(cfg)
    points = _settings(cfg)
    _check_fixed_betas(cfg, estimators, points)
    ds = open_dataset(cfg.rollouts, cfg.reference, cfg.checkpoints)
    prompts = ds.rewards[ds.reference].matrix.shape[0]  # a batch above them is refused later
    batches = [min(int(v) if p == "batch_size" else cfg.batch_size, prompts) for p, v in points]
    check_draws(  # before the claim: one replay a point, single-rollout estimators
        "this sensitivity sweep", named("repeats"), cfg.repeats,
        len(ds.checkpoints) * sum(batches) * max(len(estimators), 1),
    )  # fmt: skip
    if out is not None:
        out = claim_results_dir(out, ds.root)
    rows: list[pl.DataFrame] = []
    for name in ds.checkpoints:
        full = checkpoint_data(ds, name, cfg.oracle_n, None, 1)
        if full.dropped_no_reference and notice is not None:
            notice(
                f"checkpoint {name}: dropped {full.dropped_no_reference} prompt(s) missing "
                "from the reference cache"
            )
        if cfg.ref_n is not None and cfg.ref_n > full.cache.shape[1]:
            raise InputError(
                f"{named('ref_n')} {cfg.ref_n} exceeds the {full.cache.shape[1]} cached reference samples"
            )
        if cfg.batch_size > full.n_prompts:  # every point of the sweep would be skipped
            raise InputError(
                f"{named('batch_size')} {cfg.batch_size} exceeds the {full.n_prompts} prompts of "
                f"checkpoint {name!r}"
            )
        for done, (param, value) in enumerate(points, start=1):
            row = _point(cfg, full, estimators, param, value)
            if row is not None:
                rows.append(row)
            if progress is not None:
                progress(name, done, len(points))
    if not rows:  # every point skipped: polars' "cannot concat empty list" traceback
        raise InputError(
            f"no value of {named('parameters')} {','.join(dict.fromkeys(cfg.parameters))} fits this "
            f"dataset (ref_n at most its {full.cache.shape[1]} cached reference samples, "
            f"batch_size at most its {full.n_prompts} prompts): add eps or grid_size to "
            f"{named('parameters')}, or use a larger dataset"
        )
    df = pl.concat(rows).select(
        "checkpoint", "parameter", "value", pl.exclude("checkpoint", "parameter", "value")
    )
    if out is not None:  # the record holds the n the sweep held (left to the data: 64 or all)
        held = replace(cfg, ref_n=cfg.ref_n or min(DEFAULT_REF_N, full.cache.shape[1]))
        _write(held, ds.root, ds.label, df, out)
    return df


def _write(cfg: SensitivityConfig, root: Path, label: str, df: pl.DataFrame, out: Path) -> None:
    """sensitivity.csv and its record (run id, the table's sha256, the dataset)."""
    write_csv(df, out / "sensitivity.csv")
    rollouts = str(root.resolve())  # one spelling: figures compares the two records
    record = SensitivityRecord(
        run_id=new_run_id(),
        rollouts=rollouts,
        dataset_label=label,
        dataset_sha256=dataset_sha256(root),
        config={**asdict(cfg), "rollouts": rollouts},
        tables={"sensitivity.csv": file_sha256(out / "sensitivity.csv")},
    )
    write_text_atomic(out / SENSITIVITY_FILE, record.to_json())

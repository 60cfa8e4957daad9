"""Old import path of the value-estimation benchmark, kept for one release.

The benchmark now lives in :mod:`basis_bench.bench.dataset` (data), :mod:`.replay` (the
replay engine), :mod:`.tables` (summaries and the CSV writer) and :mod:`.run` (the
``evaluate`` command). ``Tilt`` is :class:`basis_bench.estimators.TiltTable`.
"""

from __future__ import annotations

from basis_bench.bench.dataset import (
    DEFAULT_DATASET,
    REFERENCE_NAME,
    CheckpointData,
    Dataset,
    checkpoint_data,
    open_dataset,
    resolve_reference,
)
from basis_bench.bench.replay import (
    CHUNK_REPEATS,
    DIFFICULTY_REPEATS,
    ESTIMATES_SCHEMA,
    G_SWEEP,
    Replay,
    ReplaySettings,
    Series,
    draw_batches,
    draw_rollouts,
    replay,
)
from basis_bench.bench.run import (
    TRACKER_REPEATS,
    EvaluateConfig,
    EvaluateResult,
    evaluate,
    resolve_estimators,
    resolve_options,
    wants_tracker,
)
from basis_bench.bench.tables import (
    DIFFICULTY_EDGES,
    HETEROGENEITY_BATCHES,
    HETEROGENEITY_BINS,
    Z_95,
    beta_table,
    bin_index,
    difficulty_table,
    fixed_beta_table,
    g_sweep_table,
    heterogeneity_edges,
    heterogeneity_table,
    summary_table,
    write_csv,
)
from basis_bench.estimators import TiltTable as Tilt

__all__ = [
    "CHUNK_REPEATS",
    "DEFAULT_DATASET",
    "DIFFICULTY_EDGES",
    "DIFFICULTY_REPEATS",
    "ESTIMATES_SCHEMA",
    "G_SWEEP",
    "HETEROGENEITY_BATCHES",
    "HETEROGENEITY_BINS",
    "REFERENCE_NAME",
    "TRACKER_REPEATS",
    "Z_95",
    "CheckpointData",
    "Dataset",
    "EvaluateConfig",
    "EvaluateResult",
    "Replay",
    "ReplaySettings",
    "Series",
    "Tilt",
    "beta_table",
    "bin_index",
    "checkpoint_data",
    "difficulty_table",
    "draw_batches",
    "draw_rollouts",
    "evaluate",
    "fixed_beta_table",
    "g_sweep_table",
    "heterogeneity_edges",
    "heterogeneity_table",
    "open_dataset",
    "replay",
    "resolve_estimators",
    "resolve_options",
    "resolve_reference",
    "summary_table",
    "wants_tracker",
    "write_csv",
]

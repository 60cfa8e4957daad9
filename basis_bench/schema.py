"""The columns of a rollouts dataset's files (docs/schema.md), declared once.

``DIR/prompts.parquet`` is the prompts table; every other Parquet file under ``DIR`` is a
rollouts file. The store (:mod:`basis_bench.rollouts.store`) reads, checks and writes
them; :mod:`basis_bench.guards.outputs` recognises a folder of them that has no output marker.
"""

from __future__ import annotations

import polars as pl

PROMPTS_FILE = "prompts.parquet"

ROLLOUT_COLUMNS: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "policy": pl.String(),
    "sample_idx": pl.Int32(),
    "reward": pl.Float64(),
}
OPTIONAL_ROLLOUT_COLUMNS: dict[str, pl.DataType] = {
    "n_tokens": pl.Int32(),
    "finish_reason": pl.String(),
    "response": pl.String(),
    "verify_status": pl.String(),
}
PROMPT_COLUMNS: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "problem": pl.String(),
    "answer": pl.String(),
}
OPTIONAL_PROMPT_COLUMNS: dict[str, pl.DataType] = {"level": pl.Int32(), "subject": pl.String()}

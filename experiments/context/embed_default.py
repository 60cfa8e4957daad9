"""The reference model's final hidden state of each default prompt, as a prompts table with a
``features`` column (basis_context's phi(x)); written beside, never over, the shipped data.

    python experiments/context/embed_default.py OUT_DIR
    (then: OUT_DIR/prompts.parquet = the default prompts + features)
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from basis_bench.bench.dataset import DEFAULT_DATASET
from basis_bench.rollouts.features import FEATURE_COLUMN, hidden_state_features
from basis_bench.rollouts.models import SMOLLM2_ALIAS, load_policy
from basis_bench.rollouts.store import load_prompts, write_parquet_atomic


def main(out: Path) -> None:
    prompts = load_prompts(DEFAULT_DATASET)
    assert prompts is not None
    model, tokenizer = load_policy(SMOLLM2_ALIAS, device="cpu")
    hidden = hidden_state_features(model, tokenizer, prompts["problem"].to_list())
    table = prompts.with_columns(pl.Series(FEATURE_COLUMN, hidden.tolist()))
    out.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(table, out / "prompts.parquet")
    print(f"{out / 'prompts.parquet'}: {hidden.shape[0]} prompts x {hidden.shape[1]} features")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

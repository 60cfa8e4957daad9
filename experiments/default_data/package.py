"""Turn the sampled set (make.sh's output) into the shipped default dataset.

Rows are copied unchanged; each rollouts file's ``basis_bench`` metadata gains one key,
``policies`` (the schema's display order, docs/schema.md), so the checkpoints come in
training order (early, middle, late) instead of alphabetically; the trajectory replay
follows that order. Refuses an incomplete set: every policy must have every prompt with
its full sample count.

    python experiments/default_data/package.py data/smollm2-arith basis_bench/data/default
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from basis_bench.outputs import METADATA_KEY
from basis_bench.rollouts.store import load_rollouts, rollout_files
from basis_bench.schema import PROMPTS_FILE

POLICIES = ["reference", "early", "middle", "late"]
SAMPLES = {"reference": 64, "early": 272, "middle": 272, "late": 272}


def check_complete(src: Path) -> None:
    """Every policy has every prompt with its full count of distinct samples."""
    prompts = pl.read_parquet(src / PROMPTS_FILE)["prompt_id"].n_unique()
    df = load_rollouts(src, optional=[])
    got = df.group_by("policy").agg(
        pl.col("prompt_id").n_unique().alias("prompts"),
        pl.struct("prompt_id", "sample_idx").n_unique().alias("samples"),
    )
    have = {r["policy"]: (r["prompts"], r["samples"]) for r in got.iter_rows(named=True)}
    want = {p: (prompts, prompts * n) for p, n in SAMPLES.items()}
    if have != want:
        sys.exit(f"incomplete: have {have}, want {want}")


def package(src: Path, dst: Path) -> None:
    check_complete(src)
    if (dst / "rollouts").exists():  # the card and anything else beside it stay
        shutil.rmtree(dst / "rollouts")
    (dst / "rollouts").mkdir(parents=True)
    shutil.copy2(src / PROMPTS_FILE, dst / PROMPTS_FILE)
    for f in rollout_files(src):
        table = pq.read_table(f)
        kv = dict(table.schema.metadata or {})
        meta = json.loads(kv[METADATA_KEY.encode()])
        meta["policies"] = POLICIES
        kv[METADATA_KEY.encode()] = json.dumps(meta, sort_keys=True).encode()
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.replace_schema_metadata(kv), out, compression="zstd")


if __name__ == "__main__":
    package(Path(sys.argv[1]), Path(sys.argv[2]))

"""Turn the sampled set (make.sh's output) into the shipped dense trajectory, keeping only
the rewards: each complete policy's parts are copied without their response texts (the
rows, rewards, lengths and finish reasons are unchanged), and each file's ``basis_bench``
metadata gains ``policies``, the complete policies in training order (reference first,
then the checkpoints by step, from manifest.json). A policy still being sampled (some
prompt short of its full count) is left out and named, so the package is always a valid
dataset of the checkpoints that have landed.

    python experiments/dense/package.py data/smollm2-dense basis_bench/data/dense
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from basis_bench.outputs import METADATA_KEY
from basis_bench.rollouts.store import file_policies, load_rollouts, rollout_files
from basis_bench.schema import PROMPTS_FILE

DROPPED = ["response"]


def complete_policies(src: Path, manifest: dict) -> list[str]:
    """Policies of the manifest, in its (training) order, whose every prompt has its full
    count of distinct samples."""
    prompts = pl.read_parquet(src / PROMPTS_FILE)["prompt_id"].n_unique()
    df = load_rollouts(src, optional=[])
    got = df.group_by("policy").agg(
        pl.col("prompt_id").n_unique().alias("prompts"),
        pl.struct("prompt_id", "sample_idx").n_unique().alias("samples"),
    )
    have = {r["policy"]: (r["prompts"], r["samples"]) for r in got.iter_rows(named=True)}
    done = []
    for p in manifest["policies"]:
        want = (prompts, prompts * p["samples"])
        if have.get(p["policy"]) == want:
            done.append(p["policy"])
        else:
            print(f"pending: {p['policy']} has {have.get(p['policy'], (0, 0))}, wants {want}")
    return done


def package(src: Path, dst: Path) -> None:
    manifest = json.loads((dst / "manifest.json").read_text())
    policies = complete_policies(src, manifest)
    if (dst / "rollouts").exists():  # the card and the manifest beside it stay
        shutil.rmtree(dst / "rollouts")
    (dst / "rollouts").mkdir(parents=True)
    shutil.copy2(src / PROMPTS_FILE, dst / PROMPTS_FILE)
    for f in rollout_files(src):
        if not set(file_policies(f)) <= set(policies):
            continue
        table = pq.read_table(f)
        table = table.drop_columns([c for c in DROPPED if c in table.column_names])
        kv = dict(table.schema.metadata or {})
        meta = json.loads(kv[METADATA_KEY.encode()])
        meta["policies"] = policies
        kv[METADATA_KEY.encode()] = json.dumps(meta, sort_keys=True).encode()
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.replace_schema_metadata(kv), out, compression="zstd")
    print(f"packaged {policies} -> {dst}")


if __name__ == "__main__":
    package(Path(sys.argv[1]), Path(sys.argv[2]))

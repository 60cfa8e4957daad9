"""Turn a sampled set (a make.sh's output) into a shipped dataset: prompts.parquet and the
rollouts files of every complete policy.

Rows are copied unchanged, less the columns ``--drop`` names (the dense set ships without
response texts); each rollouts file's ``basis_bench`` metadata gains one key, ``policies``
(the schema's display order, docs/schema.md): the complete policies in training order, so
the checkpoints come in that order instead of alphabetically; the trajectory replay follows
it. The policies and their sample counts, in training order, are ``--policies`` or else
DST/manifest.json's. A policy short of its full count (a prompt without all its distinct
samples) stops the packaging; with ``--partial`` it is left out and named, so the package
is always a valid dataset of the policies that have landed.

    python experiments/package.py data/smollm2-arith basis_bench/data/default \\
        --policies reference:64,early:272,middle:272,late:272
    python experiments/package.py data/smollm2-dense basis_bench/data/dense \\
        --partial --drop response
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from basis_bench.guards.outputs import METADATA_KEY
from basis_bench.rollouts.store import file_policies, load_rollouts, rollout_files
from basis_bench.schema import PROMPTS_FILE


def sample_counts(src: Path) -> dict[str, tuple[int, int]]:
    """Each policy's (prompts, distinct (prompt, sample) pairs) in the sampled set."""
    df = load_rollouts(src, optional=[])
    got = df.group_by("policy").agg(
        pl.col("prompt_id").n_unique().alias("prompts"),
        pl.struct("prompt_id", "sample_idx").n_unique().alias("samples"),
    )
    return {r["policy"]: (r["prompts"], r["samples"]) for r in got.iter_rows(named=True)}


def complete_policies(src: Path, samples: dict[str, int], partial: bool) -> list[str]:
    """The policies (in ``samples``' order) whose every prompt has its full count of
    distinct samples. Without ``partial`` anything else (a policy short of its count, or
    one not asked for) ends the packaging."""
    prompts = pl.read_parquet(src / PROMPTS_FILE)["prompt_id"].n_unique()
    have = sample_counts(src)
    want = {p: (prompts, prompts * n) for p, n in samples.items()}
    if not partial and have != want:
        sys.exit(f"incomplete: have {have}, want {want}")
    for p in want:
        if have.get(p) != want[p]:
            print(f"pending: {p} has {have.get(p, (0, 0))}, wants {want[p]}")
    return [p for p in want if have.get(p) == want[p]]


def package(src: Path, dst: Path, samples: dict[str, int], partial: bool, drop: list[str]) -> None:
    policies = complete_policies(src, samples, partial)
    if (dst / "rollouts").exists():  # the card, the manifest and the rest beside it stay
        shutil.rmtree(dst / "rollouts")
    (dst / "rollouts").mkdir(parents=True)
    shutil.copy2(src / PROMPTS_FILE, dst / PROMPTS_FILE)
    for f in rollout_files(src):
        if not set(file_policies(f)) <= set(policies):
            continue
        table = pq.read_table(f)
        table = table.drop_columns([c for c in drop if c in table.column_names])
        kv = dict(table.schema.metadata or {})
        meta = json.loads(kv[METADATA_KEY.encode()])
        meta["policies"] = policies
        kv[METADATA_KEY.encode()] = json.dumps(meta, sort_keys=True).encode()
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.replace_schema_metadata(kv), out, compression="zstd")
    print(f"packaged {policies} -> {dst}")


def parse_policies(spec: str | None, dst: Path) -> dict[str, int]:
    """{policy: samples per prompt} in training order: NAME:N,... or DST/manifest.json's."""
    if spec is None:
        manifest = json.loads((dst / "manifest.json").read_text())
        return {p["policy"]: int(p["samples"]) for p in manifest["policies"]}
    pairs = [item.split(":") for item in spec.split(",")]
    return {name: int(n) for name, n in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the sampled set")
    parser.add_argument("dst", type=Path, help="the shipped dataset's folder")
    parser.add_argument(
        "--policies", help="NAME:SAMPLES,... in training order (default: DST's manifest)"
    )
    parser.add_argument("--partial", action="store_true", help="package the complete policies only")
    parser.add_argument("--drop", action="append", default=[], help="a column to leave out")
    args = parser.parse_args()
    samples = parse_policies(args.policies, args.dst)
    package(args.src, args.dst, samples, args.partial, args.drop)


if __name__ == "__main__":
    main()

"""Does the output layer's sketch rank the estimators' gradients as the whole model's does?
(issue 41, item 5). Two stages, each resumable:

    python experiments/gradient/full_model.py sketch   # full-model sketches of a subset
    python experiments/gradient/full_model.py compare  # evaluate both, write the table

``sketch``: for the first PROMPTS prompts of the sampled set (data/smollm2-gradient, which
keeps the response texts) at one checkpoint, every sample's response is re-tokenised (the
stop token appended where it stopped), checked against its stored output-layer sketch
(recomputed from the re-tokenised ids: equal to float16 rounding means the ids are the
sampled ones), and sketched over every parameter
(:func:`basis_bench.rollouts.model_sketch.model_score_sketches`, K and seed as stored),
one part of CHUNK prompts at a time into OUT/parts/.

``compare``: two datasets of those prompts, the reference (the cache) and the checkpoint,
alike but for the checkpoint's ``score_sketch``: the output layer's or the full model's,
both of the same re-tokenised ids (2% of them differ from the sampled ones: a token
sequence the tokenizer writes another way; both sketches score the same sequence); each
through ``basis-bench evaluate --estimators all``; ``full_model.csv`` pairs their
gradient.csv rows, and the printed table gives each sketch's ranking of the estimators.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from basis_bench.rollouts.score_sketch import SKETCH_COLUMN

SRC = Path("data/smollm2-gradient")
INSTRUCTION = "Answer with the number only."  # = make.sh's


def _rollouts(policy: str, prompt_ids: list[str]) -> pl.DataFrame:
    files = sorted((SRC / "rollouts" / policy).glob("*.parquet"))
    df = pl.concat([pl.read_parquet(f) for f in files])
    return df.filter(pl.col("prompt_id").is_in(prompt_ids)).sort("prompt_id", "sample_idx")


def sketch(args: argparse.Namespace) -> None:
    """Full-model sketches of the subset, CHUNK prompts a part; finished parts are kept."""
    from basis_bench.rollouts.model_sketch import model_score_sketches
    from basis_bench.rollouts.models import resolve_checkpoint
    from basis_bench.rollouts.sampling import make_sampler
    from basis_bench.rollouts.score_sketch import projection_of, score_sketches
    from basis_bench.rollouts.templates import PromptTemplate

    prompts = pl.read_parquet(SRC / "prompts.parquet").head(args.prompts)
    parts = args.out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    todo = [
        s for s in range(0, prompts.height, args.chunk)
        if not (parts / f"part-{s // args.chunk:04d}.parquet").exists()
    ]  # fmt: skip
    if not todo:
        print("every part is done")
        return
    meta = json.loads(pq.read_schema(next((SRC / "rollouts" / args.policy).glob("*.parquet")))
                      .metadata[b"basis_bench"])  # fmt: skip
    stored = meta["run"]["score_sketch"]
    sampler = make_sampler("hf", resolve_checkpoint(args.ckpt),
                           PromptTemplate(instruction=INSTRUCTION), device="cpu", dtype="float32")  # fmt: skip
    tok, stop = sampler.tokenizer, sampler.stop_ids[0]
    for n_done, start in enumerate(todo):
        t0 = time.time()
        chunk = prompts.slice(start, args.chunk)
        ids = chunk["prompt_id"].to_list()
        df = _rollouts(args.policy, ids)
        of = np.asarray([ids.index(p) for p in df["prompt_id"]])
        responses = [
            np.asarray(tok(r, add_special_tokens=False)["input_ids"] + ([stop] if f == "stop" else []))
            for r, f in zip(df["response"], df["finish_reason"], strict=True)
        ]  # fmt: skip
        prompt_ids = sampler.prompt_token_ids(chunk["problem"].to_list())
        projection = projection_of(sampler.model, stored["k"], stored["seed"])
        again = score_sketches(sampler.model, prompt_ids, responses, of, 1.0, projection)
        old = np.stack(df[SKETCH_COLUMN].to_numpy()).astype(np.float32)
        drift = np.linalg.norm(again - old, axis=1) / np.maximum(np.linalg.norm(old, axis=1), 1e-12)
        full = model_score_sketches(sampler.model, prompt_ids, responses, of, 1.0,
                                    stored["k"], stored["seed"])  # fmt: skip
        out = df.select("prompt_id", "policy", "sample_idx").with_columns(
            pl.Series("n_ids", [len(r) for r in responses]),
            pl.Series("retokenised_drift", drift),
            pl.Series("output_layer", again).cast(pl.Array(pl.Float32, stored["k"])),
            pl.Series(SKETCH_COLUMN, full).cast(pl.Array(pl.Float32, stored["k"])),
        )
        target = parts / f"part-{start // args.chunk:04d}.parquet"
        out.write_parquet(target.with_suffix(".tmp"))
        target.with_suffix(".tmp").rename(target)
        print(f"part {start // args.chunk} ({len(responses)} rollouts) in {time.time() - t0:.0f} s; "
              f"drift max {drift.max():.1e}; {n_done + 1}/{len(todo)}", flush=True)  # fmt: skip


def _subset(dst: Path, policy: str, prompt_ids: list[str], sketches: pl.DataFrame | None) -> None:
    """The reference and ``policy`` on ``prompt_ids``, from the shipped set (no texts), the
    policy's sketches replaced by ``sketches`` where given."""
    src = Path("basis_bench/data/gradient")
    shutil.rmtree(dst, ignore_errors=True)
    prompts = pl.read_parquet(src / "prompts.parquet").filter(pl.col("prompt_id").is_in(prompt_ids))
    (dst / "rollouts").mkdir(parents=True)
    prompts.write_parquet(dst / "prompts.parquet")
    training = json.loads((src / "training.json").read_text())
    training["steps"] = {policy: training["steps"][policy]}
    training["train_prompts"] = len(prompt_ids)
    (dst / "training.json").write_text(json.dumps(training))
    for pol in ("reference", policy):
        (dst / "rollouts" / pol).mkdir()
        for f in sorted((src / "rollouts" / pol).glob("*.parquet")):
            table = pq.read_table(f)
            df = pl.from_arrow(table).filter(pl.col("prompt_id").is_in(prompt_ids))
            if sketches is not None and pol == policy:
                dtype = df[SKETCH_COLUMN].dtype  # as stored (float16)
                df = (
                    df.drop(SKETCH_COLUMN)
                    .join(
                        sketches.select("prompt_id", "sample_idx", SKETCH_COLUMN),
                        on=["prompt_id", "sample_idx"],
                        how="left",
                    )
                    .with_columns(pl.col(SKETCH_COLUMN).cast(dtype))
                )
            if df.height:
                pq.write_table(df.to_arrow().replace_schema_metadata(table.schema.metadata),
                               dst / "rollouts" / pol / f.name)  # fmt: skip


def compare(args: argparse.Namespace) -> None:
    """Evaluate the subset under each sketch; pair and rank their gradient tables."""
    full = pl.concat([pl.read_parquet(f) for f in sorted((args.out / "parts").glob("*.parquet"))])
    ids = full["prompt_id"].unique(maintain_order=True).to_list()
    tables = {}
    for kind, column in (("output_layer", "output_layer"), ("full_model", SKETCH_COLUMN)):
        data, results = args.out / kind, args.out / f"{kind}-results"
        sketches = full.select("prompt_id", "sample_idx", pl.col(column).alias(SKETCH_COLUMN))
        _subset(data, args.policy, ids, sketches)
        subprocess.run(
            [sys.executable, "-m", "basis_bench", "evaluate", "--rollouts", str(data), "--estimators", "all",
             "--gradient-budgets", args.budgets, "--trajectory-schedule", "steps", "--standing-steps", "4", "--out", str(results), "--seed", "0"],
            check=True,
        )  # fmt: skip
        tables[kind] = pl.read_csv(results / "gradient.csv").filter(pl.col("checkpoint") == "all")
    keys = ["estimator", "rollouts_per_prompt", "rollouts_per_step"]
    cols = ["variance_ratio_rloo8", "ci_low", "ci_high", "cosine"]
    paired = (
        tables["output_layer"]
        .select(keys + cols)
        .join(tables["full_model"].select(keys + cols), on=keys, suffix="_full")
    )
    paired.write_csv(args.table)
    with pl.Config(tbl_rows=200, tbl_cols=20):
        print(paired.sort("rollouts_per_step", "variance_ratio_rloo8"))
    for r, group in paired.group_by("rollouts_per_step", maintain_order=True):
        a = group["variance_ratio_rloo8"].rank().to_numpy()
        b = group["variance_ratio_rloo8_full"].rank().to_numpy()
        print(f"R = {r[0]}: Spearman rank correlation {np.corrcoef(a, b)[0, 1]:.3f} over "
              f"{group.height} arms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["sketch", "compare"])
    parser.add_argument("--policy", default="step-008")
    parser.add_argument("--ckpt", default="runs/gradient/train/checkpoints/step-000008")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("data/smollm2-gradient-full"))
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--table", type=Path, default=Path("experiments/gradient/full_model.csv"))
    args = parser.parse_args()
    if args.stage == "sketch" and not Path(args.ckpt).exists():
        sys.exit(f"{args.ckpt}: no such checkpoint (experiments/gradient/make.sh trains it)")
    {"sketch": sketch, "compare": compare}[args.stage](args)


if __name__ == "__main__":
    main()

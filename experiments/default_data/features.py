"""Store the reference model's prompt hidden states in a sampled dataset's prompts.parquet
(the ``features`` column ``basis_context`` reads), leaving every rollouts file byte for byte.

It is the oracle's own ``--store-features hidden`` step, resumed on the finished reference run with
the settings its parts recorded (the template, the sampling, and the model identity, whose
path names the machine that sampled them): every part is complete, so nothing is sampled;
the model loads once and one forward pass per prompt fills the column. It runs on a copy of
the dataset (the package data is read-only to every command) and copies back prompts.parquet
alone; it prints the sha256 over the rollouts files of the copy before and after, and refuses
to copy back if any changed.

    python experiments/default_data/features.py basis_bench/data/default
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

from basis_bench.guards.outputs import read_metadata
from basis_bench.guards.provenance import file_sha256
from basis_bench.rollouts.generation import Generation
from basis_bench.rollouts.grading import Grading
from basis_bench.rollouts.models import resolve_checkpoint
from basis_bench.rollouts.oracle import JobSampler, OracleSource, run_oracle
from basis_bench.rollouts.oracle_job import OracleJob
from basis_bench.rollouts.prompt_source import PromptSource
from basis_bench.rollouts.store import load_prompts, rollout_files
from basis_bench.schema import PROMPTS_FILE
from basis_bench.settings import replaced


def rollouts_digest(root: Path) -> str:
    """sha256 over every rollouts file's path and sha256."""
    lines = [f"{f.relative_to(root)} {file_sha256(f)}" for f in rollout_files(root)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def reference_job(root: Path) -> tuple[OracleJob, dict[str, str]]:
    """The reference run's job (features: hidden) and model identity, from its parts."""
    meta = read_metadata(sorted((root / "rollouts" / "reference").glob("*.parquet"))[0])
    run, sampling = meta["run"], meta["run"]["sampling"]
    generation = Generation(
        model=run["model"]["name"],
        device="cpu",
        instruction=run["template"]["instruction"],
        system_prompt=run["template"]["system"] or "",
        max_new_tokens=sampling["max_new_tokens"],
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
    )
    grading = Grading(run["reward"]["answer_format"], run["reward"]["timeout_s"])
    job = OracleJob(
        generation=generation,
        grading=grading,
        policy=run["policy"],
        source=PromptSource(meta["dataset"]["source"]),
        out=root,
        n=sampling["n"],
        seed=run["seed"],
        chunk_size=run["chunk_size"],
    )
    job = replaced(job, store_features="hidden")
    return job, run["model"]


def main(dataset: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dataset"
        shutil.copytree(dataset, root)
        add_features(root)
        shutil.copy2(root / PROMPTS_FILE, dataset / PROMPTS_FILE)
    print(f"wrote {dataset / PROMPTS_FILE}; rollouts sha256 {rollouts_digest(dataset)}")


def add_features(root: Path) -> None:
    before = rollouts_digest(root)
    job, model = reference_job(root)
    checkpoint = resolve_checkpoint(job.generation.model)
    print(f"model {checkpoint.path} sha256 {file_sha256(checkpoint.path)}")
    source = OracleSource(job.source.load(), model, JobSampler(job, checkpoint))
    report = run_oracle(job, source=source)
    after = rollouts_digest(root)
    if report.parts_written or after != before:
        sys.exit(f"the rollouts changed ({before} -> {after}); restore them from git")
    prompts = load_prompts(root)
    assert prompts is not None
    width = {len(v) for v in prompts["features"].to_list()}
    print(f"rollouts sha256 {after} (unchanged); features of {prompts.height} prompts: {width}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

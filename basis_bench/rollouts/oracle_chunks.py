"""One chunk of an oracle run: its prompts, seed and digest (:class:`Chunk`), and the
sampling, grading and writing of its Parquet part (:func:`run_chunks`). The run itself
(:func:`basis_bench.rollouts.oracle.run_oracle`) and its worker processes
(:mod:`basis_bench.rollouts.oracle_workers`) both call :func:`run_chunks`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import polars as pl

from basis_bench.guards.outputs import write_parquet_atomic
from basis_bench.rollouts.oracle_job import OracleJob
from basis_bench.rollouts.reward_function import MATH_VERIFY
from basis_bench.rollouts.sampling import Progress, Sampler
from basis_bench.rollouts.score_sketch import SKETCH_COLUMN
from basis_bench.rollouts.scoring import grade
from basis_bench.rollouts.store import conform_rollouts, part_path
from basis_bench.rollouts.trainer_prompts import PROMPT_COLUMN, ROW_COLUMN, model_inputs


@dataclass(frozen=True)
class Chunk:
    """Prompts ``[index * chunk_size, (index + 1) * chunk_size)`` of the run."""

    index: int
    prompts: pl.DataFrame

    @property
    def prompt_ids(self) -> list[str]:
        return self.prompts["prompt_id"].to_list()

    def digest(self) -> str:
        """Hash of the chunk's prompt ids and gold answers (and a trainer's prompts and rows,
        where the table holds them): what its rewards depend on."""
        text = "\n".join(
            f"{p}\t{a}" for p, a in zip(self.prompt_ids, self.prompts["answer"], strict=True)
        )
        for column in (PROMPT_COLUMN, ROW_COLUMN):
            if column in self.prompts.columns:
                text += "\n" + "\n".join(map(str, self.prompts[column]))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def seed(self, base_seed: int) -> int:
        """Sampling seed of this chunk: a hash of the base seed and the chunk's prompt ids."""
        text = f"{base_seed}\n" + "\n".join(self.prompt_ids)
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def plan_chunks(prompts: pl.DataFrame, chunk_size: int) -> list[Chunk]:
    """All chunks of the run, in source order."""
    return [
        Chunk(k, prompts.slice(start, chunk_size))
        for k, start in enumerate(range(0, prompts.height, chunk_size))
    ]


class PartProgress(Protocol):
    """Sampling progress: the sampler's callback, and the prompts of each part written."""

    def __call__(self, finished: int, tokens: int) -> None: ...

    def part_written(self, n_prompts: int) -> None: ...


def sample_chunk(
    chunk: Chunk,
    sampler: Sampler,
    job: OracleJob,
    pool: ProcessPoolExecutor | None = None,
    on_progress: Progress | None = None,
) -> pl.DataFrame:
    """The chunk's rollouts: ``n`` scored samples per prompt, ``sample_idx`` 0..n-1."""
    n = job.sampling.n
    problems, seed = model_inputs(chunk.prompts), chunk.seed(job.seed)
    sketch, completion_ids = None, None
    # the token ids, which decoded text would not give back: for the score sketch, and for a
    # reward function (TRL's completion_ids)
    if job.store_scores or job.reward.function != MATH_VERIFY:
        tokens = sampler.sample_tokens(problems, job.sampling, seed, on_progress)
        samples, completion_ids = sampler.decode(tokens), tokens.response_ids
        if job.store_scores:
            sketch = sampler.score_sketches(tokens, job.sampling, job.store_scores, job.score_seed)
    else:
        samples = sampler.sample(problems, job.sampling, seed, on_progress)
    cuts = range(0, chunk.prompts.height * n, n)
    groups = [samples.responses[i : i + n] for i in cuts]
    finish = [samples.finish_reasons[i : i + n] for i in cuts]
    scored = grade(groups, chunk.prompts, job.reward, job.template, pool, completion_ids, finish)
    columns: dict[str, Any] = {
        "prompt_id": np.repeat(np.asarray(chunk.prompt_ids, dtype=object), n),
        "policy": [job.policy] * (chunk.prompts.height * n),
        "sample_idx": np.tile(np.arange(n, dtype=np.int32), chunk.prompts.height),
        "reward": np.concatenate([rewards for rewards, _ in scored]),
        "n_tokens": samples.n_tokens,
        "finish_reason": samples.finish_reasons,
        "verify_status": [s for _, statuses in scored for s in statuses],
    }
    if job.keep_responses:
        columns["response"] = samples.responses
    if sketch is not None:
        columns[SKETCH_COLUMN] = pl.Series(sketch.astype(np.float16)).cast(
            pl.Array(pl.Float16, job.store_scores)
        )
    return conform_rollouts(pl.DataFrame(columns), what=f"chunk {chunk.index}")


@dataclass
class OracleReport:
    """What a run wrote: parts, rollouts, and the sum of their rewards."""

    parts_written: int = 0
    rollouts_written: int = 0
    reward_sum: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.rollouts_written if self.rollouts_written else float("nan")


def run_chunks(
    chunks: list[Chunk],
    sampler: Sampler,
    job: OracleJob,
    identity: Mapping[str, Any],
    metadata: Mapping[str, Any],
    pool: ProcessPoolExecutor | None = None,
    on_progress: Progress | None = None,
    on_part: Callable[[int], None] | None = None,
) -> OracleReport:
    """Sample, score and write each chunk as one part (atomically, one at a time).
    ``on_part`` is called with the chunk's number of prompts once its part is written."""
    report = OracleReport()
    for chunk in chunks:
        rows = sample_chunk(chunk, sampler, job, pool, on_progress)
        meta = {
            **metadata,
            "run": dict(identity),
            "chunk": {
                "index": chunk.index,
                "seed": chunk.seed(job.seed),
                "digest": chunk.digest(),
                "n_prompts": chunk.prompts.height,
            },
            "backend": sampler.describe(),
            "shard": str(job.shard),
        }
        write_parquet_atomic(rows, part_path(job.out, job.policy, chunk.index), meta)
        report.parts_written += 1
        report.rollouts_written += rows.height
        report.reward_sum += float(rows["reward"].sum())
        if on_part is not None:
            on_part(chunk.prompts.height)
    return report

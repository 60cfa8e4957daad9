"""Oracle sampling: many scored rollouts per prompt from one checkpoint, written as a
sharded, resumable rollouts dataset.

The prompts are cut, in source order, into chunks of ``chunk_size``; chunk ``k`` is
owned by shard ``k mod N`` (``--shard i/N``), so N jobs fill one dataset without
talking to each other, and the chunks (hence the files) do not depend on N. Each chunk
becomes one Parquet part ``DIR/rollouts/<policy>/part-<k>.parquet``, written to a
temporary name and renamed when complete. A rerun skips parts that exist with the
same settings, so a killed job resumes where it stopped.

Chunk ``k`` is sampled with a seed derived from the base seed and the chunk's prompt
ids, so a part's rows do not depend on which job wrote it or on what ran before: a
killed and rerun job yields the same dataset as an uninterrupted one (same backend,
device and batch size).

``DIR/prompts.parquet`` holds every prompt of the run; each shard merges its prompts
into it (:func:`~basis_bench.rollouts.store.write_prompts_table`) and publishes the result by
an atomic rename, so concurrent shards of one run
(which write identical tables) cannot leave a torn file.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import polars as pl

from basis_bench import __version__
from basis_bench.errors import InputError
from basis_bench.outputs import read_metadata, write_parquet_atomic
from basis_bench.rollouts.rewards import RewardConfig, score_many
from basis_bench.rollouts.sampling import Progress, Sampler, SamplingConfig
from basis_bench.rollouts.store import check_policy_name, conform_rollouts, part_path


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based): it owns chunks ``k`` with ``k % count == index``."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/N"`` with 0 <= i < N, e.g. ``$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT``."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if match is None:
            raise InputError(f"--shard must look like i/N (e.g. 0/4), got {text!r}")
        index, count = int(match[1]), int(match[2])
        if count < 1 or index >= count:
            raise InputError(f"--shard {text}: need 0 <= i < N (shards are numbered 0..N-1)")
        return cls(index, count)

    def owns(self, chunk_index: int) -> bool:
        return chunk_index % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class OracleJob:
    """What to sample: ``sampling.n`` rollouts per prompt for ``policy``, scored with ``reward``."""

    policy: str
    sampling: SamplingConfig
    reward: RewardConfig = field(default_factory=RewardConfig)
    seed: int = 0
    chunk_size: int = 16
    shard: Shard = field(default_factory=Shard)
    keep_responses: bool = True

    def __post_init__(self) -> None:
        check_policy_name(self.policy)
        if self.chunk_size < 1:
            raise InputError(f"--chunk-size must be at least 1, got {self.chunk_size}")


@dataclass(frozen=True)
class Chunk:
    """Prompts ``[index * chunk_size, (index + 1) * chunk_size)`` of the run."""

    index: int
    prompts: pl.DataFrame

    @property
    def prompt_ids(self) -> list[str]:
        return self.prompts["prompt_id"].to_list()

    def digest(self) -> str:
        """Hash of the chunk's prompt ids and gold answers: what its rewards depend on."""
        text = "\n".join(
            f"{p}\t{a}" for p, a in zip(self.prompt_ids, self.prompts["answer"], strict=True)
        )
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


def run_identity(
    job: OracleJob, model: Mapping[str, Any], template: Mapping[str, Any]
) -> dict[str, Any]:
    """The settings a resumed run must share with the parts already written."""
    return {
        "policy": job.policy,
        "model": dict(model),
        "sampling": job.sampling.as_dict(),
        "template": dict(template),
        "reward": {"answer_format": job.reward.answer_format, "timeout_s": job.reward.timeout_s},
        "seed": job.seed,
        "chunk_size": job.chunk_size,
    }


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def pending_chunks(
    prompts: pl.DataFrame, out: str | os.PathLike[str], job: OracleJob, identity: Mapping[str, Any]
) -> tuple[list[Chunk], list[Chunk]]:
    """(to sample, already complete) chunks of this shard.

    A part that exists but was written with other settings is an :class:`InputError`,
    never silently mixed in or overwritten.
    """
    todo, done = [], []
    for chunk in plan_chunks(prompts, job.chunk_size):
        if not job.shard.owns(chunk.index):
            continue
        path = part_path(out, job.policy, chunk.index)
        if not path.exists():
            todo.append(chunk)
            continue
        try:
            meta = read_metadata(path)
        except Exception as err:
            raise InputError(f"{path}: unreadable part ({err}); delete it and rerun") from err
        differs = _differences(meta.get("run", {}), identity)
        if meta.get("chunk", {}).get("digest") != chunk.digest():
            differs.append("the chunk's prompts")
        if differs:
            raise InputError(
                f"{path} was sampled with different settings ({', '.join(differs)}); "
                "rerun with the original settings, or use another --out or --policy"
            )
        done.append(chunk)
    return todo, done


def sample_chunk(
    chunk: Chunk,
    sampler: Sampler,
    job: OracleJob,
    pool: ProcessPoolExecutor | None = None,
    on_progress: Progress | None = None,
) -> pl.DataFrame:
    """The chunk's rollouts: ``n`` scored samples per prompt, ``sample_idx`` 0..n-1."""
    n = job.sampling.n
    samples = sampler.sample(
        chunk.prompts["problem"].to_list(), job.sampling, chunk.seed(job.seed), on_progress
    )
    groups = [samples.responses[p * n : (p + 1) * n] for p in range(chunk.prompts.height)]
    scored = score_many(groups, chunk.prompts["answer"].to_list(), job.reward, pool)
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
    return conform_rollouts(pl.DataFrame(columns), what=f"chunk {chunk.index}")


@dataclass
class OracleReport:
    parts_written: int = 0
    rollouts_written: int = 0
    reward_sum: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.rollouts_written if self.rollouts_written else float("nan")


def run_chunks(
    chunks: list[Chunk],
    sampler: Sampler,
    out: str | os.PathLike[str],
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
        write_parquet_atomic(rows, part_path(out, job.policy, chunk.index), meta)
        report.parts_written += 1
        report.rollouts_written += rows.height
        report.reward_sum += float(rows["reward"].sum())
        if on_part is not None:
            on_part(chunk.prompts.height)
    return report


def base_metadata(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """Provenance stored in every file of the run."""
    try:
        math_verify = version("math-verify")
    except PackageNotFoundError:
        math_verify = "unknown"
    return {
        "kind": "oracle",
        "simulated": False,
        "dataset": dict(dataset),
        "package_version": __version__,
        "math_verify_version": math_verify,
    }

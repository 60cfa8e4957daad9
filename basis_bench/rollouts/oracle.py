"""Oracle sampling: many scored rollouts per prompt from one checkpoint, written as a
sharded, resumable rollouts dataset. :func:`run_oracle` is the one pipeline, run by
``basis-bench oracle`` and by training's reference cache; its job is an
:class:`~basis_bench.rollouts.oracle_job.OracleJob`.

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
into it (:func:`~basis_bench.rollouts.store.write_prompts_table`), publishing the result
by an atomic rename, so concurrent shards of one run (which write identical tables)
cannot leave a torn file.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards.outputs import claim_output_dir, holds_output_locks, read_metadata
from basis_bench.guards.provenance import __version__, provenance
from basis_bench.rollouts import fingerprint
from basis_bench.rollouts.features import FEATURE_COLUMN
from basis_bench.rollouts.models import Checkpoint, resolve_checkpoint
from basis_bench.rollouts.oracle_chunks import (
    Chunk,
    OracleReport,
    PartProgress,
    plan_chunks,
    run_chunks,
)
from basis_bench.rollouts.oracle_job import OracleJob
from basis_bench.rollouts.oracle_shards import run_differences, running_shard
from basis_bench.rollouts.oracle_workers import (
    WorkerTask,
    auto_workers,
    one_torch_thread,
    run_in_workers,
    uses_cpu_workers,
)
from basis_bench.rollouts.prompts import (
    parse_levels,
)
from basis_bench.rollouts.reward_function import MATH_VERIFY
from basis_bench.rollouts.rewards import RewardConfig, scoring_pool
from basis_bench.rollouts.sampling import Sampler, sampler_class
from basis_bench.rollouts.sampling.registry import AUTO, auto_note, start_sampler
from basis_bench.rollouts.score_sketch import score_sketch_entry
from basis_bench.rollouts.scoring import check_answers
from basis_bench.rollouts.store import (
    load_prompts,
    merged_prompts,
    part_path,
    write_prompts_table,
)
from basis_bench.rollouts.trainer_prompts import model_inputs
from basis_bench.rollouts.training_record import STEPS_KEY
from basis_bench.schema import PROMPTS_FILE
from basis_bench.settings import replaced


def run_identity(job: OracleJob, model: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must share with the parts already written."""
    return {
        "policy": job.policy,
        "model": dict(model),
        "sampling": job.sampling.as_dict(),
        "template": {"instruction": job.template.instruction, "system": job.template.system},
        "reward": reward_identity(job.reward),
        "seed": job.seed,
        "chunk_size": job.chunk_size,
        **({"score_sketch": score_sketch_entry(job)} if job.store_scores else {}),
    }


def reward_identity(reward: RewardConfig) -> dict[str, Any]:
    """How responses were graded, as a run records it (a reward function by its import path)."""
    graded: dict[str, Any] = {"answer_format": reward.answer_format, "timeout_s": reward.timeout_s}
    return graded if reward.function == MATH_VERIFY else {"function": reward.function}


def pending_chunks(
    prompts: pl.DataFrame, job: OracleJob, identity: Mapping[str, Any]
) -> tuple[list[Chunk], list[Chunk]]:
    """(to sample, already complete) chunks of this shard.

    A part that exists but was written with other settings is an :class:`InputError`,
    never silently mixed in or overwritten.
    """
    todo, done = [], []
    for chunk in plan_chunks(prompts, job.chunk_size):  # every shard's: one policy, one run
        path = part_path(job.out, job.policy, chunk.index)
        if not path.exists():
            todo += [chunk] if job.shard.owns(chunk.index) else []
            continue
        try:
            meta = read_metadata(path)
        except Exception as err:
            raise InputError(f"{path}: unreadable part ({err}); delete it and rerun") from err
        differs = run_differences(meta.get("run", {}), identity)
        if meta.get("chunk", {}).get("digest") != chunk.digest():
            differs.append("the chunk's prompts")
        recorded = (meta.get(STEPS_KEY) or {}).get(job.policy)
        if job.step is not None and recorded is not None and recorded != job.step:
            differs.append(f"--step {recorded}")
        if differs:
            raise InputError(
                f"{path} was sampled with different settings ({', '.join(differs)}); "
                "rerun with the original settings, or use another --out or --policy"
            )
        done += [chunk] if job.shard.owns(chunk.index) else []
    return todo, done


def oracle_metadata(job: OracleJob, n_prompts: int) -> dict[str, Any]:
    """What every file of the run records: the prompt source, the run's provenance and, with
    ``--step``, the policy's training step (``training_steps``)."""
    try:
        math_verify = version("math-verify")
    except PackageNotFoundError:
        math_verify = "unknown"
    step = {} if job.step is None else {STEPS_KEY: {job.policy: job.step}}
    return {
        **step,
        "kind": "oracle",
        "simulated": False,
        "dataset": {
            "source": job.source.prompts,
            "levels": parse_levels(job.source.levels) if job.source.levels is not None else None,
            "limit": job.source.limit or None,
            "n_prompts": n_prompts,
        },
        "package_version": __version__,
        "math_verify_version": math_verify,
        "provenance": provenance(),
    }


# --------------------------------------------------------------------------- the pipeline

HiddenStates = Callable[[Sequence[str]], np.ndarray]
"""Problems -> (P, d) final hidden states at the last token of each problem's prompt."""


@dataclass(frozen=True)
class OracleSource:
    """What a run samples from: the prompts, the model as the run identity names it, and a
    sampler factory (called only when some chunk is missing). :func:`open_source` makes it
    from a job; training's reference cache passes its own (its live model, its prompts)."""

    prompts: pl.DataFrame
    model: Mapping[str, Any]
    sampler: Callable[[], Sampler]
    out_label: str = "--out"
    """How messages name the output folder's setting."""
    hidden_states: HiddenStates | None = None
    """Computes ``--store-features hidden`` before the sampler is made (the vllm backend, whose
    engine gives no hidden states and claims its share of GPU memory at start); None: the
    sampler's own :meth:`~basis_bench.rollouts.sampling.Sampler.prompt_hidden_states`."""


@dataclass(frozen=True)
class JobSampler:
    """The sampler factory of a job's checkpoint (picklable: workers load it themselves)."""

    job: OracleJob
    checkpoint: Checkpoint
    fallback: bool = False
    """``--backend auto`` chose the job's backend: hf samples where its engine does not start."""

    def __call__(self) -> Sampler:
        from basis_bench.rollouts import sampling

        job = self.job

        def start(backend: type[Sampler]) -> Sampler:
            return sampling.make_sampler(
                backend.backend,
                self.checkpoint,
                job.template,
                job.generation.device,
                job.generation.dtype,
                job.generation.sampler_settings(backend),  # --batch-size, --kv-cache-gib, ...
            )

        backend = sampler_class(job.generation.backend, job.generation.device)
        return start_sampler(backend, self.fallback, start)


@dataclass(frozen=True)
class JobHiddenStates:
    """The prompt hidden states of a job's checkpoint for a backend that gives none (vllm):
    from the checkpoint loaded with transformers for the call alone, on the job's device and
    dtype, so they are the numbers the hf backend stores."""

    job: OracleJob
    checkpoint: Checkpoint

    def __call__(self, problems: Sequence[str]) -> np.ndarray:
        from basis_bench.rollouts.sampling.hf import transformers_hidden_states

        job = self.job
        # a backend that cannot run here is refused before this pass
        sampler_class(job.generation.backend, job.generation.device).check_device(
            job.generation.device
        )
        return transformers_hidden_states(
            self.checkpoint, job.template, problems, job.generation.device, job.generation.dtype
        )


def open_source(
    job: OracleJob, warn: Callable[[str], None], fallback: bool = False
) -> OracleSource:
    """The job's checkpoint (resolved) and prompts (loaded, warnings passed to ``warn``);
    ``fallback``: ``--backend auto`` chose the job's backend (:class:`JobSampler`)."""
    checkpoint = resolve_checkpoint(job.generation.model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = job.source.load()
    for w in caught:
        warn(str(w.message))
    check_answers(prompts, job.reward.function, job.source.prompts)
    return OracleSource(
        prompts,
        {
            "name": checkpoint.name,
            "path": str(checkpoint.path),
            "weights": fingerprint.weights_sha256(checkpoint.path),
        },
        JobSampler(job, checkpoint, fallback),
        hidden_states=None
        if sampler_class(job.generation.backend, job.generation.device).capabilities.hidden_states
        else JobHiddenStates(job, checkpoint),
    )


class OracleProgress(Protocol):
    """What :func:`run_oracle` reports as it goes (the CLI draws it)."""

    def warning(self, message: str) -> None: ...

    def planned(
        self, job: OracleJob, n_prompts: int, todo: int, done: int, workers: int
    ) -> None: ...

    def sampling(
        self, job: OracleJob, samples: int, n_prompts: int
    ) -> AbstractContextManager[PartProgress]: ...

    def features(self, job: OracleJob, n_prompts: int) -> AbstractContextManager[None]:
        """Around the hidden-state pass of ``--store-features hidden`` (a model forward per prompt:
        minutes at paper scale, before any sample)."""
        ...


class _Quiet:
    """The progress of a run nobody watches."""

    def warning(self, message: str) -> None:
        warnings.warn(message, stacklevel=2)

    def planned(self, job: OracleJob, n_prompts: int, todo: int, done: int, workers: int) -> None:
        pass

    @contextlib.contextmanager
    def sampling(self, job: OracleJob, samples: int, n_prompts: int) -> Iterator[PartProgress]:
        yield self

    def features(self, job: OracleJob, n_prompts: int) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def __call__(self, finished: int, tokens: int) -> None:
        pass

    def part_written(self, n_prompts: int) -> None:
        pass


def check_part_size(job: OracleJob) -> None:
    """A part (``--chunk-size`` prompts x ``--n`` samples) is held whole while it is sampled
    and written: its size passes the one size budget before the claim or a model load."""
    from basis_bench.guards.memory_check import Size, check_sizes, sampled_rollout_bytes

    per = sampled_rollout_bytes(job.sampling.max_new_tokens) * job.chunk_size
    check_sizes(
        "one part of this oracle run", [Size("--n", job.n, per, " (or lower --chunk-size)")]
    )


def check_sketches(job: OracleJob) -> None:
    """``--store-scores`` needs a backend that scores its own samples (the hf backend's model);
    refused before any model loads, not after the first part is sampled."""
    backend = sampler_class(job.generation.backend, job.generation.device)
    if job.store_scores and backend.score_sketches is Sampler.score_sketches:
        raise InputError(
            f"--store-scores: the {backend.backend} backend cannot sketch scores (its engine "
            "gives no hidden states); use --backend hf"
        )


@holds_output_locks
def run_oracle(
    job: OracleJob,
    progress: OracleProgress | None = None,
    source: OracleSource | None = None,
    pool: ProcessPoolExecutor | None = None,
) -> OracleReport:
    """Fill the dataset ``job.out`` with this shard's missing parts.

    Claims ``out`` (new, empty or a dataset of real rollouts), refuses parts written with
    other settings and shards running there with other settings (:mod:`.oracle_shards`),
    merges the prompts into ``prompts.parquet`` (once a model has loaded,
    here or in a worker: a model that cannot load writes nothing), then samples,
    grades and writes each missing chunk: in ``job.workers`` processes (0: one per free core
    on the CPU, see :mod:`.oracle_workers`) when ``source`` is the job's own, in this process
    otherwise. ``source`` defaults to :func:`open_source`; ``pool`` to
    ``job.grading.reward_workers`` grading processes started for this run (None: grade here).
    """
    progress = progress or _Quiet()
    check_part_size(job)
    own_source = source is None
    fallback = job.generation.backend == AUTO
    if own_source:  # --backend auto: the one that samples, for the plan and the progress
        backend = sampler_class(job.generation.backend, job.generation.device)
        backend.check_device(job.generation.device)  # --backend vllm without vllm: before all
        job = replaced(job, backend=backend.backend)
        check_sketches(job)
    source = source or open_source(job, progress.warning, fallback)
    identity = run_identity(job, source.model)
    out = claim_output_dir(  # shared: the shards of one run write disjoint parts side by side
        job.out, "rollouts", simulated=False, force=job.force, option=source.out_label, shared=True
    )
    note = auto_note(job.generation.device) if own_source and fallback else None
    with running_shard(out, identity, str(job.shard)):  # before any part: shards started at once
        return _fill(job, source, identity, progress, pool, own_source, note)


def _fill(
    job: OracleJob,
    source: OracleSource,
    identity: Mapping[str, Any],
    progress: OracleProgress,
    pool: ProcessPoolExecutor | None,
    own_source: bool,
    note: str | None,
) -> OracleReport:
    """:func:`run_oracle` once ``job.out`` is claimed: this shard's missing parts; ``note``
    (why ``--backend auto`` samples with hf) is shown as sampling starts."""
    metadata = oracle_metadata(job, source.prompts.height)
    todo, done = pending_chunks(source.prompts, job, identity)
    workers = auto_workers(job, len(todo)) if own_source and todo else 1
    progress.planned(job, source.prompts.height, len(todo), len(done), workers)
    featureless = job.store_features != "none" and lacks_features(source.prompts, job.out)
    merged_prompts(source.prompts, job.out)  # a clashing answer is refused before any load
    prompts = source.prompts
    if featureless and source.hidden_states is not None:  # before the sampler claims memory
        prompts = with_features(prompts, job, source.hidden_states, progress)
        featureless = False
    if not todo and not featureless:  # a finished run: no sampler is made
        write_prompts_table(prompts, job.out, metadata)
        return OracleReport()
    n_prompts = sum(c.prompts.height for c in todo)
    factory = source.sampler
    if workers > 1:
        if featureless:  # the features need the model here: the table is written once it loaded
            prompts = with_features(prompts, job, factory().prompt_hidden_states, progress)
            write_prompts_table(prompts, job.out, metadata)
        if note:
            progress.warning(note)
        with progress.sampling(job, n_prompts * job.n, n_prompts) as sink:
            return run_in_workers(
                workers,
                lambda chunks: WorkerTask(job, chunks, identity, metadata, factory, os.getpid()),
                todo,
                sink,
                lambda: write_prompts_table(prompts, job.out, metadata),
            )
    with one_torch_thread(own_source and uses_cpu_workers(job)):
        sampler = factory()  # a model that cannot load writes nothing
        # hf, where auto's choice did not start (a caller's own sampler may name none)
        job = replaced(job, backend=getattr(sampler, "backend", job.generation.backend))
        if featureless:
            prompts = with_features(prompts, job, sampler.prompt_hidden_states, progress)
        write_prompts_table(prompts, job.out, metadata)
        if not todo:
            return OracleReport()
        if note:
            progress.warning(note)
        with progress.sampling(job, n_prompts * job.n, n_prompts) as sink:
            return _run_here(todo, sampler, job, identity, metadata, pool, sink)


def lacks_features(prompts: pl.DataFrame, out: Path) -> bool:
    """Whether some of ``prompts`` has no stored feature vector in ``out``'s prompts table."""
    existing = load_prompts(out)
    if existing is None or FEATURE_COLUMN not in existing.columns:
        return True
    stored = existing.filter(pl.col(FEATURE_COLUMN).is_not_null())["prompt_id"]
    return not prompts["prompt_id"].is_in(stored.implode()).all()


def with_features(
    prompts: pl.DataFrame, job: OracleJob, hidden_states: HiddenStates, progress: OracleProgress
) -> pl.DataFrame:
    """``prompts`` with the ``features`` column of ``job.store_features`` (``hidden``: the model's
    final hidden state at the last prompt token, by ``hidden_states``, float32), computed
    only for the prompts whose features ``job.out`` does not hold yet."""
    existing = load_prompts(job.out)
    known = (
        existing.filter(pl.col(FEATURE_COLUMN).is_not_null()).select("prompt_id", FEATURE_COLUMN)
        if existing is not None and FEATURE_COLUMN in existing.columns
        else pl.DataFrame(schema={"prompt_id": pl.String, FEATURE_COLUMN: pl.List(pl.Float32)})
    )
    missing = prompts.filter(~pl.col("prompt_id").is_in(known["prompt_id"].implode()))
    with progress.features(job, missing.height):
        hidden = hidden_states(model_inputs(missing))
    _check_feature_size(known, hidden, job)
    computed = pl.DataFrame(
        {"prompt_id": missing["prompt_id"], FEATURE_COLUMN: list(hidden.astype(np.float32))},
        schema={"prompt_id": pl.String, FEATURE_COLUMN: pl.List(pl.Float32)},
    )
    features = pl.concat([known, computed], how="vertical_relaxed")
    return prompts.drop(FEATURE_COLUMN, strict=False).join(
        features, on="prompt_id", how="left", maintain_order="left"
    )


def _check_feature_size(known: pl.DataFrame, hidden: np.ndarray, job: OracleJob) -> None:
    """The stored features and the new ones are vectors of one length: one column of
    several sizes (another model's hidden states) is of no use to any estimator."""
    stored = known[FEATURE_COLUMN].list.len().unique().to_list()
    if hidden.shape[0] and stored and stored != [hidden.shape[1]]:
        raise InputError(
            f"{job.out / PROMPTS_FILE} holds prompt features of {stored[0]} numbers (another "
            f"model's hidden states); this model's have {hidden.shape[1]}: write this run "
            "to another --out, or run it with --store-features none"
        )


def _run_here(
    todo: list[Chunk],
    sampler: Sampler,
    job: OracleJob,
    identity: Mapping[str, Any],
    metadata: Mapping[str, Any],
    pool: ProcessPoolExecutor | None,
    sink: PartProgress,
) -> OracleReport:
    """:func:`run_chunks` in this process, with ``job.grading.reward_workers`` grading processes
    when no ``pool`` is given."""
    own_pool = pool is None and job.grading.reward_workers > 0
    if own_pool:
        pool = scoring_pool(job.grading.reward_workers)
    try:
        return run_chunks(todo, sampler, job, identity, metadata, pool, sink, sink.part_written)
    finally:
        if own_pool and pool is not None:
            pool.shutdown()

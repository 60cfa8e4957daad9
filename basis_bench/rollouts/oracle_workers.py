"""The oracle's sampling processes: one single-thread worker per free CPU core.

On a CPU, torch threads beyond the free cores spin in OpenMP barriers (5-10x slower than
one thread, docs/oracle.md), and one thread per process uses a core better than two
threads in one process. So a run on the CPU gives each worker one torch thread and
starts :func:`auto_workers` of them: the free cores (cores this process may use minus
the one-minute load average, at least 1), no more than the chunks to sample.

Worker ``j`` of ``W`` samples chunks ``j, j + W, ...`` of the pending list and writes
their parts itself; a chunk's rows depend only on the chunk (its seed, prompts and
settings), so the dataset equals a one-process run's. Workers send their progress and
reports to the parent over a queue; a worker whose parent is gone exits at its next
decode step, so a killed run leaves no sampler behind (its parts are complete or absent).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from basis_bench.errors import InputError
from basis_bench.rollouts.oracle_chunks import Chunk, OracleReport, PartProgress, run_chunks
from basis_bench.rollouts.oracle_job import OracleJob
from basis_bench.rollouts.sampling import Sampler, sampler_class


def free_cores() -> int:
    """Cores this process may run on minus the one-minute load average, rounded; at least 1."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, round(cores - os.getloadavg()[0])))


def uses_cpu_workers(job: OracleJob) -> bool:
    """Whether the job's sampler runs on the CPU in processes of one thread each (a backend
    with ``cpu_workers``, e.g. hf, without a GPU)."""
    if not sampler_class(job.generation.backend, job.generation.device).capabilities.cpu_workers:
        return False
    if job.generation.device == "auto":
        import torch

        return not torch.cuda.is_available()
    return job.generation.device == "cpu"


def auto_workers(job: OracleJob, pending: int) -> int:
    """``job.workers``, or when 0 (auto) one per free core on the CPU (one on a GPU), at
    most one per pending chunk."""
    if job.workers:
        return max(1, min(job.workers, pending))
    return max(1, min(free_cores(), pending)) if uses_cpu_workers(job) else 1


@contextlib.contextmanager
def one_torch_thread(enabled: bool) -> Iterator[None]:
    """torch on one thread inside the block (when ``enabled``), restored afterwards."""
    if not enabled:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class WorkerTask:
    """What one worker samples, sent to it pickled."""

    job: OracleJob
    chunks: list[Chunk]
    identity: Mapping[str, Any]
    metadata: Mapping[str, Any]
    sampler: Callable[[], Sampler]
    parent_pid: int


class _QueueProgress:
    """A worker's progress, forwarded to the parent; exits when the parent is gone."""

    def __init__(self, messages: Any, parent_pid: int) -> None:
        self.messages, self.parent_pid = messages, parent_pid

    def __call__(self, finished: int, tokens: int) -> None:
        if os.getppid() != self.parent_pid:
            os._exit(1)  # orphaned (the run was killed): stop sampling at once
        self.messages.put(("step", finished, tokens))

    def part_written(self, n_prompts: int) -> None:
        self.messages.put(("part", n_prompts))


def _work(task: WorkerTask, messages: Any) -> None:
    """A worker's body: sample and write its chunks on one torch thread."""
    import torch

    from basis_bench.rollouts.rewards import scoring_pool

    torch.set_num_threads(1)
    progress = _QueueProgress(messages, task.parent_pid)
    try:
        sampler = task.sampler()
        messages.put(("loaded",))
        pool = (
            scoring_pool(task.job.grading.reward_workers)
            if task.job.grading.reward_workers
            else None
        )
        try:
            report = run_chunks(
                task.chunks,
                sampler,
                task.job,
                task.identity,
                task.metadata,
                pool,
                progress,
                progress.part_written,
            )
        finally:
            if pool is not None:
                pool.shutdown()
        messages.put(("done", report))
    except InputError as err:
        messages.put(("input-error", str(err)))
    except Exception as err:
        messages.put(("error", f"{type(err).__name__}: {err}"))


def run_in_workers(
    count: int,
    task: Callable[[list[Chunk]], WorkerTask],
    chunks: list[Chunk],
    progress: PartProgress,
    loaded: Callable[[], object],
) -> OracleReport:
    """Sample ``chunks`` in ``count`` spawned workers (worker ``j`` takes ``chunks[j::count]``,
    its task made by ``task``), drawing their progress on ``progress``; their summed report.
    ``loaded`` runs once, when the first worker has loaded its model."""
    context = multiprocessing.get_context("spawn")  # no forked torch or polars state
    messages = context.Queue()
    workers = [
        context.Process(target=_work, args=(task(chunks[j::count]), messages), name=f"oracle-{j}")
        for j in range(count)
    ]
    for worker in workers:
        worker.start()
    report, done, any_loaded = OracleReport(), 0, False
    try:
        while done < count:
            try:
                message = messages.get(timeout=1.0)
            except queue.Empty:
                _check_alive(workers)
                continue
            kind = message[0]
            if kind == "loaded":
                if not any_loaded:
                    loaded()
                any_loaded = True
            elif kind == "step":
                progress(message[1], message[2])
            elif kind == "part":
                progress.part_written(message[1])
            elif kind == "done":
                done += 1
                report.parts_written += message[1].parts_written
                report.rollouts_written += message[1].rollouts_written
                report.reward_sum += message[1].reward_sum
            elif kind == "input-error":
                raise InputError(message[1])
            else:
                raise RuntimeError(f"an oracle worker failed: {message[1]}")
    finally:
        for worker in workers:
            if worker.is_alive() and done < count:
                worker.terminate()
            worker.join()
    return report


def _check_alive(workers: list[Any]) -> None:
    """Raise if a worker ended without reporting (killed, out of memory)."""
    for worker in workers:
        if worker.exitcode not in (None, 0):
            code = worker.exitcode
            why = f"signal {-code}" if code < 0 else f"exit code {code}"
            raise RuntimeError(
                f"oracle worker {worker.name} died ({why}); rerun the command to resume"
            )

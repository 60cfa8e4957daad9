"""`basis-bench oracle`: sample and score rollouts from a checkpoint into a rollouts dataset.

The options are :class:`~basis_bench.rollouts.oracle_job.OracleJob`'s fields (made by
:func:`~basis_bench.cli.from_config.options_from`); the run is
:func:`~basis_bench.rollouts.oracle.run_oracle`, drawn here as a rich progress bar.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from basis_bench.cli.app import app
from basis_bench.cli.from_config import Cli, options_from
from basis_bench.errors import reraise_swallowed_interrupt
from basis_bench.guards.quoting import shown
from basis_bench.rollouts.oracle_job import OracleJob, Shard
from basis_bench.rollouts.reward_function import MATH_VERIFY
from basis_bench.rollouts.training_record import record_step

if TYPE_CHECKING:
    from basis_bench.rollouts.oracle import OracleReport


# The task counts finished samples; its ``tokens`` field counts generated tokens
# (finished or not), advanced after every decode step.


class _SamplesColumn(ProgressColumn):
    """Samples done out of the total."""

    def render(self, task: Task) -> Text:
        return Text(f"{int(task.completed):,}/{int(task.total or 0):,} samples")


class _PromptsColumn(ProgressColumn):
    """Prompts whose samples are scored and written (a part is written per chunk)."""

    def __init__(self, n_prompts: int) -> None:
        super().__init__()
        self.n_prompts = n_prompts

    def render(self, task: Task) -> Text:
        return Text(f"{task.fields.get('prompts', 0)}/{self.n_prompts} prompts")


class _SamplesPerSecondColumn(ProgressColumn):
    """Finished samples per second since sampling started."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        if not elapsed or not task.completed:
            return Text("-- samples/s")
        return Text(f"{task.completed / elapsed:,.2f} samples/s")


class _TokensPerSecondColumn(ProgressColumn):
    """Generated tokens per second since sampling started (model loading excluded)."""

    def render(self, task: Task) -> Text:
        tokens, elapsed = task.fields.get("tokens", 0), task.elapsed
        if not elapsed or not tokens:
            return Text("-- tokens/s")
        return Text(f"{tokens / elapsed:,.1f} tokens/s")


class _EtaColumn(ProgressColumn):
    """Time left at the samples/s so far. Sequences leave the batch as they finish and
    waiting ones take their place, so after the first few the rate is steady; the
    first estimates lean short (short answers finish first)."""

    max_refresh = 1.0

    def render(self, task: Task) -> Text:
        elapsed, done, total = task.elapsed, task.completed, float(task.total or 0)
        if task.finished:
            return Text("ETA 0:00:00")
        if not elapsed or not done:
            return Text("ETA --:--:--")
        return Text(f"ETA {_clock((total - done) * elapsed / done)}")


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class _ProgressSink:
    """The sampler's progress callback: finished samples and tokens into the task."""

    def __init__(self, progress: Progress, task: object) -> None:
        self.progress, self.task = progress, task
        self.tokens = 0
        self.prompts = 0

    def __call__(self, finished: int, tokens: int) -> None:
        self.tokens += tokens
        self.progress.update(self.task, advance=finished, tokens=self.tokens)  # type: ignore[arg-type]

    def part_written(self, n_prompts: int) -> None:
        reraise_swallowed_interrupt()
        self.prompts += n_prompts
        self.progress.update(self.task, prompts=self.prompts)  # type: ignore[arg-type]


class _LogSink:
    """Progress as plain lines, for a log file (stderr not a terminal): one every
    ``interval`` seconds of sampling and one per part written."""

    def __init__(
        self, console: Console, label: str, samples: int, n_prompts: int, interval: float
    ) -> None:
        self.console, self.label, self.interval = console, label, interval
        self.total, self.n_prompts = samples, n_prompts
        self.done = self.tokens = self.prompts = 0
        self.start = self.last = time.monotonic()
        self.printed = (-1, -1)

    def __call__(self, finished: int, tokens: int) -> None:
        self.done += finished
        self.tokens += tokens
        if time.monotonic() - self.last >= self.interval:
            self.line()

    def part_written(self, n_prompts: int) -> None:
        reraise_swallowed_interrupt()
        self.prompts += n_prompts
        self.line()

    def finish(self) -> None:
        """The last line, unless the last part's line already said it all."""
        if self.printed != (self.done, self.prompts):
            self.line()

    def line(self) -> None:
        """samples done/total, prompts written, samples/s, tokens/s, ETA, elapsed."""
        self.last = time.monotonic()
        self.printed = (self.done, self.prompts)
        elapsed = max(self.last - self.start, 1e-9)
        rate = self.done / elapsed
        eta = _clock((self.total - self.done) / rate) if rate else "--:--:--"
        self.console.print(
            f"{shown(self.label)}: {self.done:,}/{self.total:,} samples, "
            f"{self.prompts}/{self.n_prompts} prompts, {rate:,.2f} samples/s, "
            f"{self.tokens / elapsed:,.1f} tokens/s, ETA {eta}, elapsed {_clock(elapsed)}",
            highlight=False,
            soft_wrap=True,
        )


LOG_INTERVAL_S = 30.0
"""Seconds between progress lines when stderr is not a terminal."""


class ConsoleProgress:
    """The oracle's progress on stderr: warnings, the plan, a live bar, the summary."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)

    def warning(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {shown(message)}", highlight=False)

    def planned(self, job: OracleJob, n_prompts: int, todo: int, done: int, workers: int) -> None:
        self.console.print(
            f"{n_prompts} prompts from {shown(job.source.prompts)}; shard {job.shard}: "
            f"{todo + done} chunk(s), {done} already complete; "
            f"at most {job.sampling.max_new_tokens} new tokens per response; "
            + (
                "each prompt as the trainer renders it"
                if job.source.is_trainer_dataset
                else f"instruction {shown(repr(job.template.instruction))}"
            )
            + ("" if job.reward.function == MATH_VERIFY else f"; reward {job.reward.function}")
            + (f"; {workers} sampling worker(s)" if todo else ""),
            highlight=False,
        )
        if not todo:
            self.console.print(
                f"nothing to do: every chunk of shard {job.shard} is in {shown(job.out)}"
            )

    @contextlib.contextmanager
    def sampling(
        self, job: OracleJob, samples: int, n_prompts: int
    ) -> Iterator[_ProgressSink | _LogSink]:
        label = shown(f"{job.policy} on {job.generation.backend}")
        if not self.console.is_terminal:  # a batch job's log: plain lines, no live bar
            sink = _LogSink(self.console, label, samples, n_prompts, LOG_INTERVAL_S)
            yield sink
            sink.finish()
            return
        with Progress(
            TextColumn("[bold]{task.description}"),
            _SamplesColumn(),
            _PromptsColumn(n_prompts),
            _SamplesPerSecondColumn(),
            _TokensPerSecondColumn(),
            _EtaColumn(),
            console=self.console,
        ) as progress:
            yield _ProgressSink(
                progress, progress.add_task(label, total=samples, tokens=0, prompts=0)
            )

    @contextlib.contextmanager
    def features(self, job: OracleJob, n_prompts: int) -> Iterator[None]:
        """A line before and after (a spinner between, on a terminal): the pass has no
        per-sample progress to draw, but at paper scale it takes minutes."""
        what = f"hidden states of {n_prompts} prompts (--device {job.generation.device})"
        start = time.monotonic()
        if self.console.is_terminal:
            with self.console.status(f"computing the {what}"):
                yield
        else:
            self.console.print(f"computing the {what}", highlight=False)
            yield
        self.console.print(f"{what}: done in {_clock(time.monotonic() - start)}", highlight=False)

    def finished(self, job: OracleJob, report: OracleReport) -> None:
        self.console.print(
            f"wrote {report.parts_written} part(s), {report.rollouts_written} rollouts, "
            f"mean reward {report.mean_reward:.3f} -> {shown(job.out)}",
            highlight=False,
        )


@app.command()
@options_from(OracleJob, param="job", cli={"shard": Cli(str, Shard.parse, str(Shard()))})
def oracle(job: OracleJob) -> None:
    """Sample --n rollouts per prompt from --model, score them with math-verify, and write
    them to --out as one Parquet part per chunk of prompts. Rerun the same command to
    resume: complete parts are skipped."""
    from basis_bench.rollouts.oracle import run_oracle

    progress = ConsoleProgress()
    report = run_oracle(job, progress)
    if job.step is not None:  # where the checkpoint sat in training, for the step replay
        record_step(job.out, job.policy, job.step)
    if report.parts_written:
        progress.finished(job, report)

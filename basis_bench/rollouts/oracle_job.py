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
from basis_bench.rollouts.generation import Generation
from basis_bench.rollouts.grading import Grading
from basis_bench.rollouts.prompt_source import PromptSource
from basis_bench.settings import MAX_SEED, check_settings, section, setting, setting_flag

if TYPE_CHECKING:
    from basis_bench.rollouts.rewards import RewardConfig
    from basis_bench.rollouts.sampling.base import SamplingConfig
    from basis_bench.rollouts.templates import PromptTemplate


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
    """One oracle run: ``n`` rollouts per prompt of the source's ``prompts`` from the generation's
    ``model``, graded, and written to the dataset ``out`` as policy ``policy`` (the options of
    ``basis-bench oracle``, the sections' settings flat among them; training's reference cache
    makes one from its own sections)."""

    generation: Generation = section(Generation, omit=("max_model_len", "gpu_memory_utilization"))
    policy: str = setting(
        help="Policy name written in the 'policy' column (e.g. ckpt-100, reference)."
    )
    source: PromptSource = section(PromptSource)
    out: Path = setting(help="Dataset directory (created; reruns resume in it).")
    n: int = setting(
        256, min_val=1, help="Samples per prompt (256 for the oracle, 64 for the reference cache)."
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
    seed: int = setting(
        0,
        help="Base seed; each chunk's seed is derived from it and the chunk's prompts.",
        min_val=0,
        max_val=MAX_SEED,
    )
    grading: Grading = section(Grading)
    workers: int = setting(
        0,
        min_val=0,
        help="Sampling processes, each on one torch thread, each writing its own chunks (the "
        "dataset is the same for any number). 0: one per free CPU core (cores minus the load "
        "average) on the CPU, one on a GPU; never more than the chunks to sample.",
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
    store_scores: int = setting(
        0,
        min_val=0,
        help="Store a K-dimensional sketch of each rollout's output-layer score "
        "(grad log pi(y|x)) in a 'score_sketch' column, K = this (0: none; 256 advised), for "
        "evaluate's gradient benchmark (docs/method.md). hf backend, --top-p 1.",
    )
    score_seed: int = setting(
        0,
        min_val=0,
        help="Seed of the score sketch's random projection: keep it for every policy of a "
        "dataset, so their gradients live in one space.",
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
        self.source.check_template(self.generation, lambda name: setting_flag(OracleJob, name))
        generation = self.generation
        if self.store_scores and (generation.top_p < 1 or generation.temperature == 0):
            raise InputError(
                "--store-scores sketches the score of the distribution that sampled, "
                "softmax(logits / T): it needs --top-p 1 and a temperature above 0"
            )

    @property
    def sampling(self) -> SamplingConfig:
        return self.generation.sampling(self.n, self.source.prompts)

    @property
    def reward(self) -> RewardConfig:
        """Grading; answer format ``auto`` is number for arithmetic prompts, any otherwise."""
        return self.grading.reward(self.source.prompts)

    @property
    def template(self) -> PromptTemplate:
        return self.generation.template(self.source.prompts)

"""Which prompts a run reads: :class:`PromptSource`, one settings section that the oracle
(:class:`~basis_bench.rollouts.oracle_job.OracleJob`) holds as its prompts and training
(:class:`~basis_bench.train.config.TrainConfig`) as its training prompts, passed whole into
the reference cache's job. Kept free of polars: a command reads these options at startup.

Layer: a settings section above what it loads (prompts, trainer_prompts); none of them needs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from basis_bench.errors import InputError
from basis_bench.settings import setting

if TYPE_CHECKING:
    import polars as pl

    from basis_bench.rollouts.generation import Generation


@dataclass(frozen=True)
class PromptSource:
    """A prompt source, its MATH levels and how many of its prompts. The config holding it
    checks these settings, naming each by its key."""

    prompts: str = setting(
        help="Prompt source: a JSONL/JSON/Parquet file of MATH-style or DAPO-Math-17K rows; "
        "hf:NAME or hf:NAME@SPLIT for a hub dataset (needs 'datasets' and network); "
        "arithmetic:n=200,digits=1-2,steps=1-3,ops=+-*,seed=0 for generated problems; or "
        "trainer:PATH, a trainer's own dataset (a 'prompt' column of chat messages or text: "
        "TRL's train_dataset saved to disk or as Parquet/JSONL, a verl parquet), each prompt "
        "rendered as the trainer renders it."
    )
    levels: str | None = setting(None, help="Keep only these MATH levels, e.g. 3-5 or 3,5.")
    limit: int = setting(
        0, min_val=0, help="Keep only the first N prompts, after the levels (0: all)."
    )

    @property
    def is_trainer_dataset(self) -> bool:
        """A trainer's own dataset (``trainer:PATH``): each prompt is given whole, as the
        trainer gives it (:mod:`basis_bench.rollouts.trainer_prompts`)."""
        from basis_bench.rollouts.trainer_prompts import is_trainer_source

        return is_trainer_source(self.prompts)

    def check_template(self, generation: Generation, flag: Callable[[str], str]) -> None:
        """A trainer's dataset carries its own messages: an instruction or system prompt of the
        oracle's own would make the cache's prompts differ from the trainer's (``flag`` names a
        setting as the user gives it). Training does not ask: its held-out prompts use both."""
        if self.is_trainer_dataset and (generation.instruction or generation.system_prompt):
            raise InputError(
                f"{self.prompts}: a trainer's dataset holds each prompt whole (system prompt "
                f"included), rendered as the trainer renders it; drop {flag('instruction')} "
                f"and {flag('system_prompt')}"
            )

    def load(self) -> pl.DataFrame:
        """The prompts: the source's, level-filtered, the first ``limit``."""
        from basis_bench.rollouts.prompts import load_prompt_source, parse_levels

        levels = parse_levels(self.levels) if self.levels is not None else None
        return load_prompt_source(self.prompts, levels, self.limit or None)

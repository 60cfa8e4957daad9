"""Which prompts a run reads: :class:`PromptSource`, one settings section that the oracle
(:class:`~basis_bench.rollouts.oracle_job.OracleJob`) holds as its prompts and training
(:class:`~basis_bench.train.config.TrainConfig`) as its training prompts, passed whole into
the reference cache's job. Kept free of polars: a command reads these options at startup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from basis_bench.settings import setting

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class PromptSource:
    """A prompt source, its MATH levels and how many of its prompts. The config holding it
    checks these settings, naming each by its key."""

    prompts: str = setting(
        help="Prompt source: a JSONL/JSON/Parquet file of MATH-style or DAPO-Math-17K rows; "
        "hf:NAME or hf:NAME@SPLIT for a hub dataset (needs 'datasets' and network); or "
        "arithmetic:n=200,digits=1-2,steps=1-3,ops=+-*,seed=0 for generated problems."
    )
    levels: str | None = setting(None, help="Keep only these MATH levels, e.g. 3-5 or 3,5.")
    limit: int = setting(
        0, min_val=0, help="Keep only the first N prompts, after the levels (0: all)."
    )

    def load(self) -> pl.DataFrame:
        """The prompts: the source's, level-filtered, the first ``limit``."""
        from basis_bench.rollouts.prompts import load_prompt_source, parse_levels

        levels = parse_levels(self.levels) if self.levels is not None else None
        return load_prompt_source(self.prompts, levels, self.limit or None)

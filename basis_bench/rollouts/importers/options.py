"""How to read an import's sources: :class:`ImportOptions`, the options of ``basis-bench
import`` that name the sources' columns and fields (help and defaults written once, here).

Kept free of polars, so the CLI reads the options at startup without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from basis_bench.settings import MAX_SEED, check_settings, setting, setting_flag


@dataclass(frozen=True)
class ImportOptions:
    """Column and field names of the sources, and the expansion settings (the options of
    ``basis-bench import`` that say how to read a source; the CLI reads help and defaults
    from here)."""

    id_col: str | None = setting(
        None, help="Problem id column/field. Default: prompt_id (idx for eval-jsonl)."
    )
    n_col: str = setting("n", help="counts: samples column.")
    correct_col: str = setting("n_correct", help="counts: correct-samples column.")
    problem_col: str | None = setting(
        None,
        help="Problem text column/field (writes prompts.parquet when present). Default: "
        "problem (question for eval-jsonl).",
    )
    answer_col: str | None = setting(
        None, help="Gold answer column/field. Default: answer (gt for eval-jsonl)."
    )
    score_field: str = setting("score", help="eval-jsonl: the per-sample scores list.")
    response_field: str = setting("code", help="eval-jsonl: the responses list, kept when present.")
    policy_col: str | None = setting(
        None,
        help="long: policy column; only --policy's rows are read. Default: policy, when the "
        "table has one (a column named here must exist).",
    )
    sample_col: str = setting("sample_idx", help="long: sample index column.")
    reward_col: str = setting("reward", help="long: reward column.")
    rollouts_per_visit: int | None = setting(
        None,
        help="acc-history: rollouts per example per visit (G).",
        min_val=1,
        max_val=2**31 - 1,  # a sample index is Int32
        optional=True,
    )
    id_format: str | None = setting(
        None,
        help="Turn source ids into prompt ids: fixed text around {} or {:0Nd}, e.g. "
        "math500_{:03d} maps 7 to math500_007.",
    )
    seed: int = setting(
        0,
        help="counts, acc-history: seed of the synthetic order of the rewards.",
        min_val=0,
        max_val=MAX_SEED,
    )
    metric: str | None = setting(
        None,
        help="lm-eval: the metric to read as the reward (exact_match, acc, ...). Default: the "
        "only one the lines name.",
    )
    filter_name: str | None = setting(
        None,
        flag="--filter",
        help="lm-eval: the filter whose lines are read (strict-match, flexible-extract, ...). "
        "Default: the only one the files hold.",
    )

    def __post_init__(self) -> None:
        check_settings(self, label=lambda name: setting_flag(ImportOptions, name))

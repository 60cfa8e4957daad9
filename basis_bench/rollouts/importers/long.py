"""``long``: a table already in long form (prompt_id, [policy,] sample_idx, reward)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.importers.checks import (
    add_prompt_ids,
    integer_column,
    is_not,
    report_duplicates,
    report_kept_columns,
    report_not_text,
)
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    LOC,
    Imported,
    Problems,
    Source,
    describe_source,
    read_table,
    require_columns,
    require_scalars,
    sources_label,
    stack_sources,
)
from basis_bench.schema import OPTIONAL_ROLLOUT_COLUMNS


def import_long(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = Problems()
    id_col, policy_col = opt.id_col or "prompt_id", opt.policy_col or "policy"
    frames, sources, by_policy = [], [], False
    for path in paths:
        frame, src, named_policies = _read_long(path, policy, opt, problems)
        frames.append(frame)
        sources.append(src)
        by_policy |= named_policies
    if not any(f.height for f in frames):
        problems.raise_if_any(sources_label(paths))  # e.g. every policy a number
        raise InputError(
            f"{sources_label(paths)}: no rows for policy {policy!r} (the source's "
            f"{policy_col!r} column names others)"
            if by_policy
            else f"{sources_label(paths)}: no rollouts to import (the sources hold no rows)"
        )
    table = stack_sources(frames)
    report_duplicates(table, sources, ["prompt_id", "sample_idx"], problems, "(prompt, sample)")
    problems.raise_if_any(sources_label(paths))
    rollouts = table.select(
        "prompt_id",
        pl.lit(policy, pl.Categorical).alias("policy"),
        pl.col("sample_idx").cast(pl.Int32),
        pl.col("_reward").alias("reward"),
        *[c for c in OPTIONAL_ROLLOUT_COLUMNS if c in table.columns],
    )
    return Imported(
        "long",
        rollouts,
        [policy],
        None,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {
            "columns": {
                "id": id_col,
                "policy": policy_col,
                "sample": opt.sample_col,
                "reward": opt.reward_col,
            }
        },
    )


def _read_long(
    path: Path, policy: str, opt: ImportOptions, problems: Problems
) -> tuple[pl.DataFrame, Source, bool]:
    """One source's checked rows of ``policy``: ``prompt_id`` (Categorical codes: a source
    of millions of rows names a few thousand prompts), ``sample_idx``, ``_reward``, the
    kept optional columns and ``_loc``; the source's other columns are dropped here. The
    flag: whether the source has a policy column (rows of other policies were dropped)."""
    id_col = opt.id_col or "prompt_id"
    policy_col = opt.policy_col or "policy"
    named = {"--policy-col": policy_col} if opt.policy_col is not None else {}  # never unused
    texts = [policy_col, *(c for c, t in OPTIONAL_ROLLOUT_COLUMNS.items() if t == pl.String)]
    df, src = read_table(path, id_col, texts)
    require_columns(
        df,
        src,
        {
            "--id-col": id_col,
            "--sample-col": opt.sample_col,
            "--reward-col": opt.reward_col,
            **named,
        },
    )
    present_policy = [policy_col] if policy_col in df.columns else []
    require_scalars(df, src, [id_col, opt.sample_col, opt.reward_col, *present_policy])
    if policy_col in df.columns:  # a table of several policies: take this one's rows
        # policy names are text: a JSON 1 or 1.0 would match --policy 1 as polars' "1"
        report_not_text(df, src, policy_col, problems, digits=False)
        df = df.filter(pl.col(policy_col).cast(pl.String) == policy)
    df = add_prompt_ids(df, src, id_col, opt.id_format, problems)
    df = integer_column(df, src, opt.sample_col, "sample_idx", problems, minimum=0)
    reward = pl.col(opt.reward_col).cast(pl.Float64, strict=False)
    if df.schema[opt.reward_col] == pl.Boolean:  # true is not a number: never read as 1.0
        reward = pl.lit(None, pl.Float64)
    problems.add_rows(
        src,
        df.filter(reward.is_null() | ~reward.is_finite()),
        is_not(df, opt.reward_col, "a finite number"),
    )
    kept = {c: t for c, t in OPTIONAL_ROLLOUT_COLUMNS.items() if c != id_col}
    report_kept_columns(df, src, kept, problems)
    keep = [c for c in kept if c in df.columns]
    frame = df.select(  # sample_idx is within Int32 or null (reported)
        pl.col("prompt_id").cast(pl.Categorical),
        pl.col("sample_idx").cast(pl.Int32),
        reward.alias("_reward"),
        *keep,
        LOC,
    )
    return frame, src, bool(present_policy)

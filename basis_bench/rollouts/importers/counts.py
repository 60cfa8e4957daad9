"""``counts``: a table of ``prompt_id, n, n_correct [, problem, answer]``; each count becomes
``n`` binary rewards, ``n_correct`` of them 1, in a seeded uniformly random order (the
metadata says ``order: synthetic``). Samples are i.i.d. given the prompt, so a random order
given the count has exactly the law of the real sequence."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from basis_bench.guards.memory_check import IMPORT_BYTES_PER_ROLLOUT, check_rollouts_fit
from basis_bench.rollouts.importers.checks import (
    add_prompt_ids,
    integer_column,
    prompt_texts,
    prompts_from,
    report_duplicates,
    report_prompt_values,
)
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    Imported,
    Problems,
    describe_source,
    read_table,
    require_columns,
    require_scalars,
    sources_label,
    stack_sources,
)


def policy_seed(seed: int, policy: str) -> int:
    """The order seed of one policy: distinct policies get independent orders."""
    digest = hashlib.sha256(f"{seed}\n{policy}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


BLOCK_ROWS = 1 << 20  # samples expanded at once (whole prompts; at least one)


def expand_counts(counts: pl.DataFrame, seed: int) -> pl.DataFrame:
    """``prompt_id, policy, n, n_correct`` -> one row per sample with a binary reward.

    Within each (policy, prompt) group the ``n_correct`` ones and ``n - n_correct`` zeros
    are placed in a uniformly random order: rows are sorted by policy and prompt, each
    policy draws its own keys from ``policy_seed(seed, policy)``, and samples are ordered by
    their key within the group. Depends only on the counts and the seed, not on row order.
    Expanded in blocks of whole prompts (the keys are one stream drawn block after block),
    ids and policies as Categorical codes: about 20 bytes a row.
    """
    rows = int(counts["n"].sum())
    check_rollouts_fit(rows, IMPORT_BYTES_PER_ROLLOUT, "this import", "import fewer samples")
    counts = counts.sort(["policy", "prompt_id"])
    frames = []
    for (policy,), part in counts.group_by("policy", maintain_order=True):
        n = part["n"].to_numpy().astype(np.int64)
        correct = part["n_correct"].to_numpy().astype(np.int64)
        ids = part["prompt_id"].cast(pl.Categorical)
        rng = np.random.default_rng(policy_seed(seed, str(policy)))
        ends = np.cumsum(n)
        first = 0
        while first < part.height:  # the prompts [first, last) make one block
            last = max(
                first + 1, int(np.searchsorted(ends, ends[first] - n[first] + BLOCK_ROWS, "right"))
            )
            frames.append(
                _expand_block(ids[first:last], str(policy), n[first:last], correct[first:last], rng)
            )
            first = last
    schema = {
        "prompt_id": pl.Categorical,
        "policy": pl.Categorical,
        "sample_idx": pl.Int32,
        "reward": pl.Float64,
    }
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def _expand_block(
    ids: pl.Series, policy: str, n: np.ndarray, correct: np.ndarray, rng: np.random.Generator
) -> pl.DataFrame:
    """The rows of consecutive prompts: ``n_correct`` ones among ``n`` in the order of the
    next ``sum(n)`` keys of ``rng`` within each prompt."""
    total = int(n.sum())
    group = np.repeat(np.arange(len(n)), n)
    position = np.arange(total) - np.repeat(np.cumsum(n) - n, n)  # 0..n-1 within a group
    reward = (position < np.repeat(correct, n)).astype(np.float64)
    order = np.lexsort((rng.random(total), group))
    return pl.DataFrame(
        {
            "prompt_id": ids.gather(group),
            "policy": pl.repeat(policy, total, dtype=pl.Categorical, eager=True),
            "sample_idx": position.astype(np.int32),
            "reward": reward[order],
        }
    )


def import_counts(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = Problems()
    frames, sources = [], []
    id_col = opt.id_col or "prompt_id"
    problem_col, answer_col = opt.problem_col or "problem", opt.answer_col or "answer"
    named = {  # a column the user named must be there (it would go unused)
        flag: col
        for flag, col in (("--problem-col", opt.problem_col), ("--answer-col", opt.answer_col))
        if col is not None
    }
    for path in paths:
        df, src = read_table(path, id_col, prompt_texts(problem_col, answer_col))
        require_columns(
            df,
            src,
            {"--id-col": id_col, "--n-col": opt.n_col, "--correct-col": opt.correct_col, **named},
        )
        require_scalars(df, src, [id_col, opt.n_col, opt.correct_col])
        report_prompt_values(df, src, problem_col, answer_col, problems)
        df = add_prompt_ids(df, src, id_col, opt.id_format, problems)
        df = integer_column(df, src, opt.n_col, "n", problems, minimum=1)
        df = integer_column(df, src, opt.correct_col, "n_correct", problems, minimum=0)
        over = df.filter(pl.col("n_correct") > pl.col("n"))
        problems.add_rows(
            src,
            over,
            pl.format(
                "{} {} exceeds {} {}",
                pl.lit(repr(opt.correct_col)),
                pl.col("n_correct"),
                pl.lit(repr(opt.n_col)),
                pl.col("n"),
            ),
        )
        frames.append(df)
        sources.append(src)
    table = stack_sources(frames)
    report_duplicates(table, sources, ["prompt_id"], problems, "prompt id")
    problems.raise_if_any(sources_label(paths))
    table = table.with_columns(pl.lit(policy).alias("policy"))
    rollouts = expand_counts(table.select("prompt_id", "policy", "n", "n_correct"), opt.seed)
    prompts = prompts_from(table, problem_col, answer_col)
    return Imported(
        "counts",
        rollouts,
        [policy],
        prompts,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "synthetic",
        {"order_seed": opt.seed, "policy_order_seed": {policy: policy_seed(opt.seed, policy)}},
    )

"""``acc-history``: ``{example id: [mean reward at visit 0, at visit 1, ...]}`` as verl-based
GRPO trainers write; with ``G`` rollouts per visit each mean must be a multiple of 1/G and
visit ``k`` becomes its own policy ``<policy>-<k:03d>``, expanded like ``counts``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.rollouts.importers.checks import add_prompt_ids, report_duplicates
from basis_bench.rollouts.importers.counts import expand_counts
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    LOC,
    MAX_LISTED,
    Imported,
    Problems,
    Source,
    check_exists,
    describe_source,
    sources_label,
    stack_sources,
    utf8_text,
)
from basis_bench.rollouts.store import check_policy_name

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_A_NUMBER = re.compile(r'\b(?:true|false)\b|""(?!\s*:)')  # strings blanked: not a key


def _report_means_not_numbers(
    path: Path, text: str, data: dict[str, Any], problems: Problems
) -> None:
    """A boolean or text among the means (``true``, ``"0.5"``) is reported by id: polars
    would read them as 1.0 and 0.5. The text is searched first (C speed; strings blanked,
    so ids that spell ``true`` do not count), the values only where it finds one."""
    if _NOT_A_NUMBER.search(_STRING.sub('""', text)) is None:
        return
    for key, means in data.items():
        listed = means if isinstance(means, list) else []  # not a list: reported as such
        wrong = next((m for m in listed if isinstance(m, bool | str)), None)
        if wrong is not None:
            problems.add(f"{path}: id {key!r}", f"mean reward {json.dumps(wrong)} is not a number")


def _load_history(path: Path, problems: Problems) -> dict[str, Any]:
    check_exists(path)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    problems.add(f"{path}: id {key!r}", "duplicate id in the JSON map")
                seen.add(key)
        return out

    text = utf8_text(path)
    try:
        data = bounded_json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: expected a JSON object {{id: [mean reward per visit]}}, got {type(data).__name__}"
        )
    _report_means_not_numbers(path, text, data, problems)
    return data


def import_acc_history(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    g = opt.rollouts_per_visit
    if g is None or g < 1:
        raise InputError(
            "acc-history needs --rollouts-per-visit G (rollouts per example per visit, >= 1)"
        )
    problems = Problems()
    frames, sources = [], []
    for path in paths:
        src = Source(path, "id")
        data = _load_history(path, problems)
        values = list(data.values())
        try:
            df = pl.DataFrame(
                {"id": list(data.keys()), "acc": values},
                schema={"id": pl.String, "acc": pl.List(pl.Float64)},
                strict=False,
            )
        except (pl.exceptions.PolarsError, TypeError, ValueError) as err:
            raise InputError(f"{path}: values must be lists of numbers ({err})") from err
        # polars would read a string value as a list of its characters: check the JSON types
        # (one isinstance per example, not per reward).
        is_list = pl.Series([isinstance(v, list) for v in values], dtype=pl.Boolean)
        df = df.with_columns(pl.col("id").alias(LOC), is_list.alias("_is_list"))
        problems.add_rows(
            src,
            df.filter(~pl.col("_is_list") | pl.col("acc").is_null()),
            "expected a list of mean rewards",
        )
        df = df.filter(pl.col("_is_list")).drop("_is_list")
        df = add_prompt_ids(df, src, "id", opt.id_format, problems)
        long = (
            df.filter(pl.col("acc").is_not_null())
            .with_columns(pl.int_ranges(0, pl.col("acc").list.len()).alias("visit"))
            .explode(["acc", "visit"])
            .filter(pl.col("visit").is_not_null())
        )
        k = pl.col("acc") * g
        bad = long.filter(
            pl.col("acc").is_null()
            | ~pl.col("acc").is_finite()
            | (pl.col("acc") < 0)
            | (pl.col("acc") > 1)
            | ((k - k.round(0)).abs() > 1e-6)
        )
        for row in bad.head(MAX_LISTED).iter_rows(named=True):
            problems.add(
                f"{path}: id {row[LOC]!r} visit {row['visit']}",
                f"mean reward {row['acc']} is not a multiple of 1/{g} in [0, 1]",
            )
        problems.total += max(0, bad.height - MAX_LISTED)
        frames.append(
            long.with_columns(k.round(0).fill_nan(0).fill_null(0).cast(pl.Int64).alias("n_correct"))
        )
        sources.append(src)
    table = stack_sources(frames)
    report_duplicates(
        table.filter(pl.col("visit") == 0), sources, ["prompt_id"], problems, "example id"
    )
    problems.raise_if_any(sources_label(paths))
    visits = int(table["visit"].max()) + 1 if table.height else 0  # type: ignore[arg-type]
    names = [f"{policy}-{v:03d}" for v in range(visits)]
    for name in names:
        check_policy_name(name)
    counts = table.select(
        "prompt_id",
        pl.format("{}-{}", pl.lit(policy), pl.col("visit").cast(pl.String).str.zfill(3)).alias(
            "policy"
        ),
        pl.lit(g, pl.Int64).alias("n"),
        "n_correct",
    )
    return Imported(
        "acc-history",
        expand_counts(counts, opt.seed),
        names,
        None,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "synthetic",
        {
            "order_seed": opt.seed,
            "rollouts_per_visit": g,
            "visit_policy": "<policy>-<k:03d>: the k-th visit of each example (not a global step)",
        },
    )

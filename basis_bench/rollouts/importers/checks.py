"""The checks every import format shares, on rows already read
(:mod:`basis_bench.rollouts.importers.reading`): prompt ids (:func:`add_prompt_ids`), text
and integer values, duplicate keys, and the prompts table a source's problem texts make.

Each check reports every offending row with its file and line (or row) number into a
:class:`~basis_bench.rollouts.importers.reading.Problems`; each filters by one condition,
so only offending rows are copied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.importers.reading import (
    FILE_INDEX,
    LOC,
    MAX_LISTED,
    Problems,
    Source,
    dtype_id_kind,
    kind_column,
)
from basis_bench.rollouts.store import conform_prompts, may_repeat
from basis_bench.schema import OPTIONAL_PROMPT_COLUMNS


def value_kind(df: pl.DataFrame, column: str) -> pl.Expr:
    """What each row's ``column`` is ("text", "integer" or "other"): its :func:`kind_column`
    where a JSON reader made one, else what the column's type holds (Parquet, CSV)."""
    if kind_column(column) in df.columns:
        return pl.col(kind_column(column))
    return pl.lit(dtype_id_kind(df.schema[column]))


MAX_ID_WIDTH = 64  # digits of a zero-padded id (--id-format {:0Nd})
_ID_FORMAT = re.compile(r"^(?P<pre>[^{}]*)\{(?::0(?P<width>\d+)d)?\}(?P<post>[^{}]*)$")


def add_prompt_ids(
    df: pl.DataFrame, src: Source, id_col: str, id_format: str | None, problems: Problems
) -> pl.DataFrame:
    """Add ``prompt_id`` (text) from ``id_col``, formatted by ``id_format`` (``{}`` or
    ``{:0Nd}`` inside fixed text, e.g. ``math500_{:03d}``).

    Ids are used exactly: text as it is, an integer as its decimal digits (7 -> "7").
    Reported by row: empty ids, text with leading or trailing whitespace (not stripped:
    " a" and "a" are two ids), ids that are neither text nor integers (true, 7.5, a list),
    and in a file whose ids mix text and integers, the ids of the other kind than its first
    (7 and "7" would be one id)."""
    kind = value_kind(df, id_col)
    df = df.with_columns(pl.col(id_col).cast(pl.String).alias("prompt_id"))
    _report_ids(df, src, id_col, kind, problems)
    if id_format is None:
        return df
    m = _ID_FORMAT.match(id_format)
    if m is None or int(m["width"] or 0) > MAX_ID_WIDTH:
        raise InputError(
            f"--id-format {id_format!r}: use fixed text around {{}} or {{:0Nd}} (N up to "
            f"{MAX_ID_WIDTH}), e.g. math500_{{:03d}}"
        )
    ident = pl.col("prompt_id")
    if m["width"] is not None:
        problems.add_rows(
            src,
            df.filter(ident.is_not_null() & (ident != "") & ~ident.str.contains(r"^\d+$")),
            pl.format(
                "{} {} is not a non-negative integer (--id-format {})",
                pl.lit(repr(id_col)),
                ident,
                pl.lit(id_format),
            ),
        )
        ident = ident.str.zfill(int(m["width"]))
    return df.with_columns((pl.lit(m["pre"]) + ident + pl.lit(m["post"])).alias("prompt_id"))


def report_not_text(
    df: pl.DataFrame, src: Source, column: str, problems: Problems, *, digits: bool
) -> None:
    """Report rows whose ``column`` holds a number or boolean where text belongs (polars
    would make "0.30000000000000004" or "true" of it); with ``digits`` an integer is
    accepted as its digits."""
    kind = value_kind(df, column)
    allowed = ["text", "integer"] if digits else ["text"]
    problems.add_rows(
        src,
        df.filter(pl.col(column).is_not_null() & ~kind.is_in(allowed)),
        pl.format(
            "{} {} is not text{}: write it as text",
            pl.lit(repr(column)),
            pl.col(column).cast(pl.String).str.slice(0, 60),
            pl.lit(" or an integer" if digits else ""),
        ),
    )


def report_kept_columns(
    df: pl.DataFrame, src: Source, columns: Mapping[str, pl.DataType], problems: Problems
) -> None:
    """Optional columns kept as they are (``n_tokens``, ``response``, ``level``, ...): a
    value the store's type would change is reported, not cast (3.7 tokens became 3, a
    response 7 the text "7"). Text columns take text (:func:`report_not_text`, which needs
    ``columns`` in read_table's ``text_cols`` for JSONL), integer columns whole numbers
    within Int32."""
    for name, dtype in ((n, t) for n, t in columns.items() if n in df.columns):
        if dtype == pl.String:
            report_not_text(df, src, name, problems, digits=False)
            continue
        number = pl.col(name).cast(pl.Float64, strict=False)
        if df.schema[name] == pl.Boolean:  # true is not 1 token
            number = pl.lit(None, pl.Float64)
        whole = (number == number.round(0)) & number.is_between(-(2**31), INT32_MAX)
        problems.add_rows(
            src,
            df.filter(pl.col(name).is_not_null() & ~whole.fill_null(False)),
            pl.format(
                "{} {} is not an integer (Int32)",
                pl.lit(repr(name)),
                pl.col(name).cast(pl.String).str.slice(0, 60),
            ),
        )


def prompt_texts(problem_col: str, answer_col: str) -> list[str]:
    """The text columns of a prompts source (read_table's ``text_cols``)."""
    kept = [c for c, t in OPTIONAL_PROMPT_COLUMNS.items() if t == pl.String]
    return [problem_col, answer_col, *kept]


def report_prompt_values(
    df: pl.DataFrame, src: Source, problem_col: str, answer_col: str, problems: Problems
) -> None:
    """A problem or answer is text or an integer (its digits: a gold answer 5 is common);
    ``level`` and ``subject`` hold their store types (:func:`report_kept_columns`)."""
    for name in (c for c in (problem_col, answer_col) if c in df.columns):
        report_not_text(df, src, name, problems, digits=True)
    report_kept_columns(df, src, OPTIONAL_PROMPT_COLUMNS, problems)


def _json_text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def is_not(df: pl.DataFrame, column: str, expected: str) -> pl.Expr:
    """Each row's message that its ``column`` is not ``expected`` ("a finite number"): the
    value as written, at most 60 characters, JSON-quoted where it is empty or starts or ends
    with whitespace (``""``, ``" "``); a missing value (an empty CSV cell, a JSON null or an
    absent field) "has no value". All of them, and the text ``(empty)``, read "(empty)"
    alike: an absent field was called empty, a blank value showed nothing."""
    value = pl.col(column).cast(pl.String).str.slice(0, 60)
    blank = (value == "") | value.str.contains(r"^\s|\s$")
    quoted = value.map_elements(_json_text, return_dtype=pl.String)
    value = pl.when(blank).then(quoted).otherwise(value)
    return (
        pl.when(pl.col(column).is_null())
        .then(pl.lit(f"{column!r} has no value, expected {expected}"))
        .otherwise(pl.format("{} {} is not {}", pl.lit(repr(column)), value, pl.lit(expected)))
    )


def _report_ids(
    df: pl.DataFrame, src: Source, id_col: str, kind: pl.Expr, problems: Problems
) -> None:
    """The id checks of :func:`add_prompt_ids` (``kind``: each row's id kind). Each check
    filters ``df`` by one condition, so only offending rows are copied."""
    ident = pl.col("prompt_id")
    named = ident.is_not_null() & (ident != "")
    problems.add_rows(src, df.filter(~named), f"empty {id_col!r}")
    shown = ident.str.slice(0, 60)  # text as a JSON string: quoted, whitespace escaped
    quoted = shown.map_elements(_json_text, return_dtype=pl.String)
    shown = pl.when(kind == "text").then(quoted).otherwise(shown)
    value = pl.format("{} {}", pl.lit(repr(id_col)), shown)
    problems.add_rows(
        src, df.filter(named & (kind == "other")), pl.format("{} is not text or an integer", value)
    )
    problems.add_rows(
        src,
        df.filter(named & (kind == "text") & ident.str.contains(r"^\s|\s$")),  # no stripped copy
        pl.format("{} has leading or trailing whitespace (ids are used exactly)", value),
    )
    typed = df.select(named & (kind != "other")).to_series()
    if not typed.any():
        return
    first = df.slice(int(typed.arg_max() or 0), 1).select(kind).item()
    words = {"text": "text", "integer": "an integer"}
    problems.add_rows(
        src,
        df.filter(named & (kind != "other") & (kind != first)),
        pl.format(
            '{} is {} but the file\'s first id is {} (7 and "7" would be one id): write '
            "every id as text or every id as an integer",
            value,
            kind.replace_strict(words, return_dtype=pl.String),
            pl.lit(words[first]),
        ),
    )


INT32_MAX = 2**31 - 1  # the store's sample_idx is Int32


def integer_column(
    df: pl.DataFrame,
    src: Source,
    col: str,
    alias: str,
    problems: Problems,
    minimum: int,
    maximum: int = INT32_MAX,
) -> pl.DataFrame:
    """Cast ``col`` to Int64 as ``alias``; non-integers and values outside
    [``minimum``, ``maximum``] are reported."""
    value = pl.col(col).cast(pl.Float64, strict=False) if df.schema[col] != pl.Boolean else None
    if value is None:
        problems.add_rows(src, df, f"{col!r} is a boolean, expected an integer")
        return df.with_columns(pl.lit(0, pl.Int64).alias(alias))
    df = df.with_columns(value.alias("_f"))
    bad = df.filter(
        pl.col("_f").is_null() | ~pl.col("_f").is_finite() | (pl.col("_f") != pl.col("_f").round(0))
    )
    problems.add_rows(src, bad, is_not(df, col, "an integer"))
    low = df.filter(pl.col("_f").is_finite() & (pl.col("_f") < minimum))
    problems.add_rows(
        src,
        low,
        pl.format(
            "{} {} is below {}", pl.lit(repr(col)), pl.col(col).cast(pl.String), pl.lit(minimum)
        ),
    )
    high = df.filter(pl.col("_f").is_finite() & (pl.col("_f") > maximum))
    problems.add_rows(
        src,
        high,
        pl.format(
            "{} {} is above {}",
            pl.lit(repr(col)),
            pl.col(col).cast(pl.String),
            pl.lit(maximum),
        ),
    )
    fine = (
        pl.col("_f").is_finite()
        & (pl.col("_f") == pl.col("_f").round(0))
        & pl.col("_f").is_between(minimum, maximum)
    )  # invalid values become null, so later checks (n_correct <= n) skip reported rows
    return df.with_columns(
        pl.when(fine).then(pl.col("_f")).otherwise(None).cast(pl.Int64).alias(alias)
    ).drop("_f")


def report_duplicates(
    df: pl.DataFrame, sources: Sequence[Source], key: Sequence[str], problems: Problems, what: str
) -> None:
    """Report every row whose ``key`` repeats an earlier row (naming the first one); the
    rows are joined only when :func:`may_repeat` finds a repeat."""
    if not may_repeat(df, key):
        return
    df = df.with_row_index("_order")
    first = df.group_by(list(key)).agg(
        pl.col("_order").min().alias("_first"), pl.len().alias("_count")
    )
    dup = (
        df.join(first.filter(pl.col("_count") > 1), on=list(key))
        .filter(pl.col("_order") != pl.col("_first"))
        .join(
            df.select(
                pl.col("_order").alias("_first"),
                pl.col(FILE_INDEX).alias("_ffile"),
                pl.col(LOC).alias("_floc"),
            ),
            on="_first",
        )
        .sort("_order")
    )
    for row in dup.head(MAX_LISTED).iter_rows(named=True):
        label = ", ".join(f"{k}={row[k]!r}" for k in key)
        first_src = sources[row["_ffile"]]
        problems.add(
            sources[row[FILE_INDEX]].where(row[LOC]),
            f"duplicate {what} ({label}), first at {first_src.where(row['_floc'])}",
        )
    problems.total += max(0, dup.height - MAX_LISTED)


def prompts_from(df: pl.DataFrame, problem_col: str, answer_col: str) -> pl.DataFrame | None:
    """The prompts table when the source has problem text (answer '' when it has none)."""
    if problem_col not in df.columns:
        return None
    cols = [
        pl.col("prompt_id"),
        pl.col(problem_col).cast(pl.String).fill_null("").alias("problem"),
        (pl.col(answer_col).cast(pl.String) if answer_col in df.columns else pl.lit(""))
        .fill_null("")
        .alias("answer"),
    ]
    cols += [
        pl.col(c)
        for c in OPTIONAL_PROMPT_COLUMNS
        if c in df.columns and c not in ("problem", "answer")
    ]
    return conform_prompts(
        df.select(cols).unique("prompt_id", keep="first", maintain_order=True), "prompts"
    )


def _shown_text(value: object) -> str:
    text = "" if value is None else str(value)
    return repr(text if len(text) <= 60 else text[:57] + "...")


def one_problem_per_id(
    table: pl.DataFrame,
    columns: tuple[str, str | None, str | None],
    sources: Sequence[Source],
) -> None:
    """An imported prompt is its content: rows of one ``prompt_id`` (several files of one
    task, one file per seed) are one prompt only where their problem and gold answer agree
    (nulls alike), and their ids are of one kind (7 and "7" are one id only as one kind);
    else an InputError naming both places. ``columns``: the id's, the problem's and the
    answer's columns of ``table``. ``import lm-eval samples_gsm8k.jsonl
    samples_math.jsonl`` put each gsm8k sample and the MATH sample of the same doc id under
    one prompt, keeping the gsm8k text, exit 0."""
    id_col, problem_col, answer_col = columns
    cols = [c for c in (problem_col, answer_col) if c is not None and c in table.columns]
    kind = kind_column(id_col) if kind_column(id_col) in table.columns else None
    if not cols and kind is None:
        return
    keys = [pl.col(c).cast(pl.String).alias(f"_content{i}") for i, c in enumerate(cols)]
    keys += [pl.col(kind).alias("_kind")] if kind is not None else []
    rows = table.select("prompt_id", FILE_INDEX, LOC, *keys)
    content = [c for c in rows.columns if c.startswith("_content") or c == "_kind"]
    distinct = rows.unique(["prompt_id", *content], keep="first", maintain_order=True)
    twice = distinct.filter(pl.len().over("prompt_id") > 1)
    if twice.height == 0:
        return
    first, second = (
        twice.filter(pl.col("prompt_id") == twice["prompt_id"][0]).head(2).rows(named=True)
    )
    at = [sources[r[FILE_INDEX]].where(r[LOC]) for r in (first, second)]
    if kind is not None and first["_kind"] != second["_kind"]:
        what = f"an {first['_kind']} id at {at[0]} and a {second['_kind']} id at {at[1]}"
    else:
        shown = [
            " with answer ".join(_shown_text(r[f"_content{i}"]) for i in range(len(cols)))
            for r in (first, second)
        ]
        what = f"{shown[0]} at {at[0]} and {shown[1]} at {at[1]}"
    raise InputError(
        f"prompt id {first['prompt_id']!r} names two problems: {what}; one id is one problem "
        "(its problem and answer): give each file's ids a prefix of their own (--id-format "
        "gsm8k_{}), or import the files separately"
    )

"""``eval-jsonl``: one JSON line per problem with a list of per-sample scores (booleans or
0/1), as the Qwen2.5-Math / simpleRL / limit-of-RLVR evaluators write (``idx``, ``score``,
responses in ``code``)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.importers.checks import (
    add_prompt_ids,
    one_problem_per_id,
    prompts_from,
    report_duplicates,
)
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    FILE_INDEX,
    LOC,
    Imported,
    Problems,
    Source,
    check_exists,
    describe_source,
    diagnose_jsonl,
    finite_number,
    json_id_kinds,
    kind_column,
    nonblank_lines,
    python_id_kind,
    report_repeated_fields,
    sources_label,
    stack_sources,
)


def _read_eval_jsonl(
    path: Path, fields: Mapping[str, pl.DataType], id_col: str, problems: Problems
) -> pl.DataFrame:
    """The wanted fields of an evaluator's JSONL, scores as List(Float64), plus ``_loc`` and
    the id's :func:`kind_column` (what each line's id is, :func:`json_id_kinds`)."""
    check_exists(path)
    data, numbers = nonblank_lines(path)
    if not numbers.size:
        raise InputError(f"{path}: the file is empty")
    score = next(iter(k for k, v in fields.items() if v == pl.List(pl.Float64)))
    for score_type in (pl.List(pl.Boolean), pl.List(pl.Float64)):  # the fast paths
        schema = {**fields, score: score_type}
        try:
            df = pl.read_ndjson(io.BytesIO(data), schema=schema)
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
            continue
        kinds = json_id_kinds(data, id_col)
        if (kinds == "other").any() or not _texts_as_written(df, data, fields, id_col):
            break  # polars shows 7.0 or true as text: read as written
        report_repeated_fields(path, data, numbers, fields, problems)
        problems.raise_if_any(str(path))
        return df.with_columns(
            pl.col(score).cast(pl.List(pl.Float64)), pl.Series(LOC, numbers), kinds
        )
    # Mixed or malformed lines or odd ids or texts: parse line by line, report what is
    # wrong, else build by rows.
    rows = diagnose_jsonl(path, numbers, data, problems, fields)
    columns: dict[str, list[Any]] = {k: [] for k in fields}
    for lineno, row in zip(numbers.tolist(), rows, strict=True):
        for name, dtype in fields.items():
            where = f"{path}:{lineno}"
            value = (row or {}).get(name)
            if name == score:
                value = _scores(value, name, where, problems)
            elif isinstance(dtype, pl.List):
                value = _texts(value, name, where, problems)
            elif value is not None and name != id_col:
                value = _text_or_digits(value, name, where, problems)
            elif value is not None:  # the id: its kind is checked by add_prompt_ids
                value = value if isinstance(value, str) else json.dumps(value)
            columns[name].append(value)
    problems.raise_if_any(str(path))
    id_kinds = [python_id_kind((row or {}).get(id_col)) for row in rows]
    return pl.DataFrame(columns, schema={**fields, score: pl.List(pl.Float64)}).with_columns(
        pl.Series(LOC, numbers), pl.Series(kind_column(id_col), id_kinds)
    )


def _texts_as_written(
    df: pl.DataFrame, data: bytes, fields: Mapping[str, pl.DataType], id_col: str
) -> bool:
    """Whether polars read every text field as written: it shows a JSON 0.1 or true in a
    text column (or list of texts) as "0.1" or "true". Integers are read as their digits.
    Two more passes: one keeps only JSON strings (Binary), one only integers (Int128)."""
    texts = [n for n, t in fields.items() if t in (pl.String, pl.List(pl.String)) and n != id_col]
    scalars = [n for n in texts if fields[n] == pl.String]

    def only(dtype: pl.DataType, names: list[str]) -> pl.DataFrame:
        schema = {n: pl.List(dtype) if fields[n] != pl.String else dtype for n in names}
        return pl.read_ndjson(io.BytesIO(data), schema=schema, ignore_errors=True)

    strings, integers = only(pl.Binary(), texts), only(pl.Int128(), scalars)
    for name in texts:
        if name in scalars:
            read = strings[name].is_not_null() | integers[name].is_not_null()
            if (df[name].is_not_null() & ~read).any():
                return False
        elif (strings[name].explode().is_null() != df[name].explode().is_null()).any():
            return False
    return True


def _scores(value: Any, name: str, where: str, problems: Problems) -> list[float] | None:
    if value is not None and not (
        isinstance(value, list)
        and all(isinstance(v, bool | int | float) and finite_number(v) for v in value)
    ):
        problems.add(
            where, f"{name!r} must be a list of booleans or 0/1, got {json.dumps(value)[:60]}"
        )
        return None
    return [float(v) for v in value] if value is not None else None


def _texts(value: Any, name: str, where: str, problems: Problems) -> list[str | None] | None:
    """A list of texts (responses); anything else in it is refused, never made text."""
    if value is not None and not isinstance(value, list):
        problems.add(where, f"{name!r} must be a list, got {type(value).__name__}")
        return None
    wrong = next((v for v in value or [] if not (v is None or isinstance(v, str))), None)
    if wrong is not None:
        problems.add(where, f"{name!r} holds {json.dumps(wrong)[:60]}, not text")
        return None
    return value


def _text_or_digits(value: Any, name: str, where: str, problems: Problems) -> str | None:
    """Text as it is, an integer as its digits (a gold answer 5 is common in evaluators'
    logs); a float (0.30000000000000004), boolean, list or object is refused, not made
    text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    problems.add(
        where, f"{name!r} is {json.dumps(value)[:60]}, not text or an integer: write it as text"
    )
    return None


def _check_prompt_fields(
    frames: Sequence[pl.DataFrame],
    sources: Sequence[Source],
    opt: ImportOptions,
    prompt_fields: tuple[str, str],
    problems: Problems,
) -> None:
    """A field the user named that no line has is refused (a misspelt name would go unused);
    the question and gold answer are on every line or on none (a line without them would
    write an empty problem or answer that clashes with a dataset's own)."""
    named = {
        "--problem-col": (prompt_fields[0], opt.problem_col is not None),
        "--answer-col": (prompt_fields[1], opt.answer_col is not None),
        "--response-field": (
            opt.response_field,
            opt.response_field != ImportOptions.response_field,
        ),
    }
    for option, (field, given) in named.items():
        if given and not any(f[field].is_not_null().any() for f in frames):
            raise InputError(
                f"{option} {field!r}: no line of {sources_label([s.path for s in sources])} "
                "has that field; check its spelling"
            )
    for field in prompt_fields:
        if any(f[field].is_not_null().any() for f in frames):
            for src, f in zip(sources, frames, strict=True):
                problems.add_rows(
                    src,
                    f.filter(pl.col(field).is_null()),
                    f"no {field!r}, which other lines have: give it on every line or on none",
                )


def import_eval_jsonl(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = Problems()
    id_col = opt.id_col or "idx"
    problem_col, answer_col = opt.problem_col or "question", opt.answer_col or "gt"
    fields: dict[str, pl.DataType] = {
        id_col: pl.String(),
        opt.score_field: pl.List(pl.Float64),
        opt.response_field: pl.List(pl.String),
        problem_col: pl.String(),
        answer_col: pl.String(),
    }
    frames, sources = [], []
    for path in paths:
        src = Source(path, "line")
        df = _read_eval_jsonl(path, fields, id_col, problems)
        df = add_prompt_ids(df, src, id_col, opt.id_format, problems)
        scores = pl.col(opt.score_field)
        problems.add_rows(src, df.filter(scores.is_null()), f"no {opt.score_field!r} list")
        problems.add_rows(src, df.filter(scores.list.len() == 0), f"empty {opt.score_field!r} list")
        not_binary = df.filter(
            scores.list.eval((pl.element() != 0) & (pl.element() != 1)).list.any().fill_null(False)
            | scores.list.eval(pl.element().is_null() | pl.element().is_nan())
            .list.any()
            .fill_null(False)
        )
        problems.add_rows(
            src,
            not_binary,
            pl.format(
                "{} has values other than true/false/0/1: {}",
                pl.lit(repr(opt.score_field)),
                scores.cast(pl.List(pl.String)).list.join(",").str.slice(0, 60),
            ),
        )
        resp = pl.col(opt.response_field)
        mismatch = df.filter(resp.is_not_null() & (resp.list.len() != scores.list.len()))
        problems.add_rows(
            src,
            mismatch,
            pl.format("{} responses but {} scores", resp.list.len(), scores.list.len()),
        )
        frames.append(df)
        sources.append(src)
    _check_prompt_fields(frames, sources, opt, (problem_col, answer_col), problems)
    table = stack_sources(frames)
    # The same problem in several files is more samples of it (e.g. one file per seed);
    # within one file a repeated id is an error.
    report_duplicates(table, sources, ["prompt_id", FILE_INDEX], problems, "problem id in one file")
    problems.raise_if_any(sources_label(paths))
    one_problem_per_id(table, (id_col, problem_col, answer_col), sources)  # not by id alone
    table = table.sort(FILE_INDEX, LOC)
    has_resp = table[opt.response_field].is_not_null().any()
    # a line without responses, beside lines with them: its samples' responses are null
    no_responses = pl.col(opt.score_field).list.eval(pl.lit(None, pl.String))
    responses = pl.col(opt.response_field).fill_null(no_responses)
    long = (
        table.select(
            "prompt_id",
            FILE_INDEX,
            pl.col(opt.score_field).alias("reward"),
            *([responses.alias("response")] if has_resp else []),
        )
        .explode(["reward", *(["response"] if has_resp else [])])
        .with_columns(
            pl.int_range(pl.len()).over("prompt_id").cast(pl.Int32).alias("sample_idx"),
            pl.lit(policy).alias("policy"),
        )
        .select("prompt_id", "policy", "sample_idx", "reward", *(["response"] if has_resp else []))
    )
    # no line with a question: no prompts (not empty ones, which would clash with a
    # dataset's own answers or stand in for its problems)
    has_problems = table[problem_col].is_not_null().any()
    prompts = prompts_from(table, problem_col, answer_col) if has_problems else None
    return Imported(
        "eval-jsonl",
        long,
        [policy],
        prompts,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {"fields": {"id": id_col, "score": opt.score_field, "response": opt.response_field}},
    )

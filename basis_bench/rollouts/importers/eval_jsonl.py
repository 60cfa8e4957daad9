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
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    FILE_INDEX,
    ID_KIND,
    LOC,
    Imported,
    Problems,
    Source,
    add_prompt_ids,
    check_exists,
    describe_source,
    diagnose_jsonl,
    json_id_kinds,
    nonblank_lines,
    prompts_from,
    python_id_kind,
    report_duplicates,
    report_repeated_fields,
    sources_label,
    stack_sources,
)


def _read_eval_jsonl(
    path: Path, fields: Mapping[str, pl.DataType], id_col: str, problems: Problems
) -> pl.DataFrame:
    """The wanted fields of an evaluator's JSONL, scores as List(Float64), plus ``_loc`` and
    ``_id_kind`` (what each line's id is, :func:`json_id_kinds`)."""
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
        if (kinds == "other").any():  # polars shows 7.0 or true as text: read as written
            break
        report_repeated_fields(path, data, numbers, fields, problems)
        problems.raise_if_any(str(path))
        return df.with_columns(
            pl.col(score).cast(pl.List(pl.Float64)), pl.Series(LOC, numbers), kinds
        )
    # Mixed or malformed lines or odd ids: parse line by line, report what is wrong, else
    # build by rows.
    rows = diagnose_jsonl(path, numbers, data, problems, fields)
    columns: dict[str, list[Any]] = {k: [] for k in fields}
    for lineno, row in zip(numbers.tolist(), rows, strict=True):
        row = row or {}
        for name, dtype in fields.items():
            value = row.get(name)
            if name == score:
                if value is not None and not (
                    isinstance(value, list)
                    and all(isinstance(v, bool | int | float) for v in value)
                ):
                    problems.add(
                        f"{path}:{lineno}",
                        f"{score!r} must be a list of booleans or 0/1, got {json.dumps(value)[:60]}",
                    )
                    value = None
                value = [float(v) for v in value] if value is not None else None
            elif isinstance(dtype, pl.List):
                if value is not None and not isinstance(value, list):
                    problems.add(
                        f"{path}:{lineno}", f"{name!r} must be a list, got {type(value).__name__}"
                    )
                    value = None
                value = (
                    [None if v is None else str(v) for v in value] if value is not None else None
                )
            elif value is not None:
                value = value if isinstance(value, str) else json.dumps(value)
            columns[name].append(value)
    problems.raise_if_any(str(path))
    id_kinds = [python_id_kind((row or {}).get(id_col)) for row in rows]
    return pl.DataFrame(columns, schema={**fields, score: pl.List(pl.Float64)}).with_columns(
        pl.Series(LOC, numbers), pl.Series(ID_KIND, id_kinds)
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
    table = stack_sources(frames)
    # The same problem in several files is more samples of it (e.g. one file per seed);
    # within one file a repeated id is an error.
    report_duplicates(table, sources, ["prompt_id", FILE_INDEX], problems, "problem id in one file")
    problems.raise_if_any(sources_label(paths))
    table = table.sort(FILE_INDEX, LOC)
    has_resp = table[opt.response_field].is_not_null().any()
    long = (
        table.select(
            "prompt_id",
            FILE_INDEX,
            pl.col(opt.score_field).alias("reward"),
            *([pl.col(opt.response_field).alias("response")] if has_resp else []),
        )
        .explode(["reward", *(["response"] if has_resp else [])])
        .with_columns(
            pl.int_range(pl.len()).over("prompt_id").cast(pl.Int32).alias("sample_idx"),
            pl.lit(policy).alias("policy"),
        )
        .select("prompt_id", "policy", "sample_idx", "reward", *(["response"] if has_resp else []))
    )
    prompts = prompts_from(table, problem_col, answer_col)
    return Imported(
        "eval-jsonl",
        long,
        [policy],
        prompts,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {"fields": {"id": id_col, "score": opt.score_field, "response": opt.response_field}},
    )

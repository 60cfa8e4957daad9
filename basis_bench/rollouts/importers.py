"""Importers: rollouts researchers already have, turned into a rollouts dataset.

Four source formats (docs/schema.md has an example of each):

* ``counts``: a table of ``prompt_id, n, n_correct [, problem, answer]``; each count becomes
  ``n`` binary rewards, ``n_correct`` of them 1, in a seeded uniformly random order (the
  metadata says ``order: synthetic``). Samples are i.i.d. given the prompt, so a random order
  given the count has exactly the law of the real sequence.
* ``eval-jsonl``: one JSON line per problem with a list of per-sample scores (booleans or
  0/1), as the Qwen2.5-Math / simpleRL / limit-of-RLVR evaluators write (``idx``, ``score``,
  responses in ``code``).
* ``acc-history``: ``{example id: [mean reward at visit 0, at visit 1, ...]}`` as verl-based
  GRPO trainers write; with ``G`` rollouts per visit each mean must be a multiple of 1/G and
  visit ``k`` becomes its own policy ``<policy>-<k:03d>``, expanded like ``counts``.
* ``long``: a table already in long form (prompt_id, [policy,] sample_idx, reward).

Every check reports each offending row with its file and line (CSV, JSONL) or row (Parquet)
number. Parsing and expansion are polars/numpy column operations; a Python loop over lines
runs only to pinpoint malformed JSON lines (the error path) or to read JSONL whose lines mix
value types that polars' reader refuses.

:func:`write_import` publishes the result as oracle does (``DIR/rollouts/<policy>/
part-000000.parquet``, metadata under ``basis_bench``, ``DIR/prompts.parquet`` merged):
every part is first written completely under a staged non-Parquet name, and only when all of
them are written are they renamed into place, so an interrupted import leaves no ``.parquet``
file of its own behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench import __version__
from basis_bench.errors import InputError
from basis_bench.outputs import (
    REPLACED_SUFFIX,
    claim_output_dir,
    holds_output_locks,
    provenance,
    publishing,
    write_parquet_atomic,
)
from basis_bench.rollouts.store import (
    check_policy_name,
    conform_prompts,
    conform_rollouts,
    file_policies,
    part_path,
    rollout_files,
    write_prompts_table,
)
from basis_bench.schema import OPTIONAL_PROMPT_COLUMNS, OPTIONAL_ROLLOUT_COLUMNS, PROMPTS_FILE

FORMATS = ("counts", "eval-jsonl", "acc-history", "long")
MAX_LISTED = 50  # malformed rows listed in one error message (the total is always given)
_LOC = "_loc"  # source line/row number column
_FILE = "_file"  # index of the source file column


@dataclass(frozen=True)
class ImportOptions:
    """Column and field names of the sources, and the expansion settings."""

    id_col: str | None = None  # default per format: prompt_id (tables), idx (eval-jsonl)
    n_col: str = "n"
    correct_col: str = "n_correct"
    problem_col: str | None = None  # default: problem (tables), question (eval-jsonl)
    answer_col: str | None = None  # default: answer (tables), gt (eval-jsonl)
    score_field: str = "score"
    response_field: str = "code"
    policy_col: str = "policy"
    sample_col: str = "sample_idx"
    reward_col: str = "reward"
    rollouts_per_visit: int | None = None
    id_format: str | None = None
    seed: int = 0


@dataclass
class Imported:
    """What one import produces: rows of one or more policies, and prompts when known."""

    format: str
    rollouts: pl.DataFrame
    policies: list[str]
    prompts: pl.DataFrame | None
    sources: list[dict[str, Any]]
    order: str  # "synthetic" (expanded from counts or means) or "source"
    details: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- error reporting


class _Problems:
    """Collects malformed rows; :meth:`raise_if_any` reports them all in one InputError."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.total = 0

    def add(self, where: str, message: str) -> None:
        self.total += 1
        if len(self.items) < MAX_LISTED:
            self.items.append(f"{where}: {message}")

    def add_rows(
        self, src: _Source, bad: pl.DataFrame, message: pl.Expr | str, *, extra: str = ""
    ) -> None:
        """Add one problem per row of ``bad`` (which carries the ``_loc`` column)."""
        if bad.height == 0:
            return
        texts = (
            bad.select(message.alias("m"))["m"].to_list()
            if isinstance(message, pl.Expr)
            else [message] * bad.height
        )
        for loc, text in zip(bad[_LOC].to_list()[:MAX_LISTED], texts[:MAX_LISTED], strict=False):
            self.add(src.where(loc), text + extra)
        self.total += max(0, bad.height - MAX_LISTED)

    def raise_if_any(self, what: str) -> None:
        if not self.total:
            return
        shown = "\n  ".join(self.items)
        more = (
            f"\n  ... and {self.total - len(self.items)} more"
            if self.total > len(self.items)
            else ""
        )
        raise InputError(f"{what}: {self.total} malformed row(s):\n  {shown}{more}")


@dataclass(frozen=True)
class _Source:
    path: Path
    unit: str  # "line" (text files), "row" (Parquet) or "id" (a JSON map's keys)

    def where(self, loc: object) -> str:
        if self.unit == "line":
            return f"{self.path}:{loc}"
        if self.unit == "id":
            return f"{self.path}: id {loc!r}"
        return f"{self.path}: row {loc}"


def _describe(path: Path, rows: int) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path.resolve()), "sha256": digest.hexdigest(), "rows": rows}


# ---------------------------------------------------------------- reading sources


def _check_exists(path: Path) -> None:
    if not path.is_file():
        raise InputError(f"source {str(path)!r} does not exist or is not a file")


def _nonblank_lines(path: Path) -> tuple[bytes, np.ndarray]:
    """The file's non-blank lines joined by newlines, and their 1-based line numbers."""
    raw = path.read_bytes()
    lines = pl.Series("l", raw.decode("utf-8", errors="replace").split("\n"))
    keep = lines.str.strip_chars().str.len_bytes() > 0
    numbers = (keep.arg_true() + 1).to_numpy()
    return "\n".join(lines.filter(keep).to_list()).encode(), numbers


def _diagnose_jsonl(path: Path, numbers: np.ndarray, data: bytes, problems: _Problems) -> list[Any]:
    """Error path: parse line by line to say which lines are malformed."""
    rows: list[Any] = []
    for lineno, line in zip(numbers.tolist(), data.split(b"\n"), strict=True):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.add(f"{path}:{lineno}", f"malformed JSON ({err.msg})")
            rows.append(None)
            continue
        if not isinstance(row, dict):
            problems.add(f"{path}:{lineno}", f"expected a JSON object, got {type(row).__name__}")
            rows.append(None)
            continue
        rows.append(row)
    return rows


def read_table(path: Path) -> tuple[pl.DataFrame, _Source]:
    """A CSV/TSV, Parquet or JSONL table with a ``_loc`` column (line or row number).

    CSV values are read as text (the checks cast them, so ``3.5`` or ``abc`` in a count is
    reported, not silently coerced); JSONL and Parquet keep their types.
    """
    _check_exists(path)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        try:
            df = pl.read_csv(path, infer_schema=False, separator="\t" if suffix == ".tsv" else ",")
        except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
            raise InputError(f"{path}: not a readable CSV file ({err})") from err
        multiline = any(
            df[c].str.contains("\n").any() for c in df.columns if df.schema[c] == pl.String
        )
        if multiline:  # quoted multi-line fields: line numbers would lie, give data rows
            return df.with_row_index(_LOC, offset=1), _Source(path, "row")
        return df.with_row_index(_LOC, offset=2), _Source(path, "line")  # line 1 is the header
    if suffix == ".parquet":
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as err:
            raise InputError(f"{path}: not a readable Parquet file ({err})") from err
        return df.with_row_index(_LOC, offset=1), _Source(path, "row")
    if suffix in (".jsonl", ".ndjson", ".json"):
        data, numbers = _nonblank_lines(path)
        if not numbers.size:
            raise InputError(f"{path}: the file is empty")
        try:
            df = pl.read_ndjson(io.BytesIO(data), infer_schema_length=None)
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as err:
            problems = _Problems()
            rows = _diagnose_jsonl(path, numbers, data, problems)
            problems.raise_if_any(str(path))
            try:  # valid JSON whose lines mix types polars will not unify: build it by rows
                df = pl.DataFrame(rows, infer_schema_length=None)
            except (pl.exceptions.PolarsError, TypeError, ValueError):
                raise InputError(
                    f"{path}: lines do not share one set of field types ({err})"
                ) from err
        return df.with_columns(pl.Series(_LOC, numbers)), _Source(path, "line")
    raise InputError(
        f"{path}: unsupported table type {suffix!r}; use .csv, .tsv, .parquet or .jsonl"
    )


def _require(df: pl.DataFrame, src: _Source, columns: Mapping[str, str]) -> None:
    """``columns``: option name -> column name; a missing one is an error naming the option."""
    missing = [f"{col!r} ({opt})" for opt, col in columns.items() if col not in df.columns]
    if missing:
        present = [c for c in df.columns if c != _LOC]
        raise InputError(
            f"{src.path}: missing column(s) {', '.join(missing)}; it has {present}. "
            "Name the source's columns with the options in parentheses."
        )


# ---------------------------------------------------------------- shared checks


_ID_FORMAT = re.compile(r"^(?P<pre>[^{}]*)\{(?::0(?P<width>\d+)d)?\}(?P<post>[^{}]*)$")


def _prompt_ids(
    df: pl.DataFrame, src: _Source, id_col: str, id_format: str | None, problems: _Problems
) -> pl.DataFrame:
    """Add ``prompt_id`` (text) from ``id_col``, formatted by ``id_format`` (``{}`` or
    ``{:0Nd}`` inside fixed text, e.g. ``math500_{:03d}``); empty ids are reported."""
    raw = pl.col(id_col).cast(pl.String).str.strip_chars()
    df = df.with_columns(raw.alias("prompt_id"))
    problems.add_rows(
        src,
        df.filter(pl.col("prompt_id").is_null() | (pl.col("prompt_id") == "")),
        f"empty {id_col!r}",
    )
    if id_format is None:
        return df
    m = _ID_FORMAT.match(id_format)
    if m is None:
        raise InputError(
            f"--id-format {id_format!r}: use fixed text around {{}} or {{:0Nd}}, e.g. math500_{{:03d}}"
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


def _integers(
    df: pl.DataFrame, src: _Source, col: str, alias: str, problems: _Problems, minimum: int
) -> pl.DataFrame:
    """Cast ``col`` to Int64 as ``alias``; non-integers and values below ``minimum`` are reported."""
    value = pl.col(col).cast(pl.Float64, strict=False) if df.schema[col] != pl.Boolean else None
    if value is None:
        problems.add_rows(src, df, f"{col!r} is a boolean, expected an integer")
        return df.with_columns(pl.lit(0, pl.Int64).alias(alias))
    df = df.with_columns(value.alias("_f"))
    bad = df.filter(
        pl.col("_f").is_null() | ~pl.col("_f").is_finite() | (pl.col("_f") != pl.col("_f").round(0))
    )
    problems.add_rows(
        src,
        bad,
        pl.format(
            "{} {} is not an integer",
            pl.lit(repr(col)),
            pl.col(col).cast(pl.String).fill_null("(empty)"),
        ),
    )
    low = df.filter(pl.col("_f").is_finite() & (pl.col("_f") < minimum))
    problems.add_rows(
        src,
        low,
        pl.format(
            "{} {} is below {}", pl.lit(repr(col)), pl.col("_f").cast(pl.Int64), pl.lit(minimum)
        ),
    )
    fine = (
        pl.col("_f").is_finite()
        & (pl.col("_f") == pl.col("_f").round(0))
        & (pl.col("_f") >= minimum)
    )  # invalid values become null, so later checks (n_correct <= n) skip reported rows
    return df.with_columns(
        pl.when(fine).then(pl.col("_f")).otherwise(None).cast(pl.Int64).alias(alias)
    ).drop("_f")


def _duplicates(
    df: pl.DataFrame, sources: Sequence[_Source], key: Sequence[str], problems: _Problems, what: str
) -> None:
    """Report every row whose ``key`` repeats an earlier row (naming the first one)."""
    if df.height == 0:
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
                pl.col(_FILE).alias("_ffile"),
                pl.col(_LOC).alias("_floc"),
            ),
            on="_first",
        )
        .sort("_order")
    )
    for row in dup.head(MAX_LISTED).iter_rows(named=True):
        label = ", ".join(f"{k}={row[k]!r}" for k in key)
        first_src = sources[row["_ffile"]]
        problems.add(
            sources[row[_FILE]].where(row[_LOC]),
            f"duplicate {what} ({label}), first at {first_src.where(row['_floc'])}",
        )
    problems.total += max(0, dup.height - MAX_LISTED)


def _stack(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(
        [f.with_columns(pl.lit(i, pl.Int32).alias(_FILE)) for i, f in enumerate(frames)],
        how="diagonal_relaxed",
    )


def policy_seed(seed: int, policy: str) -> int:
    """The order seed of one policy: distinct policies get independent orders."""
    digest = hashlib.sha256(f"{seed}\n{policy}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def expand_counts(counts: pl.DataFrame, seed: int) -> pl.DataFrame:
    """``prompt_id, policy, n, n_correct`` -> one row per sample with a binary reward.

    Within each (policy, prompt) group the ``n_correct`` ones and ``n - n_correct`` zeros
    are placed in a uniformly random order: rows are sorted by policy and prompt, each
    policy draws its own keys from ``policy_seed(seed, policy)``, and samples are ordered by
    their key within the group. Depends only on the counts and the seed, not on row order.
    """
    counts = counts.sort(["policy", "prompt_id"])
    frames = []
    for (policy,), part in counts.group_by("policy", maintain_order=True):
        n = part["n"].to_numpy().astype(np.int64)
        correct = part["n_correct"].to_numpy().astype(np.int64)
        total = int(n.sum())
        group = np.repeat(np.arange(part.height), n)
        starts = np.cumsum(n) - n
        position = np.arange(total) - np.repeat(starts, n)  # 0..n-1 within a group
        reward = (position < np.repeat(correct, n)).astype(np.float64)
        keys = np.random.default_rng(policy_seed(seed, str(policy))).random(total)
        order = np.lexsort((keys, group))
        frames.append(
            pl.DataFrame(
                {
                    "prompt_id": part["prompt_id"].gather(group),
                    "policy": pl.Series([str(policy)]).gather(np.zeros(total, dtype=np.int64)),
                    "sample_idx": position.astype(np.int32),
                    "reward": reward[order],
                }
            )
        )
    return (
        pl.concat(frames)
        if frames
        else pl.DataFrame(
            schema={
                "prompt_id": pl.String,
                "policy": pl.String,
                "sample_idx": pl.Int32,
                "reward": pl.Float64,
            }
        )
    )


def _prompts_from(df: pl.DataFrame, problem_col: str, answer_col: str) -> pl.DataFrame | None:
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


# ---------------------------------------------------------------- formats


def import_counts(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = _Problems()
    frames, sources = [], []
    id_col = opt.id_col or "prompt_id"
    for path in paths:
        df, src = read_table(path)
        _require(
            df, src, {"--id-col": id_col, "--n-col": opt.n_col, "--correct-col": opt.correct_col}
        )
        df = _prompt_ids(df, src, id_col, opt.id_format, problems)
        df = _integers(df, src, opt.n_col, "n", problems, minimum=1)
        df = _integers(df, src, opt.correct_col, "n_correct", problems, minimum=0)
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
    table = _stack(frames)
    _duplicates(table, sources, ["prompt_id"], problems, "prompt id")
    problems.raise_if_any(_what(paths))
    table = table.with_columns(pl.lit(policy).alias("policy"))
    rollouts = expand_counts(table.select("prompt_id", "policy", "n", "n_correct"), opt.seed)
    prompts = _prompts_from(table, opt.problem_col or "problem", opt.answer_col or "answer")
    return Imported(
        "counts",
        rollouts,
        [policy],
        prompts,
        [_describe(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "synthetic",
        {"order_seed": opt.seed, "policy_order_seed": {policy: policy_seed(opt.seed, policy)}},
    )


def _read_eval_jsonl(
    path: Path, fields: Mapping[str, pl.DataType], problems: _Problems
) -> pl.DataFrame:
    """The wanted fields of an evaluator's JSONL, scores as List(Float64), plus ``_loc``."""
    _check_exists(path)
    data, numbers = _nonblank_lines(path)
    if not numbers.size:
        raise InputError(f"{path}: the file is empty")
    score = next(iter(k for k, v in fields.items() if v == pl.List(pl.Float64)))
    for score_type in (pl.List(pl.Boolean), pl.List(pl.Float64)):  # the fast paths
        schema = {**fields, score: score_type}
        try:
            df = pl.read_ndjson(io.BytesIO(data), schema=schema)
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
            continue
        return df.with_columns(pl.col(score).cast(pl.List(pl.Float64)), pl.Series(_LOC, numbers))
    # Mixed or malformed lines: parse line by line, report what is wrong, else build by rows.
    rows = _diagnose_jsonl(path, numbers, data, problems)
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
    return pl.DataFrame(columns, schema={**fields, score: pl.List(pl.Float64)}).with_columns(
        pl.Series(_LOC, numbers)
    )


def import_eval_jsonl(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = _Problems()
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
        src = _Source(path, "line")
        df = _read_eval_jsonl(path, fields, problems)
        df = _prompt_ids(df, src, id_col, opt.id_format, problems)
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
    table = _stack(frames)
    # The same problem in several files is more samples of it (e.g. one file per seed);
    # within one file a repeated id is an error.
    _duplicates(table, sources, ["prompt_id", _FILE], problems, "problem id in one file")
    problems.raise_if_any(_what(paths))
    table = table.sort(_FILE, _LOC)
    has_resp = table[opt.response_field].is_not_null().any()
    long = (
        table.select(
            "prompt_id",
            _FILE,
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
    prompts = _prompts_from(table, problem_col, answer_col)
    return Imported(
        "eval-jsonl",
        long,
        [policy],
        prompts,
        [_describe(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {"fields": {"id": id_col, "score": opt.score_field, "response": opt.response_field}},
    )


def _load_history(path: Path, problems: _Problems) -> dict[str, Any]:
    _check_exists(path)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    problems.add(f"{path}: id {key!r}", "duplicate id in the JSON map")
                seen.add(key)
        return out

    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=pairs)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err})") from err
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: expected a JSON object {{id: [mean reward per visit]}}, got {type(data).__name__}"
        )
    return data


def import_acc_history(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    g = opt.rollouts_per_visit
    if g is None or g < 1:
        raise InputError(
            "acc-history needs --rollouts-per-visit G (rollouts per example per visit, >= 1)"
        )
    problems = _Problems()
    frames, sources = [], []
    for path in paths:
        src = _Source(path, "id")
        data = _load_history(path, problems)
        values = list(data.values())
        try:
            df = pl.DataFrame(
                {"_id": list(data.keys()), "acc": values},
                schema={"_id": pl.String, "acc": pl.List(pl.Float64)},
                strict=False,
            )
        except (pl.exceptions.PolarsError, TypeError, ValueError) as err:
            raise InputError(f"{path}: values must be lists of numbers ({err})") from err
        # polars would read a string value as a list of its characters: check the JSON types
        # (one isinstance per example, not per reward).
        is_list = pl.Series([isinstance(v, list) for v in values], dtype=pl.Boolean)
        df = df.with_columns(pl.col("_id").alias(_LOC), is_list.alias("_is_list"))
        problems.add_rows(
            src,
            df.filter(~pl.col("_is_list") | pl.col("acc").is_null()),
            "expected a list of mean rewards",
        )
        df = df.filter(pl.col("_is_list")).drop("_is_list")
        df = _prompt_ids(df, src, "_id", opt.id_format, problems)
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
                f"{path}: id {row[_LOC]!r} visit {row['visit']}",
                f"mean reward {row['acc']} is not a multiple of 1/{g} in [0, 1]",
            )
        problems.total += max(0, bad.height - MAX_LISTED)
        frames.append(
            long.with_columns(k.round(0).fill_nan(0).fill_null(0).cast(pl.Int64).alias("n_correct"))
        )
        sources.append(src)
    table = _stack(frames)
    _duplicates(table.filter(pl.col("visit") == 0), sources, ["prompt_id"], problems, "example id")
    problems.raise_if_any(_what(paths))
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
        [_describe(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "synthetic",
        {
            "order_seed": opt.seed,
            "rollouts_per_visit": g,
            "visit_policy": "<policy>-<k:03d>: the k-th visit of each example (not a global step)",
        },
    )


def import_long(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = _Problems()
    id_col = opt.id_col or "prompt_id"
    frames, sources = [], []
    for path in paths:
        df, src = read_table(path)
        _require(
            df,
            src,
            {"--id-col": id_col, "--sample-col": opt.sample_col, "--reward-col": opt.reward_col},
        )
        if opt.policy_col in df.columns:  # a table of several policies: take this one's rows
            df = df.filter(pl.col(opt.policy_col).cast(pl.String) == policy)
        df = _prompt_ids(df, src, id_col, opt.id_format, problems)
        df = _integers(df, src, opt.sample_col, "sample_idx", problems, minimum=0)
        reward = pl.col(opt.reward_col).cast(pl.Float64, strict=False)
        problems.add_rows(
            src,
            df.filter(reward.is_null() | ~reward.is_finite()),
            pl.format(
                "{} {} is not a finite number",
                pl.lit(repr(opt.reward_col)),
                pl.col(opt.reward_col).cast(pl.String).fill_null("(empty)"),
            ),
        )
        keep = [c for c in OPTIONAL_ROLLOUT_COLUMNS if c in df.columns and c not in (id_col,)]
        frames.append(
            df.with_columns(reward.alias("_reward")).select(
                "prompt_id", "sample_idx", "_reward", *keep, _LOC
            )
        )
        sources.append(src)
    if not any(f.height for f in frames):
        raise InputError(
            f"{_what(paths)}: no rows for policy {policy!r}"
            + (f" (the source's {opt.policy_col!r} column names others)")
        )
    table = _stack(frames)
    _duplicates(table, sources, ["prompt_id", "sample_idx"], problems, "(prompt, sample)")
    problems.raise_if_any(_what(paths))
    rollouts = table.select(
        "prompt_id",
        pl.lit(policy).alias("policy"),
        pl.col("sample_idx").cast(pl.Int32),
        pl.col("_reward").alias("reward"),
        *[c for c in OPTIONAL_ROLLOUT_COLUMNS if c in table.columns],
    )
    return Imported(
        "long",
        rollouts,
        [policy],
        None,
        [_describe(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {
            "columns": {
                "id": id_col,
                "policy": opt.policy_col,
                "sample": opt.sample_col,
                "reward": opt.reward_col,
            }
        },
    )


def _what(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths)


IMPORTERS = {
    "counts": import_counts,
    "eval-jsonl": import_eval_jsonl,
    "acc-history": import_acc_history,
    "long": import_long,
}


def import_sources(
    fmt: str, paths: Sequence[str | os.PathLike[str]], policy: str, opt: ImportOptions | None = None
) -> Imported:
    """Read and check ``paths`` in format ``fmt``; nothing is written."""
    if fmt not in IMPORTERS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not paths:
        raise InputError("give at least one source file")
    check_policy_name(policy)
    result = IMPORTERS[fmt]([Path(p) for p in paths], policy, opt or ImportOptions())
    result.rollouts = conform_rollouts(result.rollouts, what=f"{fmt} import")
    return result


# ---------------------------------------------------------------- writing


def existing_policies(out: Path) -> dict[str, list[Path]]:
    """Policy -> the rollouts files under ``out`` that hold it."""
    held: dict[str, list[Path]] = {}
    if not out.is_dir():
        return held
    for f in rollout_files(out):
        for p in file_policies(f):
            held.setdefault(p, []).append(f)
    return held


@dataclass
class WriteReport:
    files: list[Path]
    replaced: list[str]
    prompts_written: bool


def _files_to_replace(
    out: Path, policies: Sequence[str], replace: bool
) -> tuple[list[str], list[Path]]:
    """The policies of ``policies`` that ``out`` already holds, and their files to remove;
    refused without ``replace``, and for a file shared with other policies."""
    held = existing_policies(out)
    clash = [p for p in policies if p in held]
    if clash and not replace:
        raise InputError(
            f"{out} already holds policy {', '.join(map(repr, clash))}; "
            "pass --replace to overwrite it, or choose another --policy"
        )
    to_remove: list[Path] = []
    for p in clash:
        for f in held[p]:
            others = [q for q in file_policies(f) if q not in policies]
            if others:
                raise InputError(
                    f"{f} holds policy {p!r} together with {', '.join(map(repr, others))}; "
                    "--replace only removes files of the replaced policies alone: remove it by hand"
                )
            to_remove.append(f)
    return clash, to_remove


def _import_metadata(result: Imported, label: str | None, reference: bool) -> dict[str, Any]:
    """The ``basis_bench`` metadata every part of an import carries."""
    base: dict[str, Any] = {
        "kind": "import",
        "format": result.format,
        "simulated": False,
        "order": result.order,
        "policies": list(result.policies),
        "sources": result.sources,
        "package_version": __version__,
        "provenance": provenance(),
        **result.details,
    }
    if result.order == "synthetic":
        base["order_note"] = (
            "rewards expanded from counts: within a (prompt, policy) group the order is a seeded "
            "random permutation, not the generation order; samples are exchangeable given the "
            "prompt, so subsampling benchmarks are statistically faithful"
        )
    if label is not None:
        base["label"] = label
    if reference:
        if len(result.policies) != 1:
            raise InputError("--reference marks one policy; this import writes several")
        base["reference_policy"] = result.policies[0]
    return base


def _publish(
    result: Imported,
    out: Path,
    base: dict[str, Any],
    table: pl.DataFrame | None,
    to_remove: list[Path],
) -> list[Path]:
    """Stage every part, then, under the dataset's publish lock, set the replaced files
    aside and rename the new ones into place: all or nothing. Any error or interruption
    puts the old files and the old prompts table back and leaves no staged file."""
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    staged: list[tuple[Path, Path]] = []
    aside: list[tuple[Path, Path]] = []
    published: list[Path] = []
    try:
        for (name,), rows in result.rollouts.group_by("policy", maintain_order=True):
            final = part_path(out, str(name), 0)
            stage = final.parent / f".{final.name}.{tag}.staged"
            rows = rows.sort("prompt_id", "sample_idx")
            write_parquet_atomic(rows, stage, {**base, "policy": str(name)})
            staged.append((stage, final))
        with publishing(out):
            prompts = out / PROMPTS_FILE
            if table is not None and prompts.exists():
                aside.append((prompts, _set_aside(prompts, tag, copy=True)))
            if table is not None:
                write_prompts_table(table, out, base)
            for f in to_remove:
                aside.append((f, _set_aside(f, tag)))
            for stage, final in staged:
                os.replace(stage, final)
                published.append(final)
    except BaseException:
        for path in published:
            path.unlink(missing_ok=True)
        for original, kept in reversed(aside):
            os.replace(kept, original)
        raise
    finally:
        for stage, _ in staged:
            stage.unlink(missing_ok=True)
    for _, kept in aside:
        kept.unlink(missing_ok=True)
    return published


def _set_aside(path: Path, tag: str, copy: bool = False) -> Path:
    """Move (or copy, for a file rewritten in place) ``path`` to a hidden name that no
    reader takes for rollouts, to be put back if the publish fails."""
    kept = path.parent / f".{path.name}.{tag}{REPLACED_SUFFIX}"
    if copy:
        shutil.copy2(path, kept)
    else:
        os.replace(path, kept)
    return kept


@holds_output_locks
def write_import(
    result: Imported,
    out: str | os.PathLike[str],
    *,
    replace: bool = False,
    reference: bool = False,
    label: str | None = None,
    prompts: pl.DataFrame | None = None,
    force: bool = False,
) -> WriteReport:
    """Publish ``result`` into the dataset ``out`` (created), policy by policy.

    An ``out`` that already holds one of the policies is refused unless ``replace``; with
    ``replace`` the old files of those policies are removed (a file that also holds other
    policies is refused, never rewritten). Parts are staged under non-Parquet names and
    renamed into place only after all of them are complete. ``out`` must be new, empty or
    a dataset of real rollouts (:func:`~basis_bench.rollouts.store.claim_output_dir`;
    ``force`` writes anyway).
    """
    out = claim_output_dir(out, "rollouts", simulated=False, force=force)
    clash, to_remove = _files_to_replace(out, result.policies, replace)
    table = prompts if prompts is not None else result.prompts
    if prompts is not None and result.prompts is not None:  # sources' texts fill the gaps
        table = pl.concat(
            [
                prompts,
                result.prompts.filter(~pl.col("prompt_id").is_in(prompts["prompt_id"].implode())),
            ],
            how="diagonal_relaxed",
        )
    base = _import_metadata(result, label, reference)
    published = _publish(result, out, base, table, to_remove)
    return WriteReport(published, clash, table is not None)

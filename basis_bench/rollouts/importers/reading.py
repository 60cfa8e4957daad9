"""Reading import sources: the error collector that reports every malformed row with its
file and line, and the table reader (CSV/TSV, Parquet, JSONL), with what JSON lines need
(line-by-line diagnosis, repeated fields, what each id is). The checks of the values read
are :mod:`basis_bench.rollouts.importers.checks`.

Every check reports each offending row with its file and line (CSV, JSONL) or row (Parquet)
number. Parsing is polars column operations; a Python loop over lines runs only to pinpoint
malformed JSON lines (the error path) or to read JSONL whose lines mix value types that
polars' reader refuses.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import regular_file
from basis_bench.guards.provenance import file_sha256
from basis_bench.rollouts.store import check_read_fits

MAX_LISTED = 50  # malformed rows listed in one error message (the total is always given)
LOC = "_loc"  # source line/row number column
FILE_INDEX = "_file"  # index of the source file column


def kind_column(column: str) -> str:
    """The column that says what each JSON line's ``column`` is: "text", "integer" or
    "other" (:func:`json_id_kinds`; read_table's ``id_col`` and ``text_cols``)."""
    return f"_kind:{column}"


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


class Problems:
    """Collects malformed rows; :meth:`raise_if_any` reports them all in one InputError."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.total = 0

    def add(self, where: str, message: str) -> None:
        self.total += 1
        if len(self.items) < MAX_LISTED:
            self.items.append(f"{where}: {message}")

    def add_rows(
        self, src: Source, bad: pl.DataFrame, message: pl.Expr | str, *, extra: str = ""
    ) -> None:
        """Add one problem per row of ``bad`` (which carries the ``_loc`` column)."""
        if bad.height == 0:
            return
        texts = (
            bad.select(message.alias("m"))["m"].to_list()
            if isinstance(message, pl.Expr)
            else [message] * bad.height
        )
        for loc, text in zip(bad[LOC].to_list()[:MAX_LISTED], texts[:MAX_LISTED], strict=False):
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
class Source:
    path: Path
    unit: str  # "line" (text files), "row" (Parquet) or "id" (a JSON map's keys)

    def where(self, loc: object) -> str:
        if self.unit == "line":
            return f"{self.path}:{loc}"
        if self.unit == "id":
            return f"{self.path}: id {loc!r}"
        return f"{self.path}: row {loc}"


def describe_source(path: Path, rows: int) -> dict[str, Any]:
    return {"path": str(path.resolve()), "sha256": file_sha256(path), "rows": rows}


# ---------------------------------------------------------------- reading sources


def check_exists(path: Path) -> None:
    if not regular_file(path).is_file():
        raise InputError(f"source {str(path)!r} does not exist or is not a file")


def utf8_text(path: Path) -> str:
    """The file as UTF-8 text; other bytes are refused naming the line (replacing them
    would let two distinct ids collide)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"{path}:{line}: not UTF-8 text (byte {raw[err.start]:#04x}); save the file as UTF-8"
        ) from err


def nonblank_lines(path: Path) -> tuple[bytes, np.ndarray]:
    """The file's non-blank lines joined by newlines, and their 1-based line numbers."""
    lines = pl.Series("l", utf8_text(path).split("\n"))
    keep = lines.str.strip_chars().str.len_bytes() > 0
    numbers = (keep.arg_true() + 1).to_numpy()
    return "\n".join(lines.filter(keep).to_list()).encode(), numbers


class _JsonObject(dict[str, Any]):
    """A parsed JSON object that remembers the keys it held more than once."""

    repeated: tuple[str, ...] = ()


def _json_object(pairs: list[tuple[str, Any]]) -> _JsonObject:
    obj = _JsonObject(pairs)
    if len(obj) < len(pairs):
        keys = [key for key, _ in pairs]
        obj.repeated = tuple(dict.fromkeys(k for i, k in enumerate(keys) if k in keys[:i]))
    return obj


def diagnose_jsonl(
    path: Path,
    numbers: np.ndarray,
    data: bytes,
    problems: Problems,
    fields: Collection[str] | None = None,
) -> list[Any]:
    """Error path: parse line by line to say which lines are malformed, and which repeat
    one of ``fields`` (every field when None) in one object."""
    rows: list[Any] = []
    for lineno, line in zip(numbers.tolist(), data.split(b"\n"), strict=True):
        try:
            row = bounded_json.loads(line, object_pairs_hook=_json_object)
        except json.JSONDecodeError as err:
            problems.add(f"{path}:{lineno}", f"malformed JSON ({err.msg})")
            rows.append(None)
            continue
        if not isinstance(row, _JsonObject):  # every object is one (object_pairs_hook)
            problems.add(f"{path}:{lineno}", f"expected a JSON object, got {type(row).__name__}")
            rows.append(None)
            continue
        for key in row.repeated:
            if fields is None or key in fields:
                problems.add(
                    f"{path}:{lineno}",
                    f"field {key!r} appears twice in the line (polars reads the first, "
                    "Python's json the last): keep one",
                )
        rows.append(row)
    return rows


def report_repeated_fields(
    path: Path, data: bytes, numbers: np.ndarray, fields: Collection[str], problems: Problems
) -> None:
    """Report lines that name one of ``fields`` twice (polars' reader silently keeps the
    first). Only lines where the field's JSON name occurs twice, or that hold an escape
    another spelling of a name could use (``\\u``, ``\\/``), are parsed again."""
    lines = pl.Series("l", data.decode().split("\n"))
    suspect = lines.str.contains("\\u", literal=True) | lines.str.contains("\\/", literal=True)
    for name in fields:
        suspect |= lines.str.count_matches(json.dumps(name, ensure_ascii=False), literal=True) > 1
    if suspect.any():
        picked = lines.filter(suspect).to_list()
        rows = numbers[suspect.arg_true().to_numpy()]
        diagnose_jsonl(path, rows, "\n".join(picked).encode(), problems, fields)


def read_table(
    path: Path, id_col: str | None = None, text_cols: Sequence[str] = ()
) -> tuple[pl.DataFrame, Source]:
    """A CSV/TSV, Parquet or JSONL table with a ``_loc`` column (line or row number).

    CSV values are read as text (the checks cast them, so ``3.5`` or ``abc`` in a count is
    reported, not silently coerced); JSONL and Parquet keep their types. For JSONL, a
    :func:`kind_column` says what each line's ``id_col`` and each of ``text_cols`` is
    (polars shows a JSON 1 or 1.0 beside text as "1"), for :func:`~.checks.add_prompt_ids` and
    :func:`~.checks.report_not_text`.
    """
    check_exists(path)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        text = utf8_text(path).encode()
        separator = "\t" if suffix == ".tsv" else ","
        try:
            df = pl.read_csv(io.BytesIO(text), infer_schema=False, separator=separator)
        except pl.exceptions.PolarsError as err:
            raise InputError(f"{path}: not a readable CSV file ({err})") from err
        end = text.find(b"\n")  # not split: that would copy the rest of the file
        first_line = (text if end < 0 else text[:end]).decode()
        header = next(csv.reader([first_line], delimiter=separator), [])
        twice = next((name for i, name in enumerate(header) if name in header[:i]), None)
        if twice is not None:  # polars would read the first and rename the second
            raise InputError(f"{path}:1: column {twice!r} appears twice in the header")
        multiline = any(
            df[c].str.contains("\n").any() for c in df.columns if df.schema[c] == pl.String
        )
        if multiline:  # quoted multi-line fields: line numbers would lie, give data rows
            return df.with_row_index(LOC, offset=1), Source(path, "row")
        return df.with_row_index(LOC, offset=2), Source(path, "line")  # line 1 is the header
    if suffix == ".parquet":
        check_read_fits([path], str(path))
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as err:
            raise InputError(f"{path}: not a readable Parquet file ({err})") from err
        return binary_as_text(df, path).with_row_index(LOC, offset=1), Source(path, "row")
    if suffix in (".jsonl", ".ndjson", ".json"):
        return _read_jsonl(path, id_col, text_cols), Source(path, "line")
    raise InputError(
        f"{path}: unsupported table type {suffix!r}; use .csv, .tsv, .parquet or .jsonl"
    )


def _read_jsonl(path: Path, id_col: str | None, text_cols: Sequence[str]) -> pl.DataFrame:
    """JSONL for :func:`read_table`: polars' reader, or line by line where lines mix value
    types or ids are not what polars shows (``7.0`` or ``true`` read as text)."""
    data, numbers = nonblank_lines(path)
    if not numbers.size:
        raise InputError(f"{path}: the file is empty")
    kinds = []
    try:
        df = pl.read_ndjson(io.BytesIO(data), infer_schema_length=None)
        repeated = Problems()
        report_repeated_fields(path, data, numbers, df.columns, repeated)
        repeated.raise_if_any(str(path))
        if id_col in df.columns:
            kinds.append(json_id_kinds(data, str(id_col)))
        line_by_line = bool(kinds) and (kinds[0] == "other").any()
        if not line_by_line:
            kinds += [json_id_kinds(data, c) for c in text_cols if c in df.columns and c != id_col]
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
        line_by_line = True
    if line_by_line:
        problems = Problems()
        rows = diagnose_jsonl(path, numbers, data, problems)
        problems.raise_if_any(str(path))
        df = mixed_rows_frame(path, rows)
        named = [id_col] if id_col is not None else []
        kinds = [
            pl.Series(kind_column(c), [python_id_kind(row.get(c)) for row in rows])
            for c in dict.fromkeys([*named, *text_cols])  # an id column may be a text one too
        ]
    return df.with_columns(*kinds, pl.Series(LOC, numbers))


def json_id_kinds(data: bytes, id_col: str) -> pl.Series:
    """What each JSON line's ``id_col`` is: "text", "integer" or "other" (also for a
    missing id, which is reported as empty).

    Polars reads 7, 7.0, "7" and true into a text column alike, as "7", "7", "7" and
    "true", so the lines are read twice more, once keeping only JSON strings (Binary), once
    only JSON integers (Int128): two passes of 0.1 s each for a 64 MB file."""

    def only(dtype: pl.DataType) -> pl.Series:
        frame = pl.read_ndjson(io.BytesIO(data), schema={id_col: dtype}, ignore_errors=True)
        return frame[id_col].is_not_null()

    text, integer = only(pl.Binary()), only(pl.Int128())
    kind = pl.when(text).then(pl.lit("text")).when(integer).then(pl.lit("integer"))
    return pl.select(kind.otherwise(pl.lit("other")).alias(kind_column(id_col))).to_series()


def finite_number(value: float) -> bool:
    """Whether a parsed JSON number is a finite float: a 400-digit integer overflowed
    ``float()`` / ``math.isfinite`` with a traceback (lm-eval's metrics, eval-jsonl's
    scores); it is no score, and its line is refused."""
    try:
        return math.isfinite(float(value))
    except (OverflowError, TypeError, ValueError):
        return False


def python_id_kind(value: Any) -> str:
    """:func:`json_id_kinds` for one parsed JSON value."""
    if isinstance(value, str):
        return "text"
    return "integer" if isinstance(value, int) and not isinstance(value, bool) else "other"


def dtype_id_kind(dtype: pl.DataType) -> str:
    """What the ids of a typed column (Parquet, CSV) are: "text", "integer" or "other"."""
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum):
        return "text"
    return "integer" if dtype.is_integer() else "other"


def binary_as_text(df: pl.DataFrame, path: Path) -> pl.DataFrame:
    """Parquet byte-string columns as text; bytes that are not UTF-8 are refused by row."""
    for name in [c for c, t in df.schema.items() if t == pl.Binary]:
        try:
            df = df.with_columns(pl.col(name).cast(pl.String))
        except pl.exceptions.ComputeError as err:  # error path: find the row
            row = next(i for i, v in enumerate(df[name].to_list(), 1) if not _is_utf8(v))
            raise InputError(f"{path}: row {row}: column {name!r} is not UTF-8 text") from err
    return df


def _is_utf8(value: bytes | None) -> bool:
    try:
        value is None or value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def require_scalars(df: pl.DataFrame, src: Source, columns: Sequence[str]) -> None:
    """Columns read as one value per row must not hold lists or records."""
    for name in columns:
        if df.schema[name].is_nested():
            raise InputError(
                f"{src.path}: column {name!r} holds {df.schema[name]}, not one value per row"
            )


def mixed_rows_frame(path: Path, rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """Valid JSON lines whose fields mix value types polars will not unify (``true`` among
    integers): each field that mixes types is kept as its JSON text, so the checks report
    the values that are not what the column needs (polars would read ``true`` as 1)."""
    names = list(dict.fromkeys(k for row in rows for k in row))
    columns: dict[str, list[Any]] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1 and kinds != {int, float}:
            values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
        columns[name] = values
    try:
        return pl.DataFrame(columns, strict=False)
    except (pl.exceptions.PolarsError, TypeError, ValueError) as err:
        raise InputError(f"{path}: lines do not share one set of field types ({err})") from err


def require_columns(df: pl.DataFrame, src: Source, columns: Mapping[str, str]) -> None:
    """``columns``: option name -> column name; a missing one is an error naming the option."""
    missing = [f"{col!r} ({opt})" for opt, col in columns.items() if col not in df.columns]
    if missing:
        present = [c for c in df.columns if c != LOC]
        raise InputError(
            f"{src.path}: missing column(s) {', '.join(missing)}; it has {present}. "
            "Name the source's columns with the options in parentheses."
        )


def stack_sources(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(
        [f.with_columns(pl.lit(i, pl.Int32).alias(FILE_INDEX)) for i, f in enumerate(frames)],
        how="diagonal_relaxed",
    )


def sources_label(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths)

"""Rows of a JSONL, JSON (a list of objects) or Parquet file as a frame: what a prompt file and
a trainer's dataset file are read from.

Layer: below :mod:`.prompts` and :mod:`.trainer_prompts`, which turn the rows into prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import regular_file
from basis_bench.rollouts.store import check_read_fits


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSONL file; a malformed line is an InputError naming its number."""
    return bounded_json.records(path.read_bytes(), str(path), hint="; save the file as UTF-8")


def read_records(path: str | Path) -> pl.DataFrame:
    """Rows of a JSONL, JSON (a list of objects) or Parquet file.

    A malformed JSONL line is an :class:`InputError` naming its line number.
    """
    path = Path(path)
    if not regular_file(path).is_file():
        raise InputError(f"prompt file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        check_read_fits([path], str(path))
        try:
            df = pl.read_parquet(path)
        except Exception as err:
            raise InputError(f"{path}: not a readable Parquet file ({err})") from err
    elif suffix in (".jsonl", ".ndjson"):
        df = _frame(_jsonl_rows(path), path)
    elif suffix == ".json":
        try:
            data = bounded_json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise InputError(
                f"{path}: not UTF-8 text (byte offset {err.start}); save the file as UTF-8"
            ) from err
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from err
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError(f"{path}: expected a JSON list of objects")
        df = _frame(data, path)
    else:
        raise InputError(
            f"{path}: unsupported prompt file type {suffix!r}; use .jsonl, .json or .parquet"
        )
    if df.height == 0:
        raise InputError(f"{path}: the prompt file is empty")
    return df


def _frame(rows: list[dict[str, Any]], path: Path) -> pl.DataFrame:
    """JSON objects -> frame; a field whose type changes between rows is an InputError."""
    try:
        return pl.DataFrame(rows, infer_schema_length=None)
    except Exception as err:
        raise InputError(f"{path}: rows do not share one set of field types ({err})") from err

"""The rollout store: a directory of Parquet files in one documented schema.

Layout of a rollouts dataset ``DIR``::

    DIR/prompts.parquet            prompt_id, problem, answer[, level, subject]
    DIR/**/*.parquet               rollouts: prompt_id, policy, sample_idx, reward
                                   [, n_tokens, finish_reason, response, verify_status]

Every Parquet file under ``DIR`` other than ``prompts.parquet`` is a rollouts file,
so anyone's rollouts in this schema (:mod:`basis_bench.schema`) evaluate. Sampling
metadata (model, sampling parameters, dataset, seed, package version, ``simulated``)
travels as JSON in each file's key-value metadata under the key ``basis_bench``. Every
file goes through :func:`basis_bench.guards.outputs.atomic_write` (unique temporary name, fsync,
rename), so a crash never leaves a half file under a final name.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from basis_bench.errors import InputError, first_line
from basis_bench.guards.folders import regular_file, walk
from basis_bench.guards.locks import publishing
from basis_bench.guards.memory_check import READ_BYTES_PER_ROW, check_rollouts_fit
from basis_bench.guards.outputs import read_metadata, write_parquet_atomic
from basis_bench.schema import (
    OPTIONAL_PROMPT_COLUMNS,
    OPTIONAL_ROLLOUT_COLUMNS,
    PROMPT_COLUMNS,
    PROMPTS_FILE,
    ROLLOUT_COLUMNS,
)


def _conform(
    df: pl.DataFrame,
    required: Mapping[str, pl.DataType],
    optional: Mapping[str, pl.DataType],
    what: str,
    categorical: bool = False,
) -> pl.DataFrame:
    """Check required columns exist and cast known columns to their schema types
    (``categorical``: text columns held as Categorical stay so)."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"{what}: missing column(s) {missing}; required are {list(required)}")
    nested = [c for c in {**required, **optional} if c in df.columns and df.schema[c].is_nested()]
    if nested:  # a list-typed reward column was a polars cast error, a traceback
        name, wanted = nested[0], {**required, **optional}[nested[0]]
        raise InputError(f"{what}: column {name!r} holds {df.schema[name]}, not one {wanted} a row")
    casts = []
    for name, dtype in {**required, **optional}.items():
        kept = categorical and dtype == pl.String and df.schema.get(name) == pl.Categorical
        if name in df.columns and not kept:
            casts.append(pl.col(name).cast(dtype, strict=False))
    out = df.with_columns(casts)
    for name in required:
        nulls = out[name].null_count()
        if nulls:
            raise InputError(
                f"{what}: {nulls} row(s) with a null or non-{required[name]} {name!r}; "
                "every row needs all of " + ", ".join(required)
            )
    return out


def conform_rollouts(
    df: pl.DataFrame, what: str = "rollouts", categorical: bool = False
) -> pl.DataFrame:
    """Validate a rollouts frame: schema, finite rewards, unique (prompt_id, policy, sample_idx).

    ``categorical``: text columns held as Categorical stay so (an import's millions of rows
    name a few thousand prompts: 4 bytes a row instead of a string; written as text)."""
    df = _conform(df, ROLLOUT_COLUMNS, OPTIONAL_ROLLOUT_COLUMNS, what, categorical)
    bad = df.filter(~pl.col("reward").is_finite())
    if bad.height:
        row = bad.row(0, named=True)
        raise InputError(
            f"{what}: {bad.height} non-finite reward(s), e.g. prompt_id={row['prompt_id']!r} "
            f"policy={row['policy']!r} sample_idx={row['sample_idx']}"
        )
    key = ["prompt_id", "policy", "sample_idx"]
    dup = df.select(key).filter(pl.struct(key).is_duplicated()) if may_repeat(df, key) else None
    if dup is not None and dup.height:
        raise InputError(
            f"{what}: {dup.height} rows share a (prompt_id, policy, sample_idx) key, e.g. {dup.row(0)}"
        )
    return df


def may_repeat(df: pl.DataFrame, key: Sequence[str]) -> bool:
    """Whether two rows of ``df`` may share ``key``: a sort of one 64-bit hash a row,
    ``h = h * FNV_prime ^ bits(column)`` over the key's columns. Equal keys hash alike, so
    False is exact; True (a real repeat, or rarely a collision) is for the caller to settle
    by hashing whole rows, which took about 170 bytes a row at millions of rows where this
    takes 8 to 16."""
    hashed = np.zeros(df.height, np.uint64)
    for name in key:
        hashed *= np.uint64(0x100000001B3)  # FNV's prime: the order of the columns counts
        np.bitwise_xor(hashed, _key_bits(df[name]), out=hashed)  # no temporary copy
    hashed.sort()
    return bool((hashed[1:] == hashed[:-1]).any())


def _key_bits(column: pl.Series) -> np.ndarray:
    """Unsigned integers equal for equal values of ``column``: Categorical codes and
    integers without nulls as they are stored (no copy), other columns' 64-bit hashes."""
    if column.dtype == pl.Categorical:
        column = column.to_physical()
    if column.dtype.is_integer() and not column.null_count():
        values = column.to_numpy()
        if values.dtype.kind in "iu":
            return values.view(f"u{values.dtype.itemsize}")
    return column.hash(seed=0).to_numpy()


def conform_prompts(df: pl.DataFrame, what: str = "prompts") -> pl.DataFrame:
    """Validate a prompts frame: schema and unique prompt ids."""
    df = _conform(df, PROMPT_COLUMNS, OPTIONAL_PROMPT_COLUMNS, what)
    if df["prompt_id"].is_duplicated().any():
        raise InputError(f"{what}: duplicate prompt_id values")
    return df


# --------------------------------------------------------------------------- layout

ROLLOUTS_DIR = "rollouts"
_POLICY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # NAME_MAX is 255 bytes


def check_policy_name(name: str) -> str:
    """``name`` if it can name a policy's directory (1-200 letters, digits, '.', '_', '-',
    not starting with a dot or dash: the whole name, a trailing newline too), else an
    InputError."""
    if not _POLICY_NAME.fullmatch(name):
        raise InputError(
            f"--policy {name!r}: use 1-200 letters, digits, '.', '_' and '-' (it names a directory)"
        )
    return name


def part_path(out: str | os.PathLike[str], policy: str, chunk_index: int) -> Path:
    """Where the oracle and the importers write part ``chunk_index`` of ``policy``."""
    return Path(out) / ROLLOUTS_DIR / policy / f"part-{chunk_index:06d}.parquet"


def merged_prompts(prompts: pl.DataFrame, out: str | os.PathLike[str]) -> pl.DataFrame | None:
    """``DIR/prompts.parquet`` with ``prompts`` merged in (new prompts appended; a column the
    table lacks or holds nulls in filled from ``prompts``), None when that changes nothing; a
    prompt it holds with another gold answer is an :class:`InputError` (so a run can check
    before it writes anything)."""
    path = Path(out) / PROMPTS_FILE
    existing = load_prompts(out)
    if existing is None:
        return prompts
    shared = existing.join(
        prompts.select("prompt_id", "problem", "answer"), on="prompt_id", suffix="_new"
    )
    clash = shared.filter(pl.col("answer") != pl.col("answer_new"))
    if clash.height:
        row = clash.row(0, named=True)
        raise InputError(
            f"{path} already holds prompt {row['prompt_id']} with answer {row['answer']!r}, "
            f"this run has {row['answer_new']!r}; use another --out"
        )
    # a prompt is its problem too: a second import of another task's doc 0 (same answer)
    # was merged into the first's; an empty problem (a source without text) says nothing
    said = (pl.col("problem") != "") & (pl.col("problem_new") != "")
    other = shared.filter(said & (pl.col("problem") != pl.col("problem_new")))
    if other.height:
        row = other.row(0, named=True)
        raise InputError(
            f"{path} already holds prompt {row['prompt_id']} as the problem "
            f"{_short(row['problem'])}, this run has {_short(row['problem_new'])}; one id is "
            "one problem: give the new ids a prefix (--id-format), or use another --out"
        )
    new = prompts.filter(~pl.col("prompt_id").is_in(existing["prompt_id"].implode()))
    filled = _fill_columns(existing, prompts)
    if new.height == 0 and filled.equals(existing):
        return None
    return pl.concat([filled, new], how="diagonal_relaxed")


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def write_prompts_table(
    prompts: pl.DataFrame, out: str | os.PathLike[str], metadata: Mapping[str, Any]
) -> Path:
    """Merge ``prompts`` into ``DIR/prompts.parquet`` (kept as is when nothing is new): new
    prompts are appended, and a column the table lacks or holds nulls in (e.g. ``features``
    stored by a later run) is filled from ``prompts`` for the prompts already there.

    The merged table is staged under a unique non-Parquet name and renamed over the
    old one, so concurrent shards never expose a half-written or mixed file. A prompt
    already present with a different gold answer is an :class:`InputError`.
    """
    out = Path(out)
    path = out / PROMPTS_FILE
    table = merged_prompts(prompts, out)
    if table is None:
        return path
    staged = out / f".{PROMPTS_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.staged"
    write_parquet_atomic(table, staged, metadata)
    os.replace(staged, path)
    return path


def _fill_columns(existing: pl.DataFrame, prompts: pl.DataFrame) -> pl.DataFrame:
    """``existing`` with each column of ``prompts`` that it lacks or holds nulls in filled
    from ``prompts`` by prompt id (its own non-null values kept)."""
    fill = [
        c
        for c in prompts.columns
        if c != "prompt_id" and (c not in existing.columns or existing[c].null_count())
    ]
    if not fill:
        return existing
    joined = existing.join(
        prompts.select("prompt_id", *fill),
        on="prompt_id",
        how="left",
        suffix="_new",
        maintain_order="left",
    )
    had = [c for c in fill if c in existing.columns]
    return joined.with_columns(pl.coalesce(c, f"{c}_new").alias(c) for c in had).drop(
        f"{c}_new" for c in had
    )


def default_dataset() -> Path:
    """The shipped default rollouts dataset: package data (``basis_bench/data/default``), so a
    wheel install runs the main job outside a clone."""
    return Path(str(importlib_resources.files("basis_bench") / "data" / "default"))


def rollout_files(root: str | os.PathLike[str]) -> list[Path]:
    """All rollouts Parquet files under ``root``, sorted (temporary files are skipped; links
    are followed, as every command does, each real folder once; a folder that cannot be read
    is an :class:`InputError` naming it: :func:`~basis_bench.guards.folders.walk`)."""
    root = Path(root)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        what = "is a symbolic link to nothing (or a loop)" if root.is_symlink() else what
        raise InputError(
            f"rollouts directory {str(root)!r} {what}; give the dataset's folder (the one "
            "holding prompts.parquet and rollouts/)"
        )
    found = (  # folders named *.parquet too, so that readers refuse them by name
        Path(folder) / name
        for folder, dirs, files in walk(root)
        for name in (*dirs, *files)
        if name.endswith(".parquet") and name != PROMPTS_FILE
    )
    return sorted(found)


def parquet_schema(path: Path) -> pa.Schema:
    """The schema of one Parquet file of a dataset; a file that cannot be read (garbage, cut
    short, no permission) is an :class:`InputError` naming it."""
    regular_file(path)
    try:
        return pq.read_schema(path)
    except Exception as err:  # ArrowInvalid, OSError: garbage, truncated, unreadable
        raise _unreadable(path, err) from err


def _unreadable(path: Path, err: BaseException) -> InputError:
    """The one line for a Parquet file of a dataset that cannot be read."""
    return InputError(
        f"{path} is not a readable Parquet file ({first_line(err)}); restore or remove it"
    )


def check_read_fits(files: Sequence[Path | BinaryIO], what: str) -> None:
    """Refuse reading ``files`` whole where the rows their footers declare cannot fit in free
    memory: their decoded size plus READ_BYTES_PER_ROW a row, asked before a byte of data is
    read (a 3 MB part declaring 210M identical rows aborted polars with an allocation
    failure, and no Python error to catch)."""
    rows = size = 0
    for f in files:
        try:
            footer = pq.read_metadata(f)
        except Exception as err:  # ArrowInvalid, OSError: garbage, truncated, unreadable
            name = f if isinstance(f, Path) else what
            raise InputError(f"{name}: not a readable Parquet file ({err})") from err
        finally:
            if not isinstance(f, Path):
                f.seek(0)
        rows += footer.num_rows
        size += sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    per_row = READ_BYTES_PER_ROW + -(-size // max(rows, 1))
    check_rollouts_fit(rows, per_row, f"reading {what} whole", "the rows its Parquet footer "
                       "declares are too many for this machine: check the file, or read it on a larger one")  # fmt: skip


def _rollout_file_columns(path: Path) -> list[str]:
    """Column names of one rollouts file (schema only); missing required columns are an error."""
    names = parquet_schema(path).names
    missing = [c for c in ROLLOUT_COLUMNS if c not in names]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {missing}; required are {list(ROLLOUT_COLUMNS)}"
        )
    return names


def _collect(lf: pl.LazyFrame, path: Path) -> pl.DataFrame:
    """``lf.collect()`` of one rollouts file; a corrupt page (polars' ComputeError, arrow's
    OSError without an errno) is an InputError naming the file, a disk error stays one."""
    try:
        return lf.collect()
    except (OSError, pl.exceptions.ComputeError) as err:
        if isinstance(err, OSError) and err.errno:
            raise
        raise _unreadable(path, err) from err


def file_policies(path: str | os.PathLike[str]) -> list[str]:
    """The distinct policies of one rollouts file, reading only its policy column."""
    path = Path(path)
    _rollout_file_columns(path)
    seen: set[str] = set()  # a batch at a time: the column of 210M rows is never held whole
    try:
        for batch in pq.ParquetFile(path).iter_batches(1 << 16, columns=["policy"]):
            seen.update(pl.Series(batch.column(0)).cast(pl.String).drop_nulls().unique())
    except (OSError, pl.exceptions.ComputeError, pa.ArrowException) as err:
        if isinstance(err, OSError) and err.errno:
            raise
        raise _unreadable(path, err) from err
    return sorted(seen)


def load_rollouts(
    root: str | os.PathLike[str],
    policies: Iterable[str] | None = None,
    optional: Iterable[str] | None = None,
) -> pl.DataFrame:
    """Read and validate every rollouts file under ``root``, optionally only some policies.

    ``optional``: which optional columns to read beside the four required ones (None:
    every one present). Only the selected columns and policies are read, so a caller that
    needs rewards alone never loads the ``response`` texts. The result is sorted by
    (policy, prompt_id, sample_idx), so it does not depend on file names or order. Read
    under the dataset's publish lock, so an import that replaces policies is seen whole or
    not at all.
    """
    with publishing(Path(root), reading=True):
        return _load_rollouts(root, policies, optional)


def _load_rollouts(
    root: str | os.PathLike[str], policies: Iterable[str] | None, optional: Iterable[str] | None
) -> pl.DataFrame:
    files = rollout_files(root)
    if not files:
        raise InputError(f"no rollouts Parquet files under {str(root)!r}")
    extra = list(OPTIONAL_ROLLOUT_COLUMNS) if optional is None else list(optional)
    unknown = [c for c in extra if c not in OPTIONAL_ROLLOUT_COLUMNS]
    if unknown:
        raise InputError(
            f"unknown optional rollouts column(s) {unknown}; known: {list(OPTIONAL_ROLLOUT_COLUMNS)}"
        )
    wanted = list(policies) if policies is not None else None
    check_read_fits(files, str(root))
    frames = []
    for f in files:
        names = _rollout_file_columns(f)
        lf = pl.scan_parquet(f).select([*ROLLOUT_COLUMNS, *(c for c in extra if c in names)])
        if wanted is not None:  # rows without a policy reach validation, which refuses them
            policy = pl.col("policy").cast(pl.String)
            lf = lf.filter(policy.is_in(wanted) | policy.is_null())
        frames.append(_conform(_collect(lf, f), ROLLOUT_COLUMNS, OPTIONAL_ROLLOUT_COLUMNS, str(f)))
    out = pl.concat(frames, how="diagonal_relaxed")
    return conform_rollouts(out, what=str(root)).sort(["policy", "prompt_id", "sample_idx"])


def load_prompts(root: str | os.PathLike[str]) -> pl.DataFrame | None:
    """The prompts table beside the rollouts, or None when the dataset has none."""
    path = Path(root) / PROMPTS_FILE
    if not path.exists():
        return None
    # One open file: a concurrent shard may replace prompts.parquet, and a reader that
    # opened the path twice could pair the old footer with the new pages.
    try:
        with open(regular_file(path), "rb") as fh:
            check_read_fits([fh], str(path))
            table = pl.read_parquet(fh)
    except (OSError, pl.exceptions.ComputeError) as err:
        if isinstance(err, OSError) and err.errno:
            raise
        raise InputError(f"{path}: not a readable Parquet file ({err})") from err
    return conform_prompts(table, what=str(path))


def dataset_metadata(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The distinct ``basis_bench`` metadata records of a dataset's files."""
    seen: list[dict[str, Any]] = []
    for f in rollout_files(root):
        meta = read_metadata(f)
        if meta and meta not in seen:
            seen.append(meta)
    return seen


def sample_cells(
    df: pl.DataFrame, policy: str, prompt_ids: Iterable[str]
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, int]:
    """Where each row of one policy goes in its (P, S) matrix: the policy's rows (sorted), the
    row p of each (``prompt_ids[p]``; -1 for a prompt not asked for), its column (the sample's
    rank in sample_idx order within its prompt) and the width S (most samples of a prompt)."""
    ids = list(prompt_ids)
    sub = df.filter(pl.col("policy") == policy).sort(["prompt_id", "sample_idx"])
    cols = (
        sub.select(pl.col("sample_idx").rank("ordinal").over("prompt_id").cast(pl.Int64) - 1)
        .to_series()
        .to_numpy()
    )
    width = int(cols.max()) + 1 if sub.height else 0
    index = {pid: i for i, pid in enumerate(ids)}
    rows = np.fromiter(
        (index.get(p, -1) for p in sub["prompt_id"]), dtype=np.int64, count=sub.height
    )
    return sub, rows, cols, width


def reward_matrix(df: pl.DataFrame, policy: str, prompt_ids: Iterable[str]) -> np.ndarray:
    """Rewards of one policy as a (P, S) float64 array, row p for ``prompt_ids[p]``.

    Columns follow sample_idx order; rows with fewer samples are padded with NaN, the
    estimators' marker for a missing sample. A prompt with no rows is all NaN.
    """
    ids = list(prompt_ids)
    sub, rows, cols, width = sample_cells(df, policy, ids)
    out = np.full((len(ids), width), np.nan)
    keep = rows >= 0
    out[rows[keep], cols[keep]] = sub["reward"].to_numpy()[keep]
    return out

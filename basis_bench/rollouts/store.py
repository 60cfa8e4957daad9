"""The rollout store: a directory of Parquet files in one documented schema.

Layout of a rollouts dataset ``DIR``::

    DIR/prompts.parquet            prompt_id, problem, answer[, level, subject]
    DIR/**/*.parquet               rollouts: prompt_id, policy, sample_idx, reward
                                   [, n_tokens, finish_reason, response, verify_status]

Every Parquet file under ``DIR`` other than ``prompts.parquet`` is a rollouts file,
so anyone's rollouts in this schema evaluate. Sampling metadata (model, sampling
parameters, dataset, seed, package version, ``simulated``) travels as JSON in each
file's key-value metadata under the key ``basis_bench``. Every file goes through
:func:`atomic_write` (unique temporary name, fsync, rename), so a crash never leaves a
half file under a final name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import metadata as importlib_metadata
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from basis_bench.errors import InputError

METADATA_KEY = "basis_bench"
PROMPTS_FILE = "prompts.parquet"
TEMP_SUFFIX = ".tmp"
STAGED_SUFFIX = ".staged"
REPLACED_SUFFIX = ".replaced"  # a file set aside while a replace is published

ROLLOUT_COLUMNS: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "policy": pl.String(),
    "sample_idx": pl.Int32(),
    "reward": pl.Float64(),
}
OPTIONAL_ROLLOUT_COLUMNS: dict[str, pl.DataType] = {
    "n_tokens": pl.Int32(),
    "finish_reason": pl.String(),
    "response": pl.String(),
    "verify_status": pl.String(),
}
PROMPT_COLUMNS: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "problem": pl.String(),
    "answer": pl.String(),
}
OPTIONAL_PROMPT_COLUMNS: dict[str, pl.DataType] = {"level": pl.Int32(), "subject": pl.String()}


def _conform(
    df: pl.DataFrame,
    required: Mapping[str, pl.DataType],
    optional: Mapping[str, pl.DataType],
    what: str,
) -> pl.DataFrame:
    """Check required columns exist and cast known columns to their schema types."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"{what}: missing column(s) {missing}; required are {list(required)}")
    casts = []
    for name, dtype in {**required, **optional}.items():
        if name in df.columns:
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


def conform_rollouts(df: pl.DataFrame, what: str = "rollouts") -> pl.DataFrame:
    """Validate a rollouts frame: schema, finite rewards, unique (prompt_id, policy, sample_idx)."""
    df = _conform(df, ROLLOUT_COLUMNS, OPTIONAL_ROLLOUT_COLUMNS, what)
    bad = df.filter(~pl.col("reward").is_finite())
    if bad.height:
        row = bad.row(0, named=True)
        raise InputError(
            f"{what}: {bad.height} non-finite reward(s), e.g. prompt_id={row['prompt_id']!r} "
            f"policy={row['policy']!r} sample_idx={row['sample_idx']}"
        )
    key = ["prompt_id", "policy", "sample_idx"]
    dup = df.select(key).filter(pl.struct(key).is_duplicated())
    if dup.height:
        raise InputError(
            f"{what}: {dup.height} rows share a (prompt_id, policy, sample_idx) key, e.g. {dup.row(0)}"
        )
    return df


def conform_prompts(df: pl.DataFrame, what: str = "prompts") -> pl.DataFrame:
    """Validate a prompts frame: schema and unique prompt ids."""
    df = _conform(df, PROMPT_COLUMNS, OPTIONAL_PROMPT_COLUMNS, what)
    if df["prompt_id"].is_duplicated().any():
        raise InputError(f"{what}: duplicate prompt_id values")
    return df


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; on success fsync it and rename it onto
    ``path``, on error remove it.

    The temporary name is unique per writer (``tempfile``), so two writers of one path never
    share a file, and a reader sees the old complete file or the new complete file, never a
    torn one. The one writer every output of the package goes through.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _FILE_MODE)  # mkstemp's 0600 would make every output private
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_write`."""
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_parquet_atomic(
    df: pl.DataFrame, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write ``df`` to ``path`` through :func:`atomic_write` (zstd Parquet).

    ``metadata`` is stored as JSON under the ``basis_bench`` key of the file's
    key-value metadata. After a crash a ``.parquet`` file is either complete or absent.
    """
    table = df.to_arrow()
    if metadata is not None:
        kv = dict(table.schema.metadata or {})
        kv[METADATA_KEY.encode()] = json.dumps(dict(metadata), sort_keys=True, default=str).encode()
        table = table.replace_schema_metadata(kv)
    with atomic_write(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return Path(path)


# --------------------------------------------------------------------------- output folders

OUTPUT_MARKER = ".basis-bench-output.json"
LOCK_FILE = ".basis-bench.lock"  # writers' and readers' advisory locks (lock_output)
_KIND_WORDS = {
    "rollouts": "a rollouts dataset",
    "train-run": "a training run",
    "results": "a results folder",
    "figures": "a figures folder",
    "training-figures": "a training figures folder",
}
TRAINING_FIGURES = ("learning_curves.png", "beta.png", "training_summary.csv")


def _is_temporary(path: Path) -> bool:
    """A writer's temporary, staged or set-aside file (``.NAME.XXXX.tmp``, ``.staged``,
    ``.replaced``)."""
    suffixes = (TEMP_SUFFIX, STAGED_SUFFIX, REPLACED_SUFFIX)
    return path.name.startswith(".") and path.name.endswith(suffixes)


def _output_files(path: Path) -> list[Path]:
    """Every file under ``path`` but writers' temporary files (empty folders do not count)."""
    files = (f for f in path.rglob("*") if not f.is_dir() and not _is_temporary(f))
    return sorted(f for f in files if f.name != LOCK_FILE)


def read_output_marker(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of an output folder, None when it has none; an unreadable marker is an
    :class:`InputError`."""
    marker = Path(path) / OUTPUT_MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(
            f"{marker} is not a valid marker ({err}); delete it, or pass --force"
        ) from err
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise InputError(f"{marker} is not a valid marker (no kind); delete it, or pass --force")
    return data


def _parquet_role(path: Path, root: Path) -> bool | None:
    """Whether one Parquet file of a marker-less folder is simulated (True), real (False),
    or not part of a rollouts dataset at all (None: unreadable, or another schema)."""
    try:
        schema = pq.read_schema(path)
    except Exception:  # not Parquet, a folder named x.parquet, unreadable
        return None
    needed = PROMPT_COLUMNS if path == root / PROMPTS_FILE else ROLLOUT_COLUMNS
    if any(c not in schema.names for c in needed):
        return None
    raw = (schema.metadata or {}).get(METADATA_KEY.encode())
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return None
    return meta.get("simulated") is True


def recognise_output(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a folder holds: its marker; else, for folders written before markers existed,
    a description guessed from their files. None for a new or empty folder;
    ``{"kind": None, "example": FILE}`` for files that are no basis-bench output.

    Recognised without a marker: a training run (``log.jsonl`` or ``checkpoints/``), a
    results folder (``run.json`` or ``summary.csv``), a rollouts dataset (every Parquet
    file in the store's schema; simulated when every file's metadata says so, mixed
    when some do).
    """
    root = Path(path)
    if not root.is_dir():
        return None
    marker = read_output_marker(root)
    if marker is not None:
        return marker
    files = _output_files(root)
    if not files:
        return None
    names = {f.relative_to(root).as_posix() for f in files}
    if "log.jsonl" in names or (root / "checkpoints").is_dir():
        return {"kind": "train-run"}
    if names <= set(TRAINING_FIGURES):
        return {"kind": "training-figures"}
    if "run.json" in names or "summary.csv" in names:
        return {"kind": "results"}
    parquet = [f for f in files if f.suffix == ".parquet"]
    roles = {_parquet_role(f, root) for f in parquet}
    if parquet and None not in roles:
        simulated = "mixed" if len(roles) > 1 else roles.pop()
        return {"kind": "rollouts", "simulated": simulated}
    bad = next((f for f in parquet if _parquet_role(f, root) is None), files[0])
    return {"kind": None, "example": bad.relative_to(root).as_posix()}


def _describe(found: dict[str, Any]) -> str:
    kind = found.get("kind")
    if kind is None:
        return f"files that are no basis-bench output (e.g. {found.get('example')!r})"
    if kind == "rollouts" and found.get("simulated") is not None:
        data = {True: "simulated", False: "real", "mixed": "mixed real and simulated"}
        return f"a rollouts dataset of {data.get(found['simulated'], 'unknown')} rollouts"
    return _KIND_WORDS.get(kind, f"a {kind!r} output")


def claim_output_dir(
    path: str | os.PathLike[str],
    kind: str,
    *,
    simulated: bool | None = None,
    force: bool = False,
    option: str = "--out",
    shared: bool = False,
) -> Path:
    """Make ``path`` the output folder of a command of ``kind`` (``"rollouts"``,
    ``"train-run"``, ``"results"``, ``"figures"``) and return it, created.

    Allowed: a new or empty folder, or one already of ``kind`` (by its marker file
    ``.basis-bench-output.json``, or for folders written before markers existed, by its
    files, see :func:`recognise_output`). For rollouts, ``simulated`` (True for simulated
    data, False for sampled or imported data, None for either) must also match what the
    dataset holds, so simulated rollouts never land beside real ones. Anything else is an
    :class:`InputError` naming what the folder holds, unless ``force``. A file at ``path``
    is always an error. The marker is (re)written only when it changes; ``option`` names
    the setting in messages (``--out``, ``run_dir``).

    Links are followed: the folder returned is the real one, so every command writes
    through a symbolic link into its target and never replaces the link. The folder is
    locked to this process until it exits (:func:`lock_output`; ``shared`` for the
    oracle's shards, which write disjoint parts of one dataset side by side). The shipped
    dataset (installed package data) is read-only to every command.
    """
    path = _writable_folder(Path(path), option)
    if _SCOPE and not path.exists():
        _SCOPE[-1].created.append(path)
    try:
        found = recognise_output(path)
    except InputError:
        if not force:
            raise
        found = {"kind": None}
    if found is not None and not force:
        _check_claim(path, kind, simulated, found, option)
    lock_output(path, shared=shared, option=option)  # after the checks: a refusal writes nothing
    marker: dict[str, Any] = {"kind": kind}
    if kind == "rollouts":
        before = found.get("simulated") if found and found.get("kind") == kind else simulated
        marker["simulated"] = (
            before if simulated is None or before in (None, simulated) else "mixed"
        )
    if found is not None and found.get("kind") not in (kind, None):
        marker["forced_over"] = found["kind"]
    held = found if found is not None and (path / OUTPUT_MARKER).is_file() else None
    if held is None or any(held.get(k) != v for k, v in marker.items()):
        from basis_bench import __version__

        text = json.dumps({**marker, "package_version": __version__}, sort_keys=True)
        write_text_atomic(path / OUTPUT_MARKER, text + "\n")
    return path


def _writable_folder(path: Path, option: str) -> Path:
    """``path`` with links resolved, refused in one line where no command may write: a file,
    a path through a file, the installed package data."""
    real = Path(os.path.realpath(path))
    if real.exists() and not real.is_dir():
        raise InputError(f"{option} {path} is a file; give a directory")
    above = next((p for p in real.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"{option} {path}: {above} is a file, not a folder; give a directory")
    shipped = Path(os.path.realpath(default_dataset())).parent
    if real == shipped or shipped in real.parents:
        raise InputError(
            f"{option} {path} is inside the installed package data ({shipped}), which is "
            "read-only to every command; write to a folder of your own"
        )
    return real


_HELD_LOCKS: dict[Path, int] = {}  # lock file -> open descriptor, for this process's life
_WRITERS, _PUBLISH = 0, 1  # the lock file's bytes: who writes, and who swaps files in
_SCOPE: list[_Claims] = []  # what each running holds_output_locks call has claimed


@dataclasses.dataclass
class _Claims:
    locks: list[int] = dataclasses.field(default_factory=list)  # writer locks taken
    created: list[Path] = dataclasses.field(default_factory=list)  # folders made by a claim


F = TypeVar("F", bound=Callable[..., Any])


def holds_output_locks(fn: F) -> F:
    """Decorate a library entry point that claims output folders: the writer locks it takes
    are released when it returns, so one process can call it again and again, and another
    process can write there afterwards; a folder its claim created is removed again if it
    fails before writing anything there. (Outside such a call, as in the CLI, a lock is
    held until the process exits.)"""

    @functools.wraps(fn)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        _SCOPE.append(_Claims())
        failed = True
        try:
            result = fn(*args, **kwargs)
            failed = False
            return result
        finally:
            claims = _SCOPE.pop()
            if _SCOPE:
                _SCOPE[-1].locks += claims.locks
                _SCOPE[-1].created += claims.created
            else:
                for fd in claims.locks:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, _WRITERS)
                for folder in claims.created if failed else ():
                    _remove_if_unused(folder)

    return cast(F, scoped)


def _remove_if_unused(folder: Path) -> None:
    """Remove ``folder`` if it holds nothing but its marker and lock (a claim that a failed
    command made): a refused or failed run leaves no trace."""
    held = {f.name for f in folder.iterdir()} if folder.is_dir() else {"?"}
    if held <= {OUTPUT_MARKER, LOCK_FILE}:
        shutil.rmtree(folder, ignore_errors=True)


def _lock_descriptor(folder: Path) -> int | None:
    """The open lock file ``.basis-bench.lock`` in ``folder`` (None where none can be made,
    such as a read-only folder: then nothing there is written by this package either)."""
    lock = folder / LOCK_FILE
    if lock not in _HELD_LOCKS:
        try:
            _HELD_LOCKS[lock] = os.open(lock, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        except OSError:
            return None
    return _HELD_LOCKS[lock]


def lock_output(folder: Path, *, shared: bool = False, option: str = "--out") -> None:
    """Lock ``folder`` (created) for writing by this process (an advisory POSIX lock on its
    ``.basis-bench.lock``, which a killed process never leaves held). A folder another
    process writes is an :class:`InputError`; ``shared`` lets several oracle shards write
    one dataset. A results folder swapped whole at the end of a run gets a new lock file
    with it: its writer is done by then."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = _lock_descriptor(folder)
    if fd is None:
        return
    kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB, 1, _WRITERS)
    except OSError as err:
        raise InputError(
            f"{option} {folder} is being written by another basis-bench command right now; "
            "wait for it to finish (two writers of one folder would mix or lose outputs)"
        ) from err
    if _SCOPE:
        _SCOPE[-1].locks.append(fd)


@contextlib.contextmanager
def publishing(folder: Path, *, reading: bool = False) -> Iterator[None]:
    """Hold ``folder``'s publish lock: exclusive while files are swapped into place, shared
    while a reader lists and reads them, so a reader never sees a half-replaced dataset."""
    fd = _lock_descriptor(Path(os.path.realpath(folder)))
    if fd is None:
        yield
        return
    fcntl.lockf(fd, fcntl.LOCK_SH if reading else fcntl.LOCK_EX, 1, _PUBLISH)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _PUBLISH)


def _check_claim(
    path: Path, kind: str, simulated: bool | None, found: dict[str, Any], option: str
) -> None:
    what = _KIND_WORDS.get(kind, f"a {kind!r} output")
    if found.get("kind") != kind:
        raise InputError(
            f"{option} {path} already holds {_describe(found)}, not {what}; choose a new or "
            "empty folder (or pass --force to write into it anyway)"
        )
    held = found.get("simulated")
    if kind == "rollouts" and simulated is not None and held is not None and held != simulated:
        new = "simulated" if simulated else "real"
        raise InputError(
            f"{option} {path} holds {_describe(found)}; writing {new} rollouts into it would "
            "mix the two: choose a new or empty folder (or pass --force to mix them)"
        )


def default_dataset() -> Path:
    """The shipped default rollouts dataset: package data (``basis_bench/data/default``), so a
    wheel install runs the main job outside a clone."""
    return Path(str(importlib_resources.files("basis_bench") / "data" / "default"))


PROVENANCE_PACKAGES = ("numpy", "polars", "pyarrow", "torch", "transformers", "math-verify")


def provenance() -> dict[str, Any]:
    """Where a result came from: package version, git commit (when run from a clone, with a
    ``-dirty`` suffix for uncommitted changes), UTC date, argv, python and library versions.
    Recorded in every run.json and training config.json."""
    from basis_bench import __version__

    root = Path(__file__).resolve().parents[2]
    commit = None
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = None
    versions: dict[str, str | None] = {}
    for name in PROVENANCE_PACKAGES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "basis_bench": __version__,
        "git_commit": commit,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "versions": versions,
    }


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``basis_bench`` key-value metadata of one Parquet file ({} if absent)."""
    kv = pq.read_schema(path).metadata or {}
    raw = kv.get(METADATA_KEY.encode())
    return json.loads(raw) if raw else {}


def rollout_files(root: str | os.PathLike[str]) -> list[Path]:
    """All rollouts Parquet files under ``root``, sorted (temporary files are skipped; links
    are followed, as every command does)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"rollouts directory {str(root)!r} does not exist")
    found = (  # folders named *.parquet too, so that readers refuse them by name
        Path(folder) / name
        for folder, dirs, files in os.walk(root, followlinks=True)
        for name in (*dirs, *files)
        if name.endswith(".parquet") and name != PROMPTS_FILE
    )
    return sorted(found)


def _rollout_file_columns(path: Path) -> list[str]:
    """Column names of one rollouts file (schema only); missing required columns are an error."""
    names = pq.read_schema(path).names
    missing = [c for c in ROLLOUT_COLUMNS if c not in names]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {missing}; required are {list(ROLLOUT_COLUMNS)}"
        )
    return names


def file_policies(path: str | os.PathLike[str]) -> list[str]:
    """The distinct policies of one rollouts file, reading only its policy column."""
    path = Path(path)
    _rollout_file_columns(path)
    col = pl.scan_parquet(path).select(pl.col("policy").cast(pl.String)).unique().collect()
    return [p for p in col["policy"].to_list() if p is not None]


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
    frames = []
    for f in files:
        names = _rollout_file_columns(f)
        lf = pl.scan_parquet(f).select([*ROLLOUT_COLUMNS, *(c for c in extra if c in names)])
        if wanted is not None:  # rows without a policy reach validation, which refuses them
            policy = pl.col("policy").cast(pl.String)
            lf = lf.filter(policy.is_in(wanted) | policy.is_null())
        frames.append(_conform(lf.collect(), ROLLOUT_COLUMNS, OPTIONAL_ROLLOUT_COLUMNS, str(f)))
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
        with open(path, "rb") as fh:
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


def reward_matrix(df: pl.DataFrame, policy: str, prompt_ids: Iterable[str]) -> np.ndarray:
    """Rewards of one policy as a (P, S) float64 array, row p for ``prompt_ids[p]``.

    Columns follow sample_idx order; rows with fewer samples are padded with NaN, the
    estimators' marker for a missing sample. A prompt with no rows is all NaN.
    """
    ids = list(prompt_ids)
    sub = df.filter(pl.col("policy") == policy).sort(["prompt_id", "sample_idx"])
    sub = sub.with_columns(
        pl.col("sample_idx").rank("ordinal").over("prompt_id").cast(pl.Int64).alias("_col") - 1
    )
    width = int(sub["_col"].to_numpy().max()) + 1 if sub.height else 0
    index = {pid: i for i, pid in enumerate(ids)}
    out = np.full((len(ids), width), np.nan)
    rows = np.fromiter(
        (index.get(p, -1) for p in sub["prompt_id"]), dtype=np.int64, count=sub.height
    )
    keep = rows >= 0
    out[rows[keep], sub["_col"].to_numpy()[keep]] = sub["reward"].to_numpy()[keep]
    return out

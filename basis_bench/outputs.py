"""Everything the package writes, whatever it is: atomic files, output folders, provenance.

- :func:`atomic_write` is the one writer every output goes through (unique temporary name,
  fsync, rename), so a crash never leaves a half file under a final name;
  :func:`write_parquet_atomic` stores the package's JSON metadata in a Parquet file's
  key-value metadata under ``basis_bench`` (:func:`read_metadata` reads it back).
- :func:`claim_output_dir` makes a folder the output of one command and refuses a folder
  that holds another command's output (by its marker file, or for folders written before
  markers, by its files: :func:`recognise_output`).
- :func:`provenance` says where a result came from (git commit, date, argv, versions).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from basis_bench import __version__
from basis_bench.errors import InputError
from basis_bench.schema import PROMPT_COLUMNS, PROMPTS_FILE, ROLLOUT_COLUMNS

METADATA_KEY = "basis_bench"
TEMP_SUFFIX = ".tmp"
STAGED_SUFFIX = ".staged"


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


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``basis_bench`` key-value metadata of one Parquet file ({} if absent)."""
    kv = pq.read_schema(path).metadata or {}
    raw = kv.get(METADATA_KEY.encode())
    return json.loads(raw) if raw else {}


# --------------------------------------------------------------------------- output folders

OUTPUT_MARKER = ".basis-bench-output.json"
_KIND_WORDS = {
    "rollouts": "a rollouts dataset",
    "train-run": "a training run",
    "results": "a results folder",
    "figures": "a figures folder",
}


def _is_temporary(path: Path) -> bool:
    """A writer's temporary or staged file (``.NAME.XXXX.tmp``, ``.NAME.XXXX.staged``)."""
    return path.name.startswith(".") and path.name.endswith((TEMP_SUFFIX, STAGED_SUFFIX))


def _output_files(path: Path) -> list[Path]:
    """Every file under ``path`` but writers' temporary files (empty folders do not count)."""
    return sorted(f for f in path.rglob("*") if not f.is_dir() and not _is_temporary(f))


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
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path} is a file; give a directory")
    try:
        found = recognise_output(path)
    except InputError:
        if not force:
            raise
        found = {"kind": None}
    if found is not None and not force:
        _check_claim(path, kind, simulated, found, option)
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
        text = json.dumps({**marker, "package_version": __version__}, sort_keys=True)
        write_text_atomic(path / OUTPUT_MARKER, text + "\n")
    return path


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


# --------------------------------------------------------------------------- provenance

PROVENANCE_PACKAGES = ("numpy", "polars", "pyarrow", "torch", "transformers", "math-verify")


def provenance() -> dict[str, Any]:
    """Where a result came from: package version, git commit (when run from a clone, with a
    ``-dirty`` suffix for uncommitted changes), UTC date, argv, python and library versions.
    Recorded in every run.json and training config.json."""
    root = Path(__file__).resolve().parents[1]
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

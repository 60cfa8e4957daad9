"""Everything the package writes, whatever it is: atomic files and output folders.

- :func:`atomic_write` is the one writer every output goes through (unique temporary name,
  fsync, rename), so a crash never leaves a half file under a final name;
  :func:`write_parquet_atomic` stores the package's JSON metadata in a Parquet file's
  key-value metadata under ``basis_bench`` (:func:`read_metadata` reads it back).
- :func:`claim_output_dir` makes a folder the output of one command and refuses a folder
  that holds another command's output (by its marker file, or for folders written before
  markers, by its files: :func:`recognise_output`), and locks it for the call
  (:func:`holds_output_locks`; the locks themselves: :mod:`.locks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from basis_bench.errors import InputError, write_failed
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import (
    FILE_MODE,
    claimed,
    inside_claim,
    read_small,
    real_path,
    walk,
)
from basis_bench.guards.locks import (
    LOCK_FILE,
    LockFile,
    let_go_writer_lock,
    take_writer_lock,
    writes_alone,
)
from basis_bench.guards.provenance import __version__
from basis_bench.schema import PROMPT_COLUMNS, PROMPTS_FILE, ROLLOUT_COLUMNS
from basis_bench.settings import option_given, option_label

METADATA_KEY = "basis_bench"
TEMP_SUFFIX = ".tmp"
STAGED_SUFFIX = ".staged"
REPLACED_SUFFIX = ".replaced"  # a file set aside while a replace is published


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; on success fsync it and rename it onto
    ``path``, on error remove it.

    The temporary name is unique per writer (``tempfile``), so two writers of one path never
    share a file, and a reader sees the old complete file or the new complete file, never a
    torn one. The one writer every output of the package goes through.
    """
    path = inside_claim(Path(path))
    with naming_failed_writes(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            os.chmod(tmp, FILE_MODE)  # mkstemp's 0600 would make every output private
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def naming_failed_writes(path: str | os.PathLike[str]) -> Iterator[None]:
    """A full disk, quota, read-only file system or ``ulimit -f`` inside the block is a
    :class:`~basis_bench.errors.WriteFailed` naming ``path`` (a write to an open file, or
    polars' and arrow's writers, name no file; polars gives no errno either)."""
    try:
        yield
    except Exception as err:
        failed = write_failed(err, path)
        if failed is None or failed is err:
            raise
        raise failed from err


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


def finite(data: Any) -> Any:
    """``data`` with no non-finite number: an infinity becomes the string ``"inf"`` or
    ``"-inf"`` (as users give one, e.g. ``fixed_beta=inf``, and as log.jsonl has always written
    beta = inf), NaN becomes None. JSON has no such numbers: Python writes ``Infinity``, which
    strict readers and TensorBoard refuse."""
    if isinstance(data, float | np.floating):
        x = float(data)
        return x if math.isfinite(x) else (None if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(data, Mapping):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def json_text(data: Any, **options: Any) -> str:
    """The one way the package writes JSON: :func:`finite` data, and ``allow_nan=False``, so a
    non-finite number that slipped past is an error here, never ``Infinity`` in a file."""
    return json.dumps(finite(data), allow_nan=False, **options)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_write`."""
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


ROW_GROUP_ROWS = 1 << 20  # pyarrow's default row group size: the row groups write_table makes


def write_parquet_atomic(
    df: pl.DataFrame, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write ``df`` to ``path`` through :func:`atomic_write` (zstd Parquet).

    ``metadata`` is stored as JSON under the ``basis_bench`` key of the file's
    key-value metadata. After a crash a ``.parquet`` file is either complete or absent.
    One row group is converted to Arrow at a time (the file is the one ``write_table``
    writes), Categorical columns (an import's ids as codes) as text, so a frame of
    millions of rows is never copied whole.
    """
    text = [pl.col(c).cast(pl.String) for c, t in df.schema.items() if t == pl.Categorical]
    schema = df.head(0).with_columns(text).to_arrow().schema
    if metadata is not None:
        kv = dict(schema.metadata or {})
        kv[METADATA_KEY.encode()] = json_text(dict(metadata), sort_keys=True, default=str).encode()
        schema = schema.with_metadata(kv)
    with atomic_write(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for start in range(0, max(df.height, 1), ROW_GROUP_ROWS):
            rows = df.slice(start, ROW_GROUP_ROWS).with_columns(text).to_arrow()
            writer.write_table(rows.replace_schema_metadata(schema.metadata))
    return Path(path)


def save_figure(fig: Any, out: Path, stem: str) -> list[Path]:
    """``stem``.png and ``stem``.pdf of a matplotlib figure, each written atomically (no
    half-written file under the real name) and without a creation date in the PDF (the same
    results give byte-identical files); the figure is closed."""
    import matplotlib.pyplot as plt

    paths = []
    for ext in ("png", "pdf"):
        metadata = {"CreationDate": None} if ext == "pdf" else None
        with atomic_write(out / f"{stem}.{ext}") as tmp:
            fig.savefig(tmp, format=ext, dpi=200, metadata=metadata)
        paths.append(out / f"{stem}.{ext}")
    plt.close(fig)
    return paths


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``basis_bench`` key-value metadata of one Parquet file ({} if absent)."""
    kv = pq.read_schema(path).metadata or {}
    raw = kv.get(METADATA_KEY.encode())
    try:
        meta = bounded_json.loads(raw) if raw else {}
    except ValueError as err:
        raise InputError(f"{path}: its {METADATA_KEY} metadata is not JSON ({err})") from err
    if not isinstance(meta, dict):
        raise InputError(f"{path}: its {METADATA_KEY} metadata is not a JSON object")
    return meta


# --------------------------------------------------------------------------- output folders

OUTPUT_MARKER = ".basis-bench-output.json"
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
    files = (Path(d) / f for d, _, names in walk(path) for f in names)
    return sorted(f for f in files if f.name != LOCK_FILE and not _is_temporary(f))


def read_output_marker(
    path: str | os.PathLike[str], *, force_flag: bool = True
) -> dict[str, Any] | None:
    """The marker of an output folder, None when it has none; an unreadable marker is an
    :class:`InputError` (suggesting --force only where the command has it: ``force_flag``)."""
    marker = Path(path) / OUTPUT_MARKER
    raw = read_small(marker)  # a FIFO or folder by the name is refused, not "no marker"
    if raw is None:
        return None
    fix = "delete it, or pass --force" if force_flag else "delete it"
    try:
        data = bounded_json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{marker} is not a valid marker ({err}); {fix}") from err
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise InputError(f"{marker} is not a valid marker (no kind); {fix}")
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
        meta = bounded_json.loads(raw) if raw else {}
    except ValueError:
        return None
    return meta.get("simulated") is True


def recognise_output(
    path: str | os.PathLike[str], *, force_flag: bool = True
) -> dict[str, Any] | None:
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
    marker = read_output_marker(root, force_flag=force_flag)
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
    nested = next((f.parent for f in files if f.name == OUTPUT_MARKER), None)
    if nested is not None:  # its marker was named as "no basis-bench output"
        return {"kind": None, "example": f"{nested.relative_to(root).as_posix()}/", "nested": True}
    bad = next((f for f in parquet if _parquet_role(f, root) is None), files[0])
    return {"kind": None, "example": bad.relative_to(root).as_posix()}


def _describe(found: dict[str, Any]) -> str:
    kind = found.get("kind")
    if kind is None and found.get("nested"):
        return f"other basis-bench output in a subfolder ({found.get('example')!r})"
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
    force_flag: bool = True,
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
    the setting in messages (``--out``, ``run_dir``); ``force_flag`` False for a command
    without --force (evaluate, sensitivity, figures), whose messages then do not suggest it.

    Never inside another command's output, at any depth (:func:`_check_not_nested`), unless
    ``force``. Links are followed: the folder returned is the real one, so every command writes
    through a symbolic link into its target and never replaces the link. The folder is
    locked to this process until it exits (:func:`lock_output`; ``shared`` for the
    oracle's shards, which write disjoint parts of one dataset side by side). The shipped
    dataset (installed package data) is read-only to every command.
    """
    force_hint = f" (or pass {option_given('--force')} to write into it anyway)"
    option = option_label(option)  # the argument's name in the notebook API
    path = _writable_folder(Path(path), option)
    if not force:
        _check_not_nested(path, option)
    existed = path.exists()
    try:
        found = recognise_output(path, force_flag=force_flag)
    except InputError:
        if not force:
            raise
        found = {"kind": None}
    if found is not None and not force:
        _check_claim(path, kind, simulated, found, option, force_hint if force_flag else "")
    lock_output(path, shared=shared, option=option)  # after the checks: a refusal writes nothing
    claimed(path)
    scope = _SCOPES.stack
    if scope and found is None:  # new or empty, and ours: a failed command leaves it so
        (scope[-1].emptied if existed else scope[-1].created).append(path)
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
        text = json_text({**marker, "package_version": __version__}, sort_keys=True)
        write_text_atomic(path / OUTPUT_MARKER, text + "\n")
    return path


def _check_not_nested(path: Path, option: str) -> None:
    """Refuse an output folder inside another command's output, at any depth, for every
    command: inside a rollouts dataset (by its marker, or a folder written before markers by
    its layout) its files were read as the dataset's (``evaluate --out DATASET/results``
    broke every later command on it, ``train`` run_dir=DATASET/run added a policy); inside
    a results folder or a training run, a rerun of that one swaps or mixes it."""
    for above in path.parents:
        try:
            held = read_output_marker(above)
        except InputError:  # not ours to judge here
            held = None
        layout = (above / PROMPTS_FILE).is_file() and (above / "rollouts").is_dir()
        if (held is not None and held.get("kind") == "rollouts") or (held is None and layout):
            raise InputError(
                f"{option} {path} is inside the rollouts dataset {above}; give that dataset's "
                f"folder ({option_given(option, above)}) or one outside it (its files would be read as the "
                "dataset's by every later command)"
            )
        if held is not None:
            raise InputError(
                f"{option} {path} is inside {_describe(held)}, {above}; give a folder outside "
                "it (a rerun of that command would replace or mix it)"
            )


def _writable_folder(path: Path, option: str) -> Path:
    """``path`` with links resolved, refused in one line where no command may write: a file,
    a path through a file, a link loop, a name too long, the installed package data."""
    if path.parts[:1] == ("~",) and not Path("~").exists():  # made a folder named ~, silently
        home = Path.home().joinpath(*path.parts[1:])
        raise InputError(
            f"{option} {path} starts with a literal ~ (a shell expands it only unquoted and "
            f"not after '='); give the path in full, e.g. {option_given(option, home)}"
        )
    real = real_path(path, option)
    if real.exists() and not real.is_dir():
        raise InputError(f"{option} {path} is a file; give a directory")
    above = next((p for p in real.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"{option} {path}: {above} is a file, not a folder; give a directory")
    shipped = Path(os.path.realpath(str(importlib_resources.files("basis_bench") / "data")))
    if real == shipped or shipped in real.parents:
        raise InputError(
            f"{option} {path} is inside the installed package data ({shipped}), which is "
            "read-only to every command; write to a folder of your own"
        )
    return real


# --------------------------------------------------------------------------- locks held by a call


class _ThreadScopes(threading.local):
    """What each running holds_output_locks call has claimed, per thread: two threads of a
    notebook each have their own calls (one shared stack mixed their claims)."""

    def __init__(self) -> None:
        self.stack: list[_Claims] = []


_SCOPES = _ThreadScopes()


@dataclasses.dataclass
class _Claims:
    locks: list[LockFile] = dataclasses.field(default_factory=list)  # writer locks taken
    created: list[Path] = dataclasses.field(default_factory=list)  # folders made by a claim
    emptied: list[Path] = dataclasses.field(default_factory=list)  # empty folders claimed


F = TypeVar("F", bound=Callable[..., Any])


def holds_output_locks(fn: F) -> F:
    """Decorate a library entry point that claims output folders: the writer locks it takes
    are released when it returns, so one process can call it again and again, and another
    process can write there afterwards; the last to let a folder go removes its lock file.
    If it fails before writing anything into a folder it claimed new or empty, the folder is
    left as it was: a folder the claim created is removed, an empty one loses the marker
    again. (Outside such a call a lock is held, and its file kept, until the process exits.)"""

    @functools.wraps(fn)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        scope = _SCOPES.stack
        scope.append(_Claims())
        failed = True
        try:
            result = fn(*args, **kwargs)
            failed = False
            return result
        except OSError as err:  # every write failure of the call one line, API and CLI alike
            refused = write_failed(err)
            if refused is None or refused is err:
                raise
            raise refused from err
        finally:
            claims = scope.pop()
            if scope:
                scope[-1].locks += claims.locks
                scope[-1].created += claims.created
                scope[-1].emptied += claims.emptied
            else:
                _release(claims, failed)

    return cast(F, scoped)


def _release(claims: _Claims, failed: bool) -> None:
    """Unlock what a call claimed; after a failure first undo the claims of new or empty
    folders it wrote nothing into, while it holds their lock exclusively (an oracle shard
    does not undo a folder another shard is writing)."""
    for folder in (*claims.created, *claims.emptied) if failed else ():
        if _unused_and_ours(folder):
            if folder in claims.created:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                (folder / OUTPUT_MARKER).unlink(missing_ok=True)
    me = threading.get_ident()
    for held in claims.locks:
        let_go_writer_lock(held, me)


def _unused_and_ours(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but its marker and this process alone locks it."""
    if not writes_alone(folder):
        return False
    try:
        # the marker alone, or nothing (a full disk refused the marker; its lock file is made)
        return _output_files(folder) in ([], [folder / OUTPUT_MARKER])
    except InputError:  # something there cannot be read: not known to be unused
        return False


def lock_output(folder: Path, *, shared: bool = False, option: str = "--out") -> None:
    """Lock ``folder`` (created) for writing by this process (an advisory POSIX lock on its
    ``.basis-bench.lock``, which a killed process never leaves held). A folder another
    process writes is an :class:`InputError`; ``shared`` lets several oracle shards write
    one dataset. A results folder swapped whole at the end of a run gets its staging
    folder's lock file with it, which the writer holds (:func:`lock_moved`)."""
    option = option_label(option)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        held = take_writer_lock(folder, shared=shared)
    except OSError as err:  # another process or thread writes it
        raise InputError(
            f"{option} {folder} is being written by another basis-bench command right now; "
            "wait for it to finish (two writers of one folder would mix or lose outputs)"
        ) from err
    if held is not None and _SCOPES.stack:
        _SCOPES.stack[-1].locks.append(held)


def _check_claim(
    path: Path,
    kind: str,
    simulated: bool | None,
    found: dict[str, Any],
    option: str,
    force_hint: str,
) -> None:
    """``force_hint``: how to write anyway ('' for a command without --force)."""
    what = _KIND_WORDS.get(kind, f"a {kind!r} output")
    if found.get("kind") != kind:
        raise InputError(
            f"{option} {path} already holds {_describe(found)}, not {what}; choose a new or "
            f"empty folder{force_hint}"
        )
    held = found.get("simulated")
    if kind == "rollouts" and simulated is not None and held is not None and held != simulated:
        new = "simulated" if simulated else "real"
        raise InputError(
            f"{option} {path} holds {_describe(found)}; writing {new} rollouts into it would "
            f"mix the two: choose a new or empty folder (or pass {option_given('--force')} to "
            "mix them)"
        )

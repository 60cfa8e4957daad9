"""Where the package may read and write: a walk that sees each real folder once and stops at
one it cannot read, paths refused before use (link loops, names too long), and the folders
this process claimed, out of which no write, replace or removal goes through a link.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

from basis_bench.errors import InputError


def walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` of ``root`` as every reader and claim sees a folder: links followed, each
    real folder once (a second link to it, or a link back up, adds nothing, so two links to
    ``.`` no longer make the walk exponential), a folder that cannot be read an
    :class:`InputError` naming it (it was skipped in silence, and its files with it)."""
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, onerror=_unreadable_folder, followlinks=True):
        try:
            info = os.stat(folder)
        except OSError as err:
            _unreadable_folder(err)
        if (info.st_dev, info.st_ino) in seen:
            dirs.clear()
            continue
        seen.add((info.st_dev, info.st_ino))
        yield Path(folder), dirs, files


def _unreadable_folder(err: OSError) -> NoReturn:
    reason = err.strerror or type(err).__name__
    raise InputError(
        f"{err.filename}: cannot read this folder ({reason}); everything under a dataset or "
        "an output folder must be readable: fix its permissions, or move it out"
    ) from err


def regular_file(path: Path) -> Path:
    """``path``, refused in one line unless it is a regular file (or a link to one): opening
    a FIFO named ``part.parquet`` blocked evaluate for good, deaf to SIGTERM. Every file the
    package reads whole asks here first (a dataset's parts, an import source, a prompt file,
    a training config)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path  # missing or unreadable: the reader that opens it names it
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise InputError(f"{path} is not a regular file (a FIFO, socket or device); remove it")
    return path


SMALL_FILE_BYTES = 1 << 30  # a record, marker, config or log of this package is smaller


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_small(path: Path, limit: int = SMALL_FILE_BYTES) -> bytes | None:
    """The bytes of one of the package's own small files (a dataset's training.json, a
    results folder's run.json and sensitivity.json, an output marker, a training run's
    config.json and log.jsonl, the hash cache): None where nothing has the name; anything
    else than a regular file there (a FIFO, socket, device or folder) is an
    :class:`InputError` naming what it is, as is a file over ``limit`` bytes or one that
    cannot be read. A ``training.json`` FIFO was read as absent and evaluate switched the
    dense data from the step schedule to the epoch schedule, exit 0; opening one would
    wait for a writer that never comes, so the file is opened non-blocking and checked
    again on its handle. A symbolic link to nothing is no absence either (a moved
    training.json behind a link made the same switch): it is refused, naming its target."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise InputError(
                f"{path} is a link to {os.readlink(path)}, which does not exist; remove the "
                "link or restore its target"
            ) from None
        return None
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from err
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path} is {_kind(info.st_mode)}, not a regular file; remove it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from err
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped for a FIFO since the stat
            raise InputError(f"{path} is {_kind(mode)}, not a regular file; remove it")
        try:
            data = _read_at_most(fh, limit + 1)
        except OSError as err:
            raise InputError(f"{path}: cannot read it ({err.strerror or err})") from err
    if len(data) > limit:
        raise InputError(f"{path} is larger than {limit:,} bytes: not a file this package wrote")
    return data


_CHUNK = 1 << 20


def _read_at_most(fh: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes of ``fh``, a chunk at a time: ``fh.read(size)`` reserves all of
    ``size`` first (1 GiB for a 200-byte run.json, a MemoryError under ``ulimit -v``)."""
    chunks: list[bytes] = []
    got = 0
    while got < size:
        chunk = fh.read(min(_CHUNK, size - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # a new file's mode under this process's umask

_CLAIMED: set[Path] = set()  # the real folders this process claimed


def claimed(folder: Path) -> None:
    """Record ``folder`` (real) as claimed by this process (claim_output_dir)."""
    _CLAIMED.add(folder)


def inside_claim(path: Path) -> Path:
    """``path``, refused in one line where a symbolic link leads it out of the output folder
    it lies in: every write (:func:`atomic_write`), replace and removal under a claimed folder
    asks here, so a command changes only files physically inside the folder it claimed
    (``import --replace`` through ``DATASET/rollouts/POLICY``, a link into another dataset,
    deleted and rewrote that dataset's parts). Links are still followed for reading."""
    real = Path(os.path.realpath(path.parent))
    for above in (path.parent, *path.parent.parents):
        root = Path(os.path.realpath(above))
        if root in _CLAIMED:
            _refuse_leading_out(path.parent, real, root, "a folder")
            break
    return path


def appended_inside(path: Path, folder: Path) -> Path:
    """``path``, a file of ``folder`` that is appended to in place (a training run's
    ``log.jsonl``), refused in one line where a symbolic link leads it out of ``folder``:
    an append goes through a link at ``path`` itself, where :func:`atomic_write` replaces
    such a link and so asks :func:`inside_claim` only about the folders above it."""
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    _refuse_leading_out(path, real, root, "a file")
    return path


def _refuse_leading_out(path: Path, real: Path, root: Path, own: str) -> None:
    """The one line for ``path`` (``real`` once links are resolved) outside ``root``."""
    if real != root and root not in real.parents:
        raise InputError(
            f"{path} leads out of {root} through a symbolic link (to {real}); a command "
            "writes, replaces and removes files only inside the folder it claimed: replace "
            f"the link by {own}, or write to its target directly"
        )


_NAME_MAX = 255  # bytes of one file or folder name (Linux, macOS)


def refuse_long_names(path: str | os.PathLike[str], option: str) -> None:
    """A name in ``path`` longer than a file system takes is one line (``stat`` would fail
    with ENAMETOOLONG, an OSError, wherever the path is first looked at)."""
    long = next((p for p in Path(path).parts if len(os.fsencode(p)) > _NAME_MAX), None)
    if long is not None:
        raise InputError(
            f"{option}: the name {long[:40]}... is {len(os.fsencode(long))} bytes long; a file "
            f"system takes at most {_NAME_MAX}"
        )


def real_path(path: str | os.PathLike[str], option: str) -> Path:
    """``path`` with every symbolic link resolved; a link loop or a name longer than a file
    system takes is one line."""
    refuse_long_names(path, option)
    real = Path(os.path.realpath(path))
    if any(p.is_symlink() for p in (real, *real.parents)):  # realpath left a link: a loop
        raise InputError(f"{option} {path} is a loop of symbolic links; give a directory")
    return real

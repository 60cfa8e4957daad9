"""Advisory locks on output folders, one ``.basis-bench.lock`` file a folder: the writer lock
(one command writes a folder, or several oracle shards share it) and the publish lock (a
reader never sees a half-replaced dataset). POSIX locks belong to a process, so this
process's holds of each byte are counted and the byte let go after the last; a killed
process never leaves a lock held, and the last to let a folder go removes its lock file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from basis_bench.guards.folders import FILE_MODE

LOCK_FILE = ".basis-bench.lock"  # writers' and readers' advisory locks (lock_output)

# A lock file is removed by the last process to let it go, while that one still locks it
# whole (:func:`_retire_if_unused`); a process that opened the file before then and locks it after
# finds its path gone or naming another file, and locks the one there now (:func:`_take`).
# So no finished folder keeps a lock file, and two processes never lock two files of one.
_WRITERS, _PUBLISH = 0, 1  # the lock file's bytes: who writes, and who swaps files in


@dataclasses.dataclass(eq=False)
class LockFile:
    """This process's open lock file of one folder. A POSIX lock is the process's, so the
    holders of each byte in this process are counted, and the byte unlocked after the last."""

    path: Path
    fd: int
    held: dict[int, int] = dataclasses.field(default_factory=lambda: {_WRITERS: 0, _PUBLISH: 0})
    writer: int | None = None  # the thread of this process holding the exclusive writer lock

    def names_it(self) -> bool:
        """Whether the path still names the file this descriptor has open."""
        try:
            there = os.stat(self.path)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


_HELD_LOCKS: dict[Path, LockFile] = {}  # lock file -> this process's, while it holds a lock
_LOCKS_GUARD = threading.Lock()  # this process's threads take and let go one at a time


def _take(folder: Path, kind: int, byte: int, *, wait: bool, writer: int | None) -> LockFile | None:
    """Lock ``byte`` of ``folder``'s lock file (made where missing) for this process, waiting
    for it or not (then OSError where another process holds it, and BlockingIOError where
    another thread of this one holds the exclusive writer lock ``writer`` asks for). None
    where no lock file can be made (a read-only folder: nothing is written there either)."""
    path = folder / LOCK_FILE
    while True:
        with _LOCKS_GUARD:
            held = _HELD_LOCKS.get(path)
            if held is None:
                try:
                    held = LockFile(path, os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE))
                except OSError:
                    return None
                _HELD_LOCKS[path] = held
            if writer is not None and held.writer not in (None, writer):
                _retire_if_unused(held)
                raise BlockingIOError(f"{path} is held by another thread")
            held.held[byte] += 1
            if not wait:
                try:
                    fcntl.lockf(held.fd, kind | fcntl.LOCK_NB, 1, byte)
                except OSError:
                    held.held[byte] -= 1
                    _retire_if_unused(held)
                    raise
        if wait:
            try:
                fcntl.lockf(held.fd, kind, 1, byte)
            except BaseException:
                _let_go(held, byte)
                raise
        with _LOCKS_GUARD:
            if held.names_it():
                if writer is not None:
                    held.writer = writer
                return held
            if _HELD_LOCKS.get(path) is held:  # removed before we locked it: take the new one
                del _HELD_LOCKS[path]
        _let_go(held, byte)


def _let_go(held: LockFile, byte: int, thread: int | None = None) -> None:
    """Let go of one hold on ``byte`` (by ``thread``, for a writer lock); after this
    process's last hold on the file, remove it where no other process holds it."""
    with _LOCKS_GUARD:
        held.held[byte] -= 1
        if held.writer == thread and byte == _WRITERS:
            held.writer = None
        if held.fd < 0:  # forgotten: its folder was removed or replaced
            return
        if held.held[byte] == 0:
            fcntl.lockf(held.fd, fcntl.LOCK_UN, 1, byte)
        _retire_if_unused(held)


def _retire_if_unused(held: LockFile) -> None:
    """After this process's last hold on ``held`` (the guard held): unlock it, remove its
    file if no other process holds any of it, and close it. A file another process holds
    is left to that one, which removes it when it lets go."""
    if any(held.held.values()) or held.fd < 0:
        return
    fcntl.lockf(held.fd, fcntl.LOCK_UN, 0, 0)
    try:
        fcntl.lockf(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
    except OSError:
        pass
    else:
        if held.names_it():
            with contextlib.suppress(OSError):
                held.path.unlink()
    _close(held)


def _close(held: LockFile) -> None:
    """Close ``held`` (every lock this process has on it goes with it), the guard held."""
    if _HELD_LOCKS.get(held.path) is held:
        del _HELD_LOCKS[held.path]
    os.close(held.fd)
    held.fd = -1


def forget_lock(folder: Path) -> None:
    """Close this process's descriptor of ``folder``'s lock file (its locks go with it),
    before the folder is removed: a later claim of the folder opens a new one."""
    with _LOCKS_GUARD:
        held = _HELD_LOCKS.get(folder / LOCK_FILE)
        if held is not None:
            _close(held)


def lock_moved(src: Path, dst: Path) -> None:
    """After the folder ``src`` was renamed onto ``dst``: this process's lock of ``src`` is
    ``dst``'s now, and its lock of the folder ``dst`` was (set aside, to be removed) is let go."""
    forget_lock(dst)
    with _LOCKS_GUARD:
        held = _HELD_LOCKS.pop(src / LOCK_FILE, None)
        if held is not None:
            held.path = dst / LOCK_FILE
            _HELD_LOCKS[held.path] = held


def take_writer_lock(folder: Path, *, shared: bool) -> LockFile | None:
    """Take ``folder``'s writer lock for this thread without waiting (``shared``: several
    oracle shards at once); OSError where another process or thread writes it. None where no
    lock file can be made (a read-only folder: nothing is written there either)."""
    kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    writer = None if shared else threading.get_ident()
    return _take(folder, kind, _WRITERS, wait=False, writer=writer)


def let_go_writer_lock(held: LockFile, thread: int) -> None:
    """Let go of one hold on a writer lock that ``thread`` took (:func:`take_writer_lock`)."""
    _let_go(held, _WRITERS, thread)


def writes_alone(folder: Path) -> bool:
    """Whether this process holds ``folder``'s writer lock and no other process holds it;
    if so, this process's hold is made exclusive (an oracle shard's was shared)."""
    held = _HELD_LOCKS.get(folder / LOCK_FILE)
    if held is None:
        return False
    try:
        fcntl.lockf(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _WRITERS)
    except OSError:
        return False
    return True


def held_by_a_writer(folder: Path) -> bool:
    """Whether a live process holds ``folder``'s writer lock (this one included; a folder
    without a lock file has no writer): how a cleanup knows a leftover, never by a name."""
    lock = folder / LOCK_FILE
    with _LOCKS_GUARD:  # closing a descriptor of a file drops this process's locks on it
        if lock in _HELD_LOCKS:
            return True
        while True:
            try:
                probe = LockFile(lock, os.open(lock, os.O_RDWR))
            except OSError:
                return False
            try:
                fcntl.lockf(probe.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _WRITERS)
            except OSError:
                return True
            else:
                if probe.names_it():
                    return False
            finally:
                os.close(probe.fd)


@contextlib.contextmanager
def publishing(folder: Path, *, reading: bool = False) -> Iterator[None]:
    """Hold ``folder``'s publish lock: exclusive while files are swapped into place, shared
    while a reader lists and reads them, so a reader never sees a half-replaced dataset."""
    kind = fcntl.LOCK_SH if reading else fcntl.LOCK_EX
    held = _take(Path(os.path.realpath(folder)), kind, _PUBLISH, wait=True, writer=None)
    try:
        yield
    finally:
        if held is not None:
            _let_go(held, _PUBLISH)

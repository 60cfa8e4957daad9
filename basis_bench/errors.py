"""The one exception type for user mistakes, and how interrupts end a command.

Anything raised as :class:`InputError` is the user's to fix (a bad shape, a missing
column, an unknown checkpoint); the CLI prints its message without a traceback. It
subclasses ValueError so library callers can catch it as the usual type.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from types import FrameType


class InputError(ValueError):
    """Bad input that the user can fix; the message says what and where."""


class OneLineWarning(UserWarning):
    """A warning whose message is whole in one line: the CLI shows it as one ``warning:``
    line, without Python's file, line and source."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name where it has none: what a
    one-line error quotes of a library's (often many-line) exception."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# Failed writes that are the machine's state, not a bug: one line, no traceback.
WRITE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file larger than this process may write (ulimit -f)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a folder in the path is a file",
    errno.EBUSY: "the folder is in use (a mount point or the current folder)",
    errno.ENAMETOOLONG: "a file or folder name is too long",
    errno.ENOENT: "a folder in the path does not exist (removed while the command ran?)",
}
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
"""The errnos of a write the file system refused for want of room or of write access."""


def os_errno(err: BaseException) -> int | None:
    """``err``'s errno, also where a library gave it in its text alone (polars' OSError "No
    space left on device (os error 28)" has no errno; arrow's "[errno 28]")."""
    if isinstance(err, OSError) and err.errno:
        return err.errno
    found = re.search(r"(?:os error|\[errno) (\d+)\b", str(err), re.IGNORECASE)
    return int(found.group(1)) if found else None


class WriteFailed(OSError):
    """A write refused for want of room or of write access (:data:`NO_ROOM`: a full disk, a
    quota, a read-only file system, ``ulimit -f``): its message is one line naming the
    path; it is still the OSError of its errno and filename."""

    def __str__(self) -> str:
        where = f" ({self.filename})" if self.filename else ""
        return f"{WRITE_ERRNOS.get(self.errno or 0, self.strerror)}{where}"


def write_failed(
    err: BaseException, path: str | os.PathLike[str] | None = None
) -> WriteFailed | None:
    """``err`` as a :class:`WriteFailed` where its errno is one of :data:`NO_ROOM`, naming
    ``path`` where ``err`` names no file (a write to an open file names none); else None."""
    if isinstance(err, WriteFailed):
        return err
    code = os_errno(err)
    if code not in NO_ROOM:
        return None
    filename = getattr(err, "filename", None) or (None if path is None else os.fspath(path))
    return WriteFailed(code, os.strerror(code), filename)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is (like Ctrl-C's KeyboardInterrupt) so that every
    cleanup that runs on Ctrl-C runs on a polite kill too; the CLI exits with 143."""


def interrupt_exit(stop: KeyboardInterrupt) -> tuple[str, int]:
    """How an interrupted command ends: ("interrupted", 130) for Ctrl-C, ("terminated",
    143) for SIGTERM (:class:`Terminated`), the shells' 128 + signal number."""
    return ("terminated", 143) if isinstance(stop, Terminated) else ("interrupted", 130)


_RAISED: list[KeyboardInterrupt] = []  # what the signal handler raised in this command


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The CLI's SIGINT and SIGTERM handler: raise KeyboardInterrupt (Ctrl-C) or
    :class:`Terminated` where the program is, and remember it. A library can swallow the
    exception (a polars constructor fed from numpy did, and the command ran on and exited
    0): the CLI then still reports the interrupt (:func:`swallowed_interrupt`)."""
    stop = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    _RAISED.append(stop)
    raise stop


def swallowed_interrupt(forget: bool = False) -> KeyboardInterrupt | None:
    """The last interrupt the handler raised (None if none), to ask when a command ended
    without one; ``forget`` clears the record (at the start of a command)."""
    last = _RAISED[-1] if _RAISED else None
    if forget:
        _RAISED.clear()
    return last


def reraise_swallowed_interrupt() -> None:
    """Raise again an interrupt a library swallowed; called at every progress tick of long
    work, so the command stops there, cleaning up as on any interrupt, instead of running on
    to its end (a polars constructor inside the replay swallowed a SIGTERM in CI). Does
    nothing when no interrupt was raised, as in a library caller without the CLI's handler."""
    if _RAISED:
        raise type(_RAISED[-1])()

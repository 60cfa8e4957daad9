"""The one exception type for user mistakes, and how interrupts end a command.

Anything raised as :class:`InputError` is the user's to fix (a bad shape, a missing
column, an unknown checkpoint); the CLI prints its message without a traceback. It
subclasses ValueError so library callers can catch it as the usual type.
"""

from __future__ import annotations

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

"""The one exception type for user mistakes.

Anything raised as :class:`InputError` is the user's to fix (a bad shape, a missing
column, an unknown checkpoint); the CLI prints its message without a traceback. It
subclasses ValueError so library callers can catch it as the usual type.
"""


class InputError(ValueError):
    """Bad input that the user can fix; the message says what and where."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is (like Ctrl-C's KeyboardInterrupt) so that every
    cleanup that runs on Ctrl-C runs on a polite kill too; the CLI exits with 143."""


def interrupt_exit(stop: KeyboardInterrupt) -> tuple[str, int]:
    """How an interrupted command ends: ("interrupted", 130) for Ctrl-C, ("terminated",
    143) for SIGTERM (:class:`Terminated`), the shells' 128 + signal number."""
    return ("terminated", 143) if isinstance(stop, Terminated) else ("interrupted", 130)

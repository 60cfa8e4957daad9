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

"""Text from files and users, quoted for where it is shown.

A policy name, a simulated dataset's label, a path or an error message quoting a file can
hold rich markup (``[/bold]`` raised MarkupError, a traceback), control characters (an
escape sequence recoloured or rewrote the terminal) or matplotlib mathtext (a checkpoint
named ``$\\frac{a$`` raised ValueError when a figure was saved). Every CLI print of such
text goes through :func:`shown`, every warning the CLI shows through :func:`printable`
(or :func:`shown`), every figure label of it through :func:`plain_math`.
"""

from __future__ import annotations

from rich.markup import escape

# C0 and C1 controls but newline and tab, DEL, and lone surrogates (unprintable: the
# terminal's encoder raised UnicodeEncodeError), each written as Python would escape it.
_UNSAFE = {
    c: ascii(chr(c))[1:-1]
    for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0xD800, 0xE000))
    if chr(c) not in "\n\t"
}


def printable(value: object) -> str:
    """``str(value)`` with control characters escaped (``\\x1b``), for text printed
    without rich (Python's warning display)."""
    return str(value).translate(_UNSAFE)


def shown(value: object) -> str:
    """:func:`printable`, with rich markup quoted (``\\[/bold]``) too, so it prints through
    rich as the characters it holds."""
    return escape(printable(value))


def plain_math(value: object) -> str:
    """``str(value)`` for a matplotlib label: ``$`` quoted, so it is never read as math."""
    return str(value).replace("$", r"\$")

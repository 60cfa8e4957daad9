"""The ``basis-bench`` entry point (also ``python -m basis_bench``).

It arms the signals before the command line's imports (about a second), so Ctrl-C at any
moment ends in one line, and SIGTERM raises :class:`~basis_bench.errors.Terminated` where
the program is: every cleanup that runs on Ctrl-C (staging folders, partial files) runs on
a polite kill too. The handler remembers what it raised, so an interrupt a library
swallowed is still reported when the command ends.
"""

from __future__ import annotations

import signal
import sys

from basis_bench.errors import interrupt_exit, raise_interrupt


def main() -> None:
    try:  # arming too: a Ctrl-C can land inside signal.signal, its handler already installed
        signal.signal(signal.SIGTERM, raise_interrupt)
        signal.signal(signal.SIGINT, raise_interrupt)
        from basis_bench.cli import main as run
    except KeyboardInterrupt as stop:
        word, code = interrupt_exit(stop)
        print(f"{word} before the command started: nothing was written", file=sys.stderr)
        sys.exit(code)
    run()


if __name__ == "__main__":
    main()

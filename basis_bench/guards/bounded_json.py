"""The one JSON reader for files the package did not just write (run.json, log.jsonl,
config.json, the output marker, Parquet metadata, acc-history, eval-jsonl, prompt files);
:func:`records` reads JSONL files (prompt files, a training run's log) a record a line.

``json.loads`` recurses once per nesting level, so a hostile file of 10^5 ``[`` raised
RecursionError, a traceback. :func:`loads` measures the nesting first (linear, no
recursion) and refuses a document deeper than :data:`MAX_DEPTH` or larger than
:data:`MAX_CHARS` with ``json.JSONDecodeError``, the error every caller already turns
into its one line ("not a JSON record", "not a valid marker", ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from basis_bench.errors import InputError

MAX_DEPTH = 64  # every record the package writes is under 10 levels deep
MAX_CHARS = 1 << 30  # one document; a larger one is not a record of this package

_OTHER_BYTES = bytes(sorted(set(range(256)) - set(b'"[]{}')))


def nesting(text: str | bytes) -> int:
    """The deepest nesting of ``[``/``{`` outside strings (0 for a scalar). Escaped
    backslashes and quotes are dropped first, then every byte but quotes and brackets (C
    speed); the rest is counted in numpy, a quote toggling "inside a string"."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    marks = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _OTHER_BYTES)
    codes = np.frombuffer(marks, np.uint8)
    outside = np.cumsum(codes == ord('"')) % 2 == 0
    opens = outside & ((codes == ord("[")) | (codes == ord("{")))
    closes = outside & ((codes == ord("]")) | (codes == ord("}")))
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def loads(
    text: str | bytes, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """``json.loads(text)``, refusing a document nested deeper than :data:`MAX_DEPTH` or
    longer than :data:`MAX_CHARS` with ``json.JSONDecodeError`` (a ValueError)."""
    shown = text if isinstance(text, str) else ""
    if len(text) > MAX_CHARS:
        raise json.JSONDecodeError(f"longer than {MAX_CHARS} characters", shown, 0)
    depth = nesting(text)
    if depth > MAX_DEPTH:
        raise json.JSONDecodeError(
            f"nested {depth} levels deep, more than the {MAX_DEPTH} a record may be", shown, 0
        )
    return json.loads(text, object_pairs_hook=object_pairs_hook)


def records(data: bytes, where: str, *, cut_last: bool = False, hint: str = "") -> list[Any]:
    """The JSON objects of JSONL ``data``, one a line, blank lines skipped: the one JSONL
    record reader. A line that is not UTF-8, not JSON or not an object is an InputError
    naming ``where``:line (``hint``: advice appended to the UTF-8 one). ``cut_last``: a last
    line without its newline (an append cut short by a crash) is dropped."""
    lines = data.split(b"\n")
    if cut_last and not data.endswith(b"\n"):
        lines.pop()
    rows = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(
                f"{where}:{number}: not UTF-8 text (byte {raw[err.start]:#04x} at column "
                f"{err.start + 1}){hint}"
            ) from err
        if not line.strip():
            continue
        try:
            row = loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}:{number}: not a JSON record ({err.msg})") from err
        if not isinstance(row, dict):
            raise InputError(f"{where}:{number}: not a JSON record (a {type(row).__name__})")
        rows.append(row)
    return rows

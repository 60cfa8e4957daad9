"""The answer in a response's text, by answer format: the last ``\\boxed{}``, the last number,
or a final line that is the answer alone. The bottom of grading: rewards, prompt sources and
trainer datasets all read answers through it; it imports nothing of theirs."""

from __future__ import annotations

import re
from typing import Literal

AnswerFormat = Literal["any", "boxed", "number", "final_line"]
ANSWER_FORMATS: tuple[AnswerFormat, ...] = ("any", "boxed", "number", "final_line")

# A number literal; a minus sign counts only when it is not a binary minus ("5-3" ends in 3).
_NUMBER = re.compile(r"(?<![\w)\].])-?\d+(?:,\d{3})*(?:\.\d+)?")
# final_line's last line: a number literal, bare or in \boxed{}, alone or as the right-hand
# side of an arithmetic equation ("8 - 4 = 4"), with at most a full stop after it.
_LITERAL = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_ANSWER_LINE = re.compile(
    rf"(?:[\d+\-*/×÷().,\s]*=\s*)?(?:{_LITERAL}|\\boxed\{{\s*{_LITERAL}\s*\}})\.?"
)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched.

    None when there is none or its braces never close.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def last_number(text: str) -> str | None:
    """The last number literal in ``text`` ("1,000" -> "1000"), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def final_line(text: str) -> str | None:
    """The answer of a response whose last non-empty line is ``final_line``'s answer line
    ("14", "\\boxed{14}", "8 + 6 = 14."; "1,000" -> "1000"), else None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not _ANSWER_LINE.fullmatch(lines[-1]):
        return None
    return last_number(lines[-1])

"""Verifiable rewards: math-verify scoring of model responses against a gold answer.

The reward of a response is 1.0 when math-verify judges its final answer equivalent
to the gold answer (``1/2``, ``0.5`` and ``\\frac{1}{2}`` all match), else 0.0. Scoring
never raises on model output: a response that cannot be parsed, or whose parsing or
comparison runs past the time budget, gets reward 0 and a ``verify_status`` that says
why. Statuses:

``correct``        verified equivalent to the gold answer (reward 1)
``wrong``          an answer was extracted and it does not match
``no_answer``      nothing to grade (no ``\\boxed{}`` in ``boxed`` mode, no number in
                   ``number`` mode, a last line that is not the answer alone in
                   ``final_line`` mode, or no parsable expression)
``truncated``      ``final_line`` mode: the response was cut at ``max_new_tokens``
``timeout``        parsing + verification took longer than ``timeout_s``
``gold_unparsed``  the gold answer itself could not be parsed (every response of the prompt gets 0)
``error: <Type>``  math-verify raised; the exception type is kept

The time limit uses SIGALRM (as math-verify itself does), so :func:`score` must run in
the main thread of a process; :func:`score_many` spreads prompts over worker processes.

Layer: above :mod:`.answers` (what is graded) and :mod:`.reward_function` (the ``--reward`` spec).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np
from math_verify import parse, verify

from basis_bench.errors import InputError
from basis_bench.rollouts.answers import (
    ANSWER_FORMATS,
    AnswerFormat,
    final_line,
    last_boxed,
    last_number,
)
from basis_bench.rollouts.reward_function import MATH_VERIFY, check_reward_function
from basis_bench.settings import check_scalar


@dataclass(frozen=True)
class RewardConfig:
    """How responses are graded.

    ``answer_format="any"`` is math-verify's own extraction: the last ``\\boxed{}`` if
    there is one, else the last LaTeX or plain expression. ``"boxed"`` grades only the
    last ``\\boxed{}`` and gives ``no_answer`` to a response without one. ``"number"``
    grades the last number literal (inside the last ``\\boxed{}`` if there is one): for
    arithmetic prompts, where "any" would credit a response that merely restates the
    question ("8 + 6" evaluates to 14). ``"final_line"`` is strict: the last non-empty
    line must be the answer (a number literal, bare or in ``\\boxed{}``), alone or as the
    right-hand side of an arithmetic equation ("8 - 4 = 4"), with at most a full stop
    after it; an answer followed by anything, or in a sentence, gets ``no_answer``, and a
    response cut at ``max_new_tokens`` gets ``truncated`` (reward 0 whatever it ends on).
    ``timeout_s`` bounds parsing plus verification of one response.
    """

    answer_format: AnswerFormat = "any"
    timeout_s: float = 5.0
    function: str = MATH_VERIFY
    """``math-verify`` (this module), or a reward function's ``module:function``
    (:mod:`basis_bench.rollouts.reward_function`, imported here: a wrong one is refused at once)."""

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise InputError(
                f"answer_format must be one of {ANSWER_FORMATS}, got {self.answer_format!r}"
            )
        check_scalar(self.timeout_s, "timeout_s", float, min_val=0, include_boundaries="neither")
        check_reward_function(self.function)


class _Deadline(BaseException):
    """Raised from SIGALRM. A BaseException, so math-verify's ``except Exception`` lets it through."""


class _DropOwnTimeoutNotice(logging.Filter):
    """math-verify warns when its own timeout is disabled; ours replaces it, so the notice is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropOwnTimeoutNotice())


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_Deadline` in the body once ``seconds`` of wall time have passed."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "rewards.score uses SIGALRM for its timeout and must run in a process's main "
            "thread; use score_many(workers=...) for parallel scoring"
        )

    def on_alarm(signum: int, frame: object) -> None:
        raise _Deadline

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)


def _extract(response: str, config: RewardConfig) -> list[Any]:
    """math-verify's parsed candidates for a response ([] when there is nothing to grade)."""
    if config.answer_format == "final_line":
        answer = final_line(response)
        if answer is None:
            return []
        response = "\\boxed{" + answer + "}"
    elif config.answer_format in ("boxed", "number"):
        content = last_boxed(response)
        if config.answer_format == "number":
            content = last_number(response if content is None else content)
        if content is None or not content.strip():
            return []
        response = "\\boxed{" + content + "}"
    return parse(response, parsing_timeout=None, raise_on_error=True)


def _grade(gold: list[Any], response: str, config: RewardConfig) -> str:
    """Status of one response against an already-parsed gold answer."""
    try:
        with _time_limit(config.timeout_s):
            target = _extract(response, config)
            if not target:
                return "no_answer"
            ok = verify(gold, target, timeout_seconds=None)
        return "correct" if ok else "wrong"
    except _Deadline:
        return "timeout"
    except Exception as err:  # math-verify raised on this response: reward 0, reason kept
        return f"error: {type(err).__name__}"


def parse_gold(answer: str, config: RewardConfig = RewardConfig()) -> list[Any] | None:
    """The gold answer parsed once for all responses of a prompt (None if unparsable)."""
    try:
        with _time_limit(config.timeout_s):
            gold = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    except _Deadline:
        return None
    return gold or None


def score(
    responses: Sequence[str],
    answer: str,
    config: RewardConfig = RewardConfig(),
    finish_reasons: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Rewards (float64, 0 or 1) and verify statuses of many responses to one prompt.

    The gold answer is parsed once; identical responses (common when sampling many
    per prompt) are graded once and the verdict is shared. ``finish_reasons`` (one per
    response, "length" for one cut at ``max_new_tokens``) matter in ``final_line`` mode
    only, where a cut response scores 0 with status ``truncated``.
    """
    if finish_reasons is not None and len(finish_reasons) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(finish_reasons)} finish reasons")
    if len(responses) == 0:
        return np.zeros(0), []
    gold = parse_gold(answer, config)
    if gold is None:
        return np.zeros(len(responses)), ["gold_unparsed"] * len(responses)
    unique, inverse = np.unique(np.asarray(responses, dtype=object), return_inverse=True)
    verdicts = np.array([_grade(gold, str(r), config) for r in unique], dtype=object)
    statuses = verdicts[inverse.ravel()]
    if config.answer_format == "final_line" and finish_reasons is not None:
        statuses[np.asarray(finish_reasons, dtype=object) == "length"] = "truncated"
    return (statuses == "correct").astype(np.float64), statuses.tolist()


def _score_args(
    args: tuple[Sequence[str], str, RewardConfig, Sequence[str] | None],
) -> tuple[np.ndarray, list[str]]:
    return score(*args)


def score_many(
    responses: Sequence[Sequence[str]],
    answers: Sequence[str],
    config: RewardConfig = RewardConfig(),
    pool: ProcessPoolExecutor | None = None,
    finish_reasons: Sequence[Sequence[str]] | None = None,
) -> list[tuple[np.ndarray, list[str]]]:
    """:func:`score` for many prompts (``responses[p]`` against ``answers[p]``, with
    ``finish_reasons[p]`` when given).

    With a ``pool`` (see :func:`scoring_pool`) prompts are graded in parallel worker
    processes, each with its own SIGALRM timeout; without one, in this process.
    """
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} response groups but {len(answers)} answers")
    finish = [None] * len(responses) if finish_reasons is None else finish_reasons
    if len(finish) != len(responses):
        raise ValueError(f"{len(responses)} response groups but {len(finish)} finish reason groups")
    jobs = [
        (list(r), a, config, None if f is None else list(f))
        for r, a, f in zip(responses, answers, finish, strict=True)
    ]
    if pool is None:
        return [_score_args(job) for job in jobs]
    return list(pool.map(_score_args, jobs))


def scoring_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes for :func:`score_many`, started with ``spawn``.

    Spawned rather than forked, so a parent holding CUDA or vLLM state is never copied.
    """
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))

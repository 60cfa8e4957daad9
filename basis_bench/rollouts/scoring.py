"""Scoring a run's responses by its reward config: math-verify against each prompt's gold
answer (:mod:`.rewards`), or the ``--reward`` function (:mod:`.reward_function`) called with
each prompt as the model was given it.

Layer: above rewards, reward_function and trainer_prompts; the oracle and training call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.reward_function import MATH_VERIFY, STATUS, call_reward_function
from basis_bench.rollouts.rewards import RewardConfig, score_many
from basis_bench.rollouts.trainer_prompts import PROMPT_COLUMN, TrainerPrompt, reward_columns

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    import polars as pl

    from basis_bench.rollouts.templates import PromptTemplate


def _chat_prompt(problem: str, template: PromptTemplate) -> list[dict[str, str]]:
    """A problem's prompt as the model was given it, as chat messages."""
    user = [{"role": "user", "content": template.user_message(problem)}]
    return ([{"role": "system", "content": template.system}] if template.system else []) + user


def check_answers(prompts: pl.DataFrame, function: str, what: str) -> None:
    """Math-verify needs a gold answer for every prompt: refused before any model loads."""
    if function != MATH_VERIFY:
        return
    blank = prompts.filter(prompts["answer"].str.strip_chars() == "")
    if blank.height:
        raise InputError(
            f"{what}: {blank.height} prompt(s) have no answer for math-verify (the first: "
            f"{blank['problem'][0][:60]!r}); give a reward function (--reward module:function) "
            "or an answer column"
        )


def grade(
    responses: Sequence[Sequence[str]],
    prompts: pl.DataFrame,
    config: RewardConfig,
    template: PromptTemplate,
    pool: ProcessPoolExecutor | None = None,
    completion_ids: Sequence[Any] | None = None,
    finish_reasons: Sequence[Sequence[str]] | None = None,
) -> list[tuple[np.ndarray, list[str]]]:
    """(rewards, statuses) of ``responses[p]``, the samples of prompt row ``p``: math-verify
    against the answers (:func:`~basis_bench.rollouts.rewards.score_many`, in ``pool``, with
    ``finish_reasons[p]``), or the reward function of ``config.function`` in one call
    (``completion_ids``: flat, prompt-major)."""
    if config.function == MATH_VERIFY:
        return score_many(responses, prompts["answer"].to_list(), config, pool, finish_reasons)
    if len(responses) != prompts.height:
        raise ValueError(f"{len(responses)} response groups but {prompts.height} prompts")
    raw = prompts[PROMPT_COLUMN] if PROMPT_COLUMN in prompts.columns else [None] * prompts.height
    rows = reward_columns(prompts)
    names = sorted({k for row in rows for k in row})
    flat_prompts: list[Any] = []
    completions: list[Any] = []
    columns: dict[str, list[Any]] = {k: [] for k in names}
    for problem, held, row, group in zip(prompts["problem"], raw, rows, responses, strict=True):
        prompt = _chat_prompt(problem, template) if held is None else TrainerPrompt(held).value
        chat = not isinstance(prompt, str)
        for text in group:
            flat_prompts.append(prompt)
            completions.append([{"role": "assistant", "content": text}] if chat else text)
            for k in names:
                columns[k].append(row.get(k))
    rewards = call_reward_function(
        config.function, flat_prompts, completions, completion_ids, columns
    )
    out, at = [], 0
    for group in responses:
        out.append((rewards[at : at + len(group)], [STATUS] * len(group)))
        at += len(group)
    return out

"""A training step's rollouts: which prompts (seeded), their samples, their rewards.

Used by the loop (:mod:`basis_bench.train.loop`) and the value probe
(:mod:`basis_bench.train.probe`), which samples as a step does from a seed stream of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from basis_bench.train.setup import Data


def derive_seed(*keys: int) -> int:
    """A 31-bit seed from integer keys, e.g. (run seed, step): independent streams per use."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0] & 0x7FFFFFFF)


def step_prompt_indices(n_prompts: int, per_step: int, step: int, seed: int) -> np.ndarray:
    """Training-set rows of step ``step``'s prompts (steps count from 1).

    Positions (step-1)*per_step .. step*per_step-1 of an endless sequence of epochs, each a
    permutation of the training set seeded by (seed, epoch): no prompt repeats within an
    epoch, and any step's batch is known without replaying the ones before (resume).
    """
    pos = np.arange((step - 1) * per_step, step * per_step)
    epoch, offset = np.divmod(pos, n_prompts)
    rows = np.empty_like(pos)
    for e in np.unique(epoch):
        chosen = epoch == e
        rows[chosen] = np.random.default_rng([seed, int(e)]).permutation(n_prompts)[offset[chosen]]
    return rows


@dataclass
class Rollouts:
    """One step's samples, prompt-major: rollout p * G + k is sample k of prompt p."""

    prompt_tokens: list[list[int]]  # per prompt
    response_tokens: list[np.ndarray]  # per rollout, cut after the first stop token
    responses: list[str]
    finish_reasons: list[str]


def sample_rollouts(sampler: Any, problems: Sequence[str], config: Any, seed: int) -> Rollouts:
    """The step's rollouts, keeping the sampled token ids that the loss scores."""
    tokens = sampler.sample_tokens(problems, config, seed)
    texts = list(sampler.tokenizer.batch_decode(tokens.response_ids, skip_special_tokens=True))
    return Rollouts(tokens.prompt_ids, tokens.response_ids, texts, tokens.finish_reasons)


def score_rollouts(
    responses: Sequence[str], answers: Sequence[str], data: Data, finish: Sequence[str]
) -> tuple[np.ndarray, list[str]]:
    """Rewards (B_p, G') of prompt-major responses against the prompts' answers, and the
    grader's status of each response (flat); ``finish`` holds each response's finish reason
    (a cut one scores 0 under ``final_line``)."""
    from basis_bench.rollouts.rewards import score_many

    group = len(responses) // len(answers)
    cuts = range(0, len(responses), group)
    groups = [responses[i : i + group] for i in cuts]
    scored = score_many(
        groups, answers, data.reward, data.pool, [finish[i : i + group] for i in cuts]
    )
    return np.stack([r for r, _ in scored]), [s for _, st in scored for s in st]

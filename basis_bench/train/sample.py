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
    import polars as pl

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


def sample_rollouts(sampler: Any, prompts: pl.DataFrame, config: Any, seed: int) -> Rollouts:
    """The step's rollouts of prompt rows ``prompts``, keeping the sampled token ids that the
    loss scores (a trainer's own prompt rendered as the trainer renders it)."""
    from basis_bench.rollouts.trainer_prompts import model_inputs

    tokens = sampler.sample_tokens(model_inputs(prompts), config, seed)
    texts = list(sampler.tokenizer.batch_decode(tokens.response_ids, skip_special_tokens=True))
    return Rollouts(tokens.prompt_ids, tokens.response_ids, texts, tokens.finish_reasons)


def score_rollouts(
    responses: Sequence[str],
    prompts: pl.DataFrame,
    data: Data,
    completion_ids: Sequence[Any] | None = None,
    finish: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Rewards (B_p, G') of prompt-major responses to prompt rows ``prompts`` (math-verify
    against their answers, or the reward function), and the grader's status of each (flat);
    ``finish`` holds each response's finish reason (a cut one scores 0 under ``final_line``)."""
    from basis_bench.rollouts.scoring import grade

    group = len(responses) // prompts.height
    cuts = range(0, len(responses), group)
    groups = [responses[i : i + group] for i in cuts]
    cut = None if finish is None else [finish[i : i + group] for i in cuts]
    scored = grade(groups, prompts, data.reward, data.template, data.pool, completion_ids, cut)
    return np.stack([r for r, _ in scored]), [s for _, st in scored for s in st]

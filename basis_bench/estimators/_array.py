"""Input checks shared by the estimators: one clear ValueError per user mistake."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from basis_bench.errors import InputError

Array = Any  # any array-API array: numpy.ndarray, torch.Tensor, ...

RewardRange = tuple[float, float] | None


def check_rewards(rewards: Array, reward_range: RewardRange, what: str = "rewards") -> None:
    """Rewards of a batch must be finite and, when a range is declared, inside it."""
    xp = array_namespace(rewards)
    if rewards.ndim == 0:
        raise InputError(f"{what} must have a batch axis; got a scalar")
    if not bool(xp.all(xp.isfinite(rewards))):
        raise InputError(
            f"{what} contain NaN or infinite values; a batch needs one finite reward per rollout"
        )
    if reward_range is not None:
        lo, hi = reward_range
        if bool(xp.any(rewards < lo)) or bool(xp.any(rewards > hi)):
            raise InputError(
                f"{what} fall outside the declared reward range [{lo}, {hi}] "
                f"(min {float(xp.min(rewards))}, max {float(xp.max(rewards))}); "
                "pass reward_range=None or the right range for continuous rewards"
            )


def check_same_shape(a: Array, b: Array, names: str) -> None:
    """Two arrays that pair element by element must have the same shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise InputError(f"shape mismatch between {names}: {tuple(a.shape)} vs {tuple(b.shape)}")


def check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    """A string option must be one of its documented values."""
    if value not in allowed:
        raise InputError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


class PromptIndex:
    """Prompt id -> row of a per-prompt table (the reference cache), with clear errors."""

    def __init__(self, prompt_ids: Sequence[str]) -> None:
        self.rows = {pid: i for i, pid in enumerate(prompt_ids)}
        if len(self.rows) != len(prompt_ids):
            raise InputError("prompt_ids of the reference cache are not unique")

    def __call__(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """Rows of a batch's prompts; prompts missing from the cache are an error."""
        missing = [p for p in prompt_ids if p not in self.rows]
        if missing:
            raise InputError(
                f"{len(missing)} prompt(s) of the batch are not in the reference cache, e.g. {missing[0]!r}"
            )
        return np.fromiter(
            (self.rows[p] for p in prompt_ids), dtype=np.int64, count=len(prompt_ids)
        )

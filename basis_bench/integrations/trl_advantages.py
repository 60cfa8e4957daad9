"""TRL's advantages with BASIS, pure functions (torch, no TRL): the weighted reward of each
completion and A_i = r_i - b_i on the scorable ones. :mod:`basis_bench.integrations.trl`
hands them on; :mod:`basis_bench.integrations.trl_trainer` calls them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators import StepEstimator, StepOutput
from basis_bench.integrations.keys import one_rollout_step, prompt_key

SCALES = ("none", "batch")
SCALE_EPS = 1e-4  # TRL's epsilon in advantages / (std + eps)

Tensor = Any  # torch.Tensor


def total_rewards(rewards_per_func: Tensor, weights: Tensor) -> Tensor:
    """TRL's reward of each completion, (N, F) -> (N,): the weighted sum over reward functions,
    ignoring a function that returned None (NaN) and NaN where every function did."""
    import torch

    total = (rewards_per_func * weights.to(rewards_per_func).unsqueeze(0)).nansum(dim=1)
    return torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, total)


def basis_advantages(
    basis: StepEstimator, prompts: Sequence[Any], rewards: Tensor, scale: str = "none"
) -> tuple[Tensor, StepOutput]:
    """Advantages (N,) of completions of ``prompts`` with ``rewards`` (NaN = unscorable).

    The baselines come from BASIS on the scorable completions; unscorable ones get 0.
    ``scale="batch"`` divides by the std (ddof = 1) of the scorable rewards plus 1e-4.
    """
    import torch

    if scale not in SCALES:
        raise InputError(
            f"scale_rewards={scale!r} needs groups of completions; with BASIS use one of {SCALES}"
        )
    if len(prompts) != rewards.shape[0]:
        raise InputError(f"{len(prompts)} prompts but {rewards.shape[0]} rewards")
    ok = ~torch.isnan(rewards)
    if int(ok.sum()) < 2:
        raise InputError("BASIS needs at least two scored completions in a batch")
    keep = ok.nonzero().squeeze(-1).tolist()
    out = one_rollout_step(basis, [prompt_key(prompts[i]) for i in keep], rewards[ok])
    advantages = torch.zeros_like(rewards)
    advantages[ok] = rewards[ok] - out.baselines
    if scale == "batch":
        advantages = advantages / (rewards[ok].std() + SCALE_EPS)
    return advantages, out

"""TRL's advantages with BASIS, pure functions (torch, no TRL): the weighted reward of each
completion and A_i = r_i - b_i on the scorable ones. :mod:`basis_bench.integrations.trl`
hands them on; :mod:`basis_bench.integrations.trl_trainer` calls them."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators import StepEstimator, StepOutput
from basis_bench.integrations.keys import one_rollout_step, prompt_key

SCALES = ("none", "batch")
SCALE_EPS = 1e-4  # TRL's epsilon in advantages / (std + eps)
ZERO_STD_METRIC = "frac_reward_zero_std"  # TRL's; always 1.0 with one completion per prompt

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


def step_metrics(out: StepOutput, advantages: Tensor) -> dict[str, float]:
    """What a BASIS step adds to TRL's logs, every value finite (a log is JSON and TensorBoard
    plots no infinity): ``basis/beta`` the tilt chosen on the batch, left out when it is
    infinite (no tilt) or the estimator has none, ``basis/beta_infinite`` 1.0 when it was
    infinite (averaged over a logging window: the share of such steps), ``basis/baseline_mean``
    and ``basis/frac_zero_advantage``, the share of completions whose advantage is 0 (the
    baseline equals the reward: no learning signal), which replaces TRL's
    ``frac_reward_zero_std`` (1.0 at every step with one completion per prompt)."""
    metrics = {
        "basis/baseline_mean": float(out.baselines.mean()),
        "basis/frac_zero_advantage": float((advantages == 0).double().mean()),
    }
    if out.beta is not None:
        beta = float(out.beta)
        metrics["basis/beta_infinite"] = float(math.isinf(beta))
        if math.isfinite(beta):
            metrics["basis/beta"] = beta
    return metrics


def check_training_prompts(
    basis: StepEstimator, signature: inspect.Signature, args: Sequence[Any], kwargs: Any
) -> None:
    """Every prompt of the trainer's ``train_dataset`` (its arguments bound to GRPOTrainer's
    ``signature``) is in the cache of ``basis`` (a :class:`~basis_bench.integrations.keys.CacheStep`;
    another step estimator knows no prompts to check), before the trainer loads the model.
    A streaming dataset is not read ahead."""
    from basis_bench.integrations.keys import CacheStep

    if not isinstance(basis, CacheStep):
        return
    bound = signature.bind_partial(None, *args, **kwargs).arguments
    dataset = bound.get("train_dataset")
    names = getattr(dataset, "column_names", None)
    if dataset is None or not isinstance(names, list) or "prompt" not in names:
        return
    basis.cached.check(dataset["prompt"], "train_dataset")

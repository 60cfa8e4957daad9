"""BASIS in TRL: a GRPOTrainer that samples one completion per prompt and uses BASIS baselines.

TRL's ``GRPOConfig`` refuses ``num_generations < 2`` and ``GRPOTrainer`` computes its group
baseline inline in ``_generate_and_score_completions``, with no hook. Here
:class:`BasisGRPOConfig` accepts ``num_generations=1`` (its default) and
:class:`BasisGRPOTrainer` keeps the rewards that ``_calculate_rewards`` gathers across
processes, lets TRL do everything else, then replaces the advantages of training batches with

    A_i = r_i - b_i,   b_i = BASIS baseline of prompt i (beta calibrated on this batch),

divided by the batch's reward std when ``scale_rewards="batch"``. r_i is TRL's weighted sum of
the reward functions; a completion no reward function scored gets A_i = 0, as in TRL.
Prompts are keyed by content (:func:`basis_bench.integrations.prompt_key` of the dataset's
``prompt``), so the cache must be built from prompts rendered as that text.

Usage::

    from basis_bench.integrations.keys import basis_from_rollouts
    from basis_bench.integrations.trl import BasisGRPOConfig, BasisGRPOTrainer

    trainer = BasisGRPOTrainer(
        model=..., reward_funcs=..., train_dataset=...,
        args=BasisGRPOConfig(output_dir="out", per_device_train_batch_size=64),
        basis=basis_from_rollouts("runs/reference"),
    )

TRL is imported when one of the two classes is first used, so this module's pure functions
(:func:`total_rewards`, :func:`basis_advantages`) work without it.
"""

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


def __getattr__(name: str) -> type:
    """The TRL classes, imported (with TRL) on first use."""
    if name in ("BasisGRPOConfig", "BasisGRPOTrainer"):
        from basis_bench.integrations import trl_trainer

        cls: type = getattr(trl_trainer, name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

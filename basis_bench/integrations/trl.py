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

import math
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


def _build() -> tuple[type, type]:
    """Define the TRL subclasses (imports TRL)."""
    from dataclasses import dataclass, field

    from accelerate.utils import gather_object
    from trl import GRPOConfig, GRPOTrainer

    @dataclass
    class BasisGRPOConfig(GRPOConfig):
        """GRPOConfig whose default is one generation per prompt, which TRL itself refuses."""

        num_generations: int | None = field(
            default=1,
            metadata={
                "help": "Completions per prompt; BASIS needs only 1 (TRL's GRPO needs >= 2)."
            },
        )
        scale_rewards: str = field(
            default="none",
            metadata={"help": "'none' (A = r - b) or 'batch' (divided by the batch's reward std)."},
        )

        def __post_init__(self) -> None:
            requested = self.num_generations
            if requested != 1:
                super().__post_init__()
                return
            if getattr(self, "num_generations_eval", None) is None:
                self.num_generations_eval = 1
            # TRL's only objection to G = 1 is its "at least 2 generations" check; pass it with
            # G = 2 (which also asks for an even generation batch) and restore G = 1.
            self.num_generations = 2
            try:
                super().__post_init__()
            except ValueError as exc:
                if "divisible by num_generations" in str(exc):
                    raise InputError(
                        "BasisGRPOConfig with num_generations=1 needs an even generation batch "
                        "(per_device_train_batch_size x processes x steps_per_generation)"
                    ) from exc
                raise
            finally:
                self.num_generations = requested
            if self.scale_rewards not in SCALES:
                raise InputError(
                    f"scale_rewards={self.scale_rewards!r} needs groups; with one generation per "
                    f"prompt use one of {SCALES}"
                )
            if self.multi_objective_aggregation != "sum_then_normalize":
                raise InputError("BASIS needs multi_objective_aggregation='sum_then_normalize'")

    class BasisGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose training advantages are r_i - b_i with BASIS baselines b_i."""

        def __init__(self, *args: Any, basis: StepEstimator, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.basis = basis
            self._basis_rewards: Tensor | None = None

        def _calculate_rewards(
            self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
        ) -> Tensor:
            self._basis_rewards = super()._calculate_rewards(
                inputs, prompts, completions, completion_ids_list
            )
            return self._basis_rewards

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            if self.model is None or not self.model.training:
                return output
            assert self._basis_rewards is not None
            rewards = total_rewards(self._basis_rewards, self.reward_weights)
            prompts = gather_object([x["prompt"] for x in inputs])
            advantages, out = basis_advantages(self.basis, prompts, rewards, self.scale_rewards)
            n = len(inputs)
            start = self.accelerator.process_index * n
            local = output["advantages"]
            output["advantages"] = advantages[start : start + n].to(local)
            logged: Any = self._logs["advantages"]  # a deque in TRL; typed as a Collection
            for _ in range(min(len(advantages), len(logged))):
                logged.pop()
            logged.extend(advantages.tolist())
            beta = math.nan if out.beta is None else float(out.beta)
            self._metrics["train"]["basis/beta"].append(beta)
            self._metrics["train"]["basis/baseline_mean"].append(float(out.baselines.mean()))
            return output

    return BasisGRPOConfig, BasisGRPOTrainer


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name in ("BasisGRPOConfig", "BasisGRPOTrainer"):
        if not _CLASSES:
            config, trainer = _build()
            _CLASSES.update(BasisGRPOConfig=config, BasisGRPOTrainer=trainer)
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

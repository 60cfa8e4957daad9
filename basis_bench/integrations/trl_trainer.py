"""TRL's trainer and config for BASIS: :mod:`basis_bench.integrations.trl` imports this
module (and with it TRL) when one of the two classes is first used."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer

from basis_bench.errors import InputError
from basis_bench.estimators import StepEstimator
from basis_bench.integrations.trl_advantages import (
    SCALES,
    ZERO_STD_METRIC,
    Tensor,
    basis_advantages,
    check_training_prompts,
    step_metrics,
    total_rewards,
)

TRL_RANGE = ">=1.16,<1.17"  # the trl extra's range (pyproject.toml): the seams below are TRL's
# GRPOTrainer's private methods it overrides, as TRL 1.16 declares them (TRL has no public
# hook for the advantages: GRPOTrainer computes its group baseline inline)
SEAMS = {
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("self", "inputs"),
}


def check_seams(trainer: type = GRPOTrainer) -> None:
    """Refuse a TRL whose GRPOTrainer no longer has the methods the plug-in overrides, as it
    overrides them, naming the TRL range it was made for."""
    for name, params in SEAMS.items():
        method = getattr(trainer, name, None)
        found = tuple(inspect.signature(method).parameters) if callable(method) else None
        if found != params:
            raise InputError(
                f"trl {version('trl')}'s GRPOTrainer.{name} is not the one BasisGRPOTrainer "
                f"overrides ({found} instead of {params}); install trl{TRL_RANGE}"
            )


check_seams()


@dataclass
class BasisGRPOConfig(GRPOConfig):
    """GRPOConfig whose default is one generation per prompt, which TRL itself refuses."""

    num_generations: int | None = field(
        default=1,
        metadata={"help": "Completions per prompt; BASIS needs only 1 (TRL's GRPO needs >= 2)."},
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
        check_training_prompts(basis, inspect.signature(GRPOTrainer.__init__), args, kwargs)
        super().__init__(*args, **kwargs)  # loads the model (given by name) after the check
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
        metrics = self._metrics["train"]
        for key, value in step_metrics(out, advantages).items():
            metrics[key].append(value)
        if self.num_generations == 1:  # TRL's share of groups with zero reward std is then
            metrics.pop(ZERO_STD_METRIC, None)  # 1.0 at every step: frac_zero_advantage says it
        return output

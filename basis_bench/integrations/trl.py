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

from basis_bench.integrations.trl_advantages import SCALES, basis_advantages, total_rewards

__all__ = ["SCALES", "basis_advantages", "total_rewards"]  # and, lazily, the two TRL classes


def __getattr__(name: str) -> type:
    """The TRL classes, imported (with TRL) on first use."""
    if name in ("BasisGRPOConfig", "BasisGRPOTrainer"):
        from basis_bench.integrations import trl_trainer

        cls: type = getattr(trl_trainer, name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The comparison baselines, computed from the step's own rewards only.

    vanilla       b_i = 0                                 (REINFORCE, one rollout)
    reinforce_pp  b_i = (1/B) sum_j r_j                   (global batch mean, one rollout)
    grpo          b_ik = (1/G) sum_l r_il                 (group mean, G rollouts)
    rloo          b_ik = (1/(G-1)) sum_{l != k} r_il      (leave-one-out group mean)

Shapes: single-rollout baselines take (..., B) and return (..., B); group baselines take
(..., B, G) and return (..., B, G), one baseline per rollout. The public functions check
their input; the registered estimators (``vanilla``, ``reinforce_pp``, ``grpo``, ``rloo``)
get it checked by the registry and call the kernels directly.
"""

from __future__ import annotations

from array_api_compat import array_namespace

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange, check_rewards
from basis_bench.estimators.options import NoOptions
from basis_bench.estimators.registry import EstimatorInput, register_estimator


def _zeros(rewards: Array) -> Array:
    return array_namespace(rewards).zeros_like(rewards)


def _mean_last(rewards: Array) -> Array:
    xp = array_namespace(rewards)
    return xp.zeros_like(rewards) + xp.mean(rewards, axis=-1, keepdims=True)


def _loo_mean_last(rewards: Array) -> Array:
    xp = array_namespace(rewards)
    return (xp.sum(rewards, axis=-1, keepdims=True) - rewards) / (rewards.shape[-1] - 1)


def vanilla(rewards: Array, reward_range: RewardRange = None) -> Array:
    """Zero baseline: the advantage is the raw reward."""
    check_rewards(rewards, reward_range)
    return _zeros(rewards)


def reinforce_pp(rewards: Array, reward_range: RewardRange = None) -> Array:
    """Global batch baseline: every prompt gets the mean of all B rewards of its batch."""
    check_rewards(rewards, reward_range)
    return _mean_last(rewards)


def _check_group(rewards: Array, minimum: int) -> None:
    if rewards.ndim < 2 or rewards.shape[-1] < minimum:
        raise InputError(
            f"group rewards must be (..., B, G) with G >= {minimum} rollouts per prompt; got shape {tuple(rewards.shape)}"
        )


def grpo(rewards: Array, reward_range: RewardRange = None) -> Array:
    """Group mean of the prompt's G rewards, repeated for each rollout."""
    _check_group(rewards, 1)
    check_rewards(rewards, reward_range)
    return _mean_last(rewards)


def rloo(rewards: Array, reward_range: RewardRange = None) -> Array:
    """Leave-one-out group mean: rollout k's baseline is the mean of the other G - 1 rewards."""
    _check_group(rewards, 2)
    check_rewards(rewards, reward_range)
    return _loo_mean_last(rewards)


ZERO_BASELINE_NAME = "vanilla"
REINFORCE_PP_NAME = "reinforce_pp"
GRPO_NAME = "grpo"
RLOO_NAME = "rloo"


@register_estimator(ZERO_BASELINE_NAME)
def _vanilla(batch: EstimatorInput, options: NoOptions) -> Array:
    """REINFORCE: zero baseline."""
    return _zeros(batch.rewards)


@register_estimator(REINFORCE_PP_NAME)
def _reinforce_pp(batch: EstimatorInput, options: NoOptions) -> Array:
    """REINFORCE++: mean of all B rewards in the batch."""
    return _mean_last(batch.rewards[..., 0])[..., None]


@register_estimator(GRPO_NAME, group=True)
def _grpo(batch: EstimatorInput, options: NoOptions) -> Array:
    """GRPO(G): mean of the prompt's G rewards."""
    _check_group(batch.rewards, 1)
    return _mean_last(batch.rewards)


@register_estimator(RLOO_NAME, group=True)
def _rloo(batch: EstimatorInput, options: NoOptions) -> Array:
    """RLOO(G): mean of the prompt's other G - 1 rewards."""
    _check_group(batch.rewards, 2)
    return _loo_mean_last(batch.rewards)

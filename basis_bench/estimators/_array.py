"""Array plumbing shared by the estimators: input checks (one clear InputError per user
mistake), and the only place that moves arrays between numpy and other array-API
namespaces (:func:`to_numpy`, :func:`asarray_like`), so device and dtype handling is
written once.

Checks belong at the public boundary (a public function, ``Estimator.__call__``,
``Basis.__call__``); the private kernels behind them trust their inputs, so a batch of
GPU tensors is synchronised with the host once per call, not once per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace

from basis_bench.errors import InputError

Array = Any  # any array-API array: numpy.ndarray, torch.Tensor, ...

RewardRange = tuple[float, float] | None


def as_rewards(rewards: Any, what: str = "rewards") -> Array:
    """Rewards as a floating array the estimators can use, or an InputError.

    Floating arrays keep their dtype and namespace; integer and boolean rewards are promoted
    to float (numpy: float64, torch: the default dtype), torch bfloat16/float16 to float32
    (the kernels need a dtype numpy also has), a tensor that requires grad is detached
    (baselines carry no gradient), and plain sequences become float64 numpy arrays.
    """
    if isinstance(rewards, np.ndarray) and rewards.dtype.kind == "f":
        return rewards  # the common case, without the array-API lookups below
    if isinstance(rewards, (list, tuple, int, float, bool)):
        try:
            return np.asarray(rewards, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InputError(f"{what} must be numbers; got {rewards!r:.80}") from err
    if hasattr(rewards, "detach") and hasattr(rewards, "is_floating_point"):  # torch
        import torch

        rewards = rewards.detach()
        if rewards.dtype in (torch.bfloat16, torch.float16):
            return rewards.to(torch.float32)
        if not rewards.is_floating_point():
            if rewards.is_complex():
                raise InputError(f"{what} must be real numbers; got dtype {rewards.dtype}")
            return rewards.to(torch.get_default_dtype())
        return rewards
    if isinstance(rewards, np.ndarray) or hasattr(rewards, "__array_namespace__"):
        xp = array_namespace(rewards)
        dtype = rewards.dtype
        if xp.isdtype(dtype, "real floating"):
            return rewards
        if xp.isdtype(dtype, "integral") or xp.isdtype(dtype, "bool"):
            return xp.astype(rewards, xp.float64)
        raise InputError(f"{what} must be real numbers; got dtype {dtype}")
    raise InputError(f"{what} must be an array of numbers; got {type(rewards).__name__}")


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


def as_step_rewards(rewards: Any, prompt_axis: int = -2) -> Array:
    """One step's rewards ((*lead, B, G), or (B,) with ``prompt_axis=-1``) through
    :func:`as_rewards`, with at least one prompt (an empty step has nothing to estimate, and
    the stateful kernels index its first row)."""
    rewards = as_rewards(rewards)
    if rewards.ndim >= -prompt_axis and rewards.shape[prompt_axis] == 0:
        raise InputError("rewards hold no prompts (B = 0); a step needs at least one prompt")
    return rewards


def check_reference(ref: np.ndarray, reward_range: RewardRange) -> None:
    """A reference cache (P, n), NaN = missing sample, must hold rewards inside the declared
    range: a cache outside it gave tilted values, hence baselines, outside it."""
    seen = ref[~np.isnan(ref)]
    if np.isinf(seen).any():
        raise InputError("ref_rewards contain infinite values; mark a missing sample with NaN")
    if reward_range is not None and seen.size:
        lo, hi = reward_range
        if seen.min() < lo or seen.max() > hi:
            raise InputError(
                f"ref_rewards fall outside the declared reward range [{lo}, {hi}] (min "
                f"{seen.min()}, max {seen.max()}); pass reward_range=None or the right range"
            )


def check_same_shape(a: Array, b: Array, names: str) -> None:
    """Two arrays that pair element by element must have the same shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise InputError(f"shape mismatch between {names}: {tuple(a.shape)} vs {tuple(b.shape)}")


def check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    """A string option must be one of its documented values."""
    if value not in allowed:
        raise InputError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """``x`` (numpy, torch on any device, a sequence, a scalar) as a numpy array."""
    if hasattr(x, "detach"):
        x = x.detach()
        if x.dtype.is_floating_point and x.element_size() < 4:  # numpy has no bfloat16
            x = x.float()
    if hasattr(x, "cpu"):
        x = x.cpu()
    return np.asarray(x, dtype=dtype)


def asarray_like(values: Any, like: Array) -> Array:
    """``values`` (numpy) as an array of ``like``'s namespace, dtype and device."""
    if isinstance(like, np.ndarray):
        return np.asarray(values, dtype=like.dtype)
    return array_namespace(like).asarray(values, dtype=like.dtype, device=like.device)


def same_prompt(cols: np.ndarray) -> np.ndarray | None:
    """(*lead, B, B) whether rows i and j of a batch are the same prompt, or None when every
    prompt appears once (the replay's batches, and most of training's). A training batch
    that straddles two epochs can hold a prompt twice; an estimator with per-prompt state
    folds every copy's reward into it, so all copies write the same state."""
    srt = np.sort(cols, axis=-1)
    if not np.any(srt[..., 1:] == srt[..., :-1]):
        return None
    return cols[..., :, None] == cols[..., None, :]

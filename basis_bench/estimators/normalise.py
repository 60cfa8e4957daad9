"""Advantage normalisations, as trainers apply them after A = r - b: one definition for the
training loop and for the gradient benchmark's normalised arms."""

from __future__ import annotations

import numpy as np

from basis_bench.errors import InputError

ADVANTAGE_NORMS = ("none", "group_std", "batch_std", "batch_whiten")
EPS = 1e-6


def normalise_advantages(advantages: np.ndarray, rewards: np.ndarray, mode: str) -> np.ndarray:
    """Rescale A (..., B_p, G); leading axes are independent batches (the replay's repeats):

    group_std:    A / (std_k r_ik + eps)       (GRPO; sample std over the prompt's G rewards)
    batch_std:    A / (std A + eps)            (scale only, keeps each baseline's centring)
    batch_whiten: (A - mean A) / (std A + eps) (REINFORCE++'s global whitening)
    """
    batch = (-2, -1)
    if mode == "none":
        return advantages
    if mode == "group_std":
        if rewards.shape[-1] < 2:
            raise InputError("advantage_norm = group_std needs G >= 2 rollouts per prompt")
        return advantages / (rewards.std(axis=-1, ddof=1, keepdims=True) + EPS)
    if mode == "batch_std":
        return advantages / (advantages.std(axis=batch, keepdims=True) + EPS)
    if mode == "batch_whiten":
        centred = advantages - advantages.mean(axis=batch, keepdims=True)
        return centred / (advantages.std(axis=batch, keepdims=True) + EPS)
    raise InputError(f"advantage_norm must be one of {ADVANTAGE_NORMS}, got {mode!r}")

"""BASIS as a stateful object for training loops: cache + grid in, baselines out.

Built once from the reference cache (prompt ids and their n cached rewards), it precomputes
the (K, P) table of tilted values and variances, then each step gathers the batch's
columns, calibrates beta (``current``, ``previous`` or ``fixed``) and refines. With
``previous``, the first step uses beta = inf: the initial policy is the reference policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, PromptIndex, RewardRange, check_choice
from basis_bench.estimators.calibrate import CALIBRATIONS, DEFAULT_MIN_ACTIVE, basis_estimate
from basis_bench.estimators.tilt import default_betas, tilted_moments


@dataclass(frozen=True)
class BasisOutput:
    """Baselines b_i (B,), the beta they used, and its index in the grid."""

    baselines: Array
    beta: float
    beta_index: int


class Basis:
    """Single-rollout baselines b_i = V~_{i, beta_t} for a stream of training batches."""

    def __init__(
        self,
        prompt_ids: Sequence[str],
        ref_rewards: Array,
        betas: Sequence[float] | np.ndarray | None = None,
        prior: float = 0.5,
        calibration: str = "current",
        fixed_beta: float | None = None,
        variant: str = "unb",
        criterion: str = "initial",
        loss: str = "squared",
        eps: float = 1e-6,
        min_active: float = DEFAULT_MIN_ACTIVE,
        shrink: bool = False,
        clip: tuple[float, float] | None = None,
        reward_range: RewardRange = (0.0, 1.0),
    ) -> None:
        check_choice(calibration, CALIBRATIONS, "calibration")
        ref = np.asarray(ref_rewards, dtype=np.float64)
        if ref.ndim != 2 or ref.shape[0] != len(prompt_ids):
            raise InputError(
                f"ref_rewards must be ({len(prompt_ids)}, n) to match prompt_ids; got {ref.shape}"
            )
        self.betas = np.asarray(default_betas() if betas is None else betas, dtype=np.float64)
        if calibration == "fixed":
            if fixed_beta is None:
                raise InputError("fixed calibration needs fixed_beta")
            self.betas = np.asarray([fixed_beta], dtype=np.float64)
        self.v_table, self.var_table = tilted_moments(ref, self.betas, prior=prior)
        self.columns = PromptIndex(prompt_ids)
        self.calibration = calibration
        self.options: dict[str, Any] = dict(
            variant=variant, criterion=criterion, loss=loss, eps=eps, min_active=min_active,
            shrink=shrink, clip=clip, reward_range=reward_range,
        )  # fmt: skip
        inf = np.flatnonzero(np.isinf(self.betas))
        # The grid index that ``previous`` calibration applies to the next batch; public so a
        # training loop can save and restore it with its checkpoints.
        self.previous_index = int(inf[0]) if inf.size else 0

    def __call__(self, prompt_ids: Sequence[str], rewards: Array) -> BasisOutput:
        """Baselines for one batch: rewards (B,), one per prompt in ``prompt_ids``."""
        xp = array_namespace(rewards)
        if rewards.ndim != 1 or rewards.shape[0] != len(prompt_ids):
            raise InputError(
                f"rewards must be ({len(prompt_ids)},), one per prompt id; got {tuple(rewards.shape)}"
            )
        cols = self.columns(prompt_ids)
        kw: dict[str, Any] = {"dtype": rewards.dtype}
        if not isinstance(rewards, np.ndarray):
            kw["device"] = rewards.device
        v_grid = xp.asarray(self.v_table[:, cols], **kw)
        var_grid = xp.asarray(self.var_table[:, cols], **kw)
        if self.calibration == "current":
            values, index = basis_estimate(
                v_grid, var_grid, rewards, calibration="current", **self.options
            )
            chosen = int(index)
        else:
            chosen = self.previous_index if self.calibration == "previous" else 0
            values, index = basis_estimate(
                v_grid, var_grid, rewards, calibration="fixed", fixed_index=chosen, **self.options
            )
            if self.calibration == "previous":
                _, now = basis_estimate(
                    v_grid,
                    var_grid,
                    rewards,
                    calibration="current",
                    refine_values=False,
                    **self.options,
                )
                self.previous_index = int(now)
        return BasisOutput(values, float(self.betas[chosen]), chosen)

"""One estimator for a stream of training steps: the factory a training loop calls.

:func:`make_step_estimator` turns a registered name, its options and (for cache
estimators) the reference cache into a :class:`StepEstimator`, called once per step with
the batch's prompt ids and rewards (B, G). BASIS-type estimators go through
:class:`~basis_bench.estimators.basis.Basis`, which keeps the ``previous`` calibration's
state across steps and reports the calibrated beta; every other estimator is called
through the registry on the batch's columns of one shared
:class:`~basis_bench.estimators.table.TiltTable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange
from basis_bench.estimators.basis import Basis
from basis_bench.estimators.options import DEFAULT_PRIOR, BasisOptions
from basis_bench.estimators.registry import Estimator, EstimatorInput, get
from basis_bench.estimators.table import TiltTable


@dataclass(frozen=True)
class StepOutput:
    """Baselines (B, G) of one step; the calibrated beta and its grid index (BASIS only)."""

    baselines: Array
    beta: float | None = None
    beta_index: int | None = None


class StepEstimator:
    """``est(prompt_ids, rewards)``: baselines for one step's rewards (B, G)."""

    def __init__(
        self,
        estimator: Estimator,
        options: Any,
        table: TiltTable | None = None,
        basis: Basis | None = None,
        reward_range: RewardRange = (0.0, 1.0),
    ) -> None:
        self.estimator = estimator
        self.options = options
        self.table = table
        self.basis = basis
        self.reward_range = reward_range

    @property
    def previous_index(self) -> int | None:
        """BASIS's ``previous`` calibration state (save it with a checkpoint), else None."""
        return self.basis.previous_index if self.basis is not None else None

    @previous_index.setter
    def previous_index(self, index: int) -> None:
        if self.basis is not None:
            self.basis.previous_index = int(index)

    def __call__(self, prompt_ids: Sequence[str], rewards: Array) -> StepOutput:
        if self.basis is not None:
            if rewards.ndim != 2 or rewards.shape[1] != 1:
                raise InputError(
                    f"{self.estimator.name} takes one rollout per prompt: rewards (B, 1); "
                    f"got {tuple(rewards.shape)}"
                )
            out = self.basis(list(prompt_ids), rewards[:, 0])
            return StepOutput(out.baselines[:, None], out.beta, out.beta_index)
        inputs = EstimatorInput(rewards, reward_range=self.reward_range)
        if self.table is not None:
            v, var = self.table.gather(self.table.columns(list(prompt_ids)), like=rewards)
            inputs = EstimatorInput(rewards, v, var, self.table.betas, self.reward_range)
        return StepOutput(self.estimator(inputs, self.options))


def make_step_estimator(
    name: str,
    options: Mapping[str, Any] | Any = None,
    *,
    prompt_ids: Sequence[str] | None = None,
    ref_rewards: Array | None = None,
    betas: Sequence[float] | np.ndarray | None = None,
    prior: float = DEFAULT_PRIOR,
    reward_range: RewardRange = (0.0, 1.0),
) -> StepEstimator:
    """A :class:`StepEstimator` for the registered estimator ``name``.

    ``options``: its options object or a ``{key: value}`` mapping, validated against its
    options dataclass (an unknown key names the valid ones). Cache estimators need
    ``prompt_ids`` and ``ref_rewards`` (P, n); ``betas`` (default grid) and ``prior`` shape
    their tilt table.
    """
    est = get(name)
    opts = est.parse_options(options)
    if not est.uses_cache:
        return StepEstimator(est, opts, reward_range=reward_range)
    if prompt_ids is None or ref_rewards is None:
        raise InputError(
            f"estimator {name!r} needs the reference cache: prompt_ids and ref_rewards"
        )
    if isinstance(opts, BasisOptions):
        basis = Basis(prompt_ids, ref_rewards, betas, prior, opts, reward_range)
        return StepEstimator(est, opts, basis.table, basis, reward_range)
    table = TiltTable.from_cache(ref_rewards, betas, prior, prompt_ids)
    return StepEstimator(est, opts, table, reward_range=reward_range)

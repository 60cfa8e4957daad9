"""BASIS as a stateful object for training loops, and its registered one-step estimators.

:class:`Basis` is built once from the reference cache (prompt ids and their n cached
rewards) into a :class:`~basis_bench.estimators.table.TiltTable`; each step gathers the
batch's columns, calibrates beta (``current``, ``previous`` or ``fixed``) and refines.
With ``previous``, the first step uses beta = inf: the initial policy is the reference
policy.

Registered here: ``reference_mean`` (beta = inf, no refinement), ``offline`` (V^ at the
calibrated beta), ``basis`` (UNB), ``basis_vop`` and ``basis_rvg``, all reading
:class:`~basis_bench.estimators.options.BasisOptions` except ``reference_mean``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import (
    Array,
    RewardRange,
    as_step_rewards,
    check_reference,
    check_rewards,
    to_numpy,
)
from basis_bench.estimators.calibrate import estimate_with
from basis_bench.estimators.options import (
    DEFAULT_PRIOR,
    BasisOptions,
    NoOptions,
    options_from_mapping,
)
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import EstimatorInput, register_estimator
from basis_bench.estimators.table import TiltTable, grid_beta_index, inf_index

BASIS_NAME = "basis"
OFFLINE_NAME = "offline"
REFERENCE_MEAN_NAME = "reference_mean"
BASIS_PAPER_NAME = "basis_paper"
# BASIS with its other refinements or the paper's settings; line plots leave them out.
BASIS_VARIANTS = (BASIS_PAPER_NAME, "basis_vop", "basis_rvg")
BASIS_FAMILY = (OFFLINE_NAME, BASIS_NAME, *BASIS_VARIANTS)


class Basis:
    """Single-rollout baselines b_i = V~_{i, beta_t} for a stream of training batches.

    ``options`` is a :class:`BasisOptions` or a ``{key: value}`` mapping of its fields; the
    same keys may also be passed as keywords (``Basis(ids, ref, eps=1e-4)``). With
    ``calibration="fixed"`` the grid is ``[fixed_beta]`` itself. ``betas`` and ``prior``
    shape the tilt table; ``table`` may be given instead of building it from the cache.
    """

    def __init__(
        self,
        prompt_ids: Sequence[str],
        ref_rewards: Array,
        betas: Sequence[float] | np.ndarray | None = None,
        prior: float = DEFAULT_PRIOR,
        options: BasisOptions | dict[str, Any] | None = None,
        reward_range: RewardRange = (0.0, 1.0),
        **option_values: Any,
    ) -> None:
        opts = options if isinstance(options, BasisOptions) else BasisOptions()
        values = {**(options if isinstance(options, dict) else {}), **option_values}
        self.options = options_from_mapping(BasisOptions, values, "Basis", opts)
        if self.options.calibration == "fixed":
            betas = [self.options.fixed_beta]  # type: ignore[list-item]
        check_reference(to_numpy(ref_rewards, dtype=np.float64), reward_range)
        self.table = TiltTable.from_cache(ref_rewards, betas, prior, prompt_ids)
        self.reward_range = reward_range
        inf = self.table.inf_index
        # The grid index that ``previous`` calibration applies to the next batch; public so a
        # training loop can save and restore it with its checkpoints.
        self.previous_index = inf if inf is not None else 0

    @property
    def calibration(self) -> str:
        return self.options.calibration

    @property
    def betas(self) -> np.ndarray:
        return self.table.betas

    @property
    def v_table(self) -> np.ndarray:
        return self.table.values

    @property
    def var_table(self) -> np.ndarray:
        return self.table.variances

    @property
    def columns(self) -> Any:
        return self.table.index

    def __call__(self, prompt_ids: Sequence[str], rewards: Array) -> StepOutput:
        """Baselines for one batch: rewards (B,), one per prompt in ``prompt_ids``."""
        rewards = as_step_rewards(rewards, prompt_axis=-1)
        if rewards.ndim != 1 or rewards.shape[0] != len(prompt_ids):
            raise InputError(
                f"rewards must be ({len(prompt_ids)},), one per prompt id; got {tuple(rewards.shape)}"
            )
        if self.options.refine and rewards.shape[0] < 2:
            raise InputError(
                "BASIS's refinement needs a batch of at least 2 prompts (it leaves one out); "
                f"got {rewards.shape[0]}: batch several prompts, or pass refine=False"
            )
        check_rewards(rewards, self.reward_range)
        v_grid, var_grid = self.table.gather(self.table.columns(prompt_ids), like=rewards)
        if self.calibration == "current":
            values, index = estimate_with(
                v_grid, var_grid, rewards, self.options, reward_range=self.reward_range
            )
            return StepOutput(values, float(self.betas[int(index)]), int(index))
        chosen = self.previous_index if self.calibration == "previous" else 0
        values, _ = estimate_with(
            v_grid, var_grid, rewards, self.options, "fixed", chosen, self.reward_range
        )
        if self.calibration == "previous":
            offline = _offline(self.options)
            _, now = estimate_with(v_grid, var_grid, rewards, offline, "current")
            self.previous_index = int(now)
        return StepOutput(values, float(self.betas[chosen]), chosen)


def _offline(opts: BasisOptions) -> BasisOptions:
    """The same options without refinement (only the calibrated beta is wanted)."""
    from dataclasses import replace

    return replace(opts, refine=False)


def _grids(batch: EstimatorInput) -> tuple[Array, Array | None, np.ndarray]:
    """The input's grids and its betas; cache estimators need the beta grid."""
    assert batch.v_grid is not None  # the registry checked uses_cache
    if batch.betas is None:
        raise InputError("this estimator needs the beta grid (betas) in its input")
    return batch.v_grid, batch.var_grid, batch.betas


def basis_values(batch: EstimatorInput, options: BasisOptions) -> tuple[Array, Array]:
    """BASIS values (..., B) and beta indices (...) of a checked single-rollout input.

    ``calibration="fixed"`` uses ``options.fixed_beta``, which must be on the grid.
    """
    if options.calibration == "fixed":
        v_grid, var_grid, betas = _grids(batch)
        fixed = grid_beta_index(betas, options.fixed_beta)  # type: ignore[arg-type]
        r = batch.rewards[..., 0]
        return estimate_with(v_grid, var_grid, r, options, "fixed", fixed, batch.reward_range)
    assert batch.v_grid is not None
    r = batch.rewards[..., 0]
    return estimate_with(batch.v_grid, batch.var_grid, r, options, reward_range=batch.reward_range)


def calibrated_index(batch: EstimatorInput, options: BasisOptions) -> Array:
    """The beta index BASIS's calibration chooses for each batch (...), no refinement."""
    return basis_values(batch, _offline(options))[1]


@register_estimator(
    REFERENCE_MEAN_NAME, uses_cache=True, label="Reference mean", colour="tab:purple"
)
def _reference_mean(batch: EstimatorInput, options: NoOptions) -> Array:
    """Smoothed reference success rate (beta = inf, no refinement)."""
    v_grid, _, betas = _grids(batch)
    inf = inf_index(betas)
    if inf is None:
        raise InputError("reference_mean needs beta = inf in the grid")
    return v_grid[inf, ..., None]


def _basis(batch: EstimatorInput, options: BasisOptions) -> Array:
    return basis_values(batch, options)[0][..., None]


for _name, _label, _colour, _text, _defaults in (
    (
        OFFLINE_NAME,
        "Offline $\\hat V$",
        "tab:brown",
        "Offline tilted value V^ at the calibrated beta, no refinement.",
        {"refine": False},
    ),
    (
        BASIS_NAME,
        "BASIS",
        "tab:blue",
        "BASIS, robust default: the UNB refinement with its calibration ratio shrunk towards 1 "
        "by its (robust) variance.",
        {"variant": "unb"},
    ),
    (
        BASIS_PAPER_NAME,
        "BASIS (paper)",
        "tab:olive",
        "BASIS (UNB) as in the paper: unbiased BLUE refinement, no shrinkage.",
        {"variant": "unb", "shrink": False, "ratio_var": "model"},
    ),
    (
        "basis_vop",
        "BASIS-VOP",
        "tab:cyan",
        "BASIS-VOP: variance-optimised shrinkage refinement.",
        {"variant": "vop"},
    ),
    (
        "basis_rvg",
        "BASIS-RVG",
        "darkkhaki",
        "BASIS-RVG as in the paper: ratio-average refinement, no shrinkage (unsound where "
        "V^_j is small; see docs/method.md).",
        {"variant": "rvg", "shrink": False, "ratio_var": "model"},
    ),
):
    register_estimator(
        _name,
        uses_cache=True,
        description=_text,
        options=BasisOptions,
        defaults=_defaults,
        label=_label,
        colour=_colour,
    )(_basis)

"""BASIS's registered one-step estimators, their step kernel, and :func:`Basis` for a stream.

:func:`Basis` is ``make_step_estimator("basis", ...)``: built once from the reference cache
(prompt ids and their n cached rewards) into a
:class:`~basis_bench.estimators.table.TiltTable`; each step gathers the batch's columns,
calibrates beta (``current``, ``previous`` or ``fixed``) and refines. With ``previous``,
the first step uses beta = inf: the initial policy is the reference policy
(:class:`BasisKernel` carries the grid index).

Registered here: ``reference_mean`` (beta = inf, no refinement), ``offline`` (V^ at the
calibrated beta), ``basis`` (UNB), ``basis_vop`` and ``basis_rvg``, all reading
:class:`~basis_bench.estimators.options.BasisOptions` except ``reference_mean``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange, asarray_like, to_numpy
from basis_bench.estimators.calibrate import estimate_with, take_beta
from basis_bench.estimators.kernel import EstimatorInput, State, batch_input
from basis_bench.estimators.options import (
    DEFAULT_PRIOR,
    BasisOptions,
    NoOptions,
    options_from_mapping,
)
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import register_estimator
from basis_bench.estimators.step import StepEstimator, make_step_estimator
from basis_bench.estimators.table import TiltTable, grid_beta_index, inf_index

BASIS_NAME = "basis"
OFFLINE_NAME = "offline"
REFERENCE_MEAN_NAME = "reference_mean"
BASIS_PAPER_NAME = "basis_paper"
# BASIS with its other refinements or the paper's settings; line plots leave them out.
BASIS_VARIANTS = (BASIS_PAPER_NAME, "basis_vop", "basis_rvg")
BASIS_FAMILY = (OFFLINE_NAME, BASIS_NAME, *BASIS_VARIANTS)


def Basis(
    prompt_ids: Sequence[str],
    ref_rewards: Array,
    betas: Sequence[float] | np.ndarray | None = None,
    prior: float = DEFAULT_PRIOR,
    options: BasisOptions | dict[str, Any] | None = None,
    reward_range: RewardRange = (0.0, 1.0),
    **option_values: Any,
) -> StepEstimator:
    """BASIS for a stream of training batches: ``make_step_estimator("basis", ...)``.

    ``options`` is a :class:`BasisOptions` or a ``{key: value}`` mapping of its fields; the
    same keys may also be passed as keywords (``Basis(ids, ref, eps=1e-4)``). Call it with a
    batch's prompt ids and rewards (B,), one per prompt: baselines b_i = V~_{i, beta_t} (B,).
    """
    opts = options if isinstance(options, BasisOptions) else BasisOptions()
    values = {**(options if isinstance(options, dict) else {}), **option_values}
    return make_step_estimator(
        BASIS_NAME,
        options_from_mapping(BasisOptions, values, "Basis", opts),
        prompt_ids=prompt_ids,
        ref_rewards=ref_rewards,
        betas=betas,
        prior=prior,
        reward_range=reward_range,
    )


class BasisKernel:
    """The BASIS family: state = the grid index that ``previous`` calibration applies next.

    ``current`` and ``fixed`` go through the registered estimator (and report the chosen
    beta); ``previous`` evaluates the registered estimator on the one-row grid of each
    stream's previous beta, then calibrates on this batch (no refinement) for the next.
    The first step uses beta = inf: the initial policy is the reference.
    """

    def __init__(
        self,
        estimator: Any,
        options: BasisOptions,
        table: TiltTable,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        self.estimator, self.options, self.table = estimator, options, table
        self.reward_range = reward_range

    @property
    def carries_state(self) -> bool:
        """Only ``previous`` calibration carries its grid index from one step to the next."""
        return self.options.calibration == "previous"

    def initial_state(self, lead: tuple[int, ...]) -> State:
        inf = self.table.inf_index
        return {"previous_index": np.full(lead, inf if inf is not None else 0, dtype=np.int64)}

    def step(self, state: State, cols: np.ndarray, rewards: Array) -> StepOutput:
        inputs = batch_input(self.table, cols, rewards, self.reward_range)
        betas = self.table.betas
        if self.options.calibration != "previous":
            values = self.estimator(inputs, self.options)
            return _basis_output(values, to_numpy(calibrated_index(inputs, self.options)), betas)
        chosen = state["previous_index"].copy()
        assert inputs.v_grid is not None and inputs.var_grid is not None
        idx = asarray_like(chosen, rewards[..., 0])
        one_v = take_beta(inputs.v_grid, idx)[None]
        one_var = take_beta(inputs.var_grid, idx)[None]
        one = EstimatorInput(rewards, one_v, one_var, np.array([1.0]), self.reward_range)
        at_chosen = replace(self.options, calibration="fixed", fixed_beta=1.0)
        values = self.estimator(one, at_chosen)
        now = calibrated_index(inputs, replace(self.options, calibration="current"))
        state["previous_index"][...] = to_numpy(now)
        return _basis_output(values, chosen, betas)


def _basis_output(values: Array, index: np.ndarray, betas: np.ndarray) -> StepOutput:
    index = np.asarray(index, dtype=np.int64)
    beta = betas[index]
    if index.ndim == 0:
        return StepOutput(values, float(beta), int(index))
    return StepOutput(values, beta, index)


def _offline(opts: BasisOptions) -> BasisOptions:
    """The same options without refinement (only the calibrated beta is wanted)."""
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


@register_estimator(REFERENCE_MEAN_NAME, uses_cache=True)
def _reference_mean(batch: EstimatorInput, options: NoOptions) -> Array:
    """Smoothed reference success rate (beta = inf, no refinement)."""
    v_grid, _, betas = _grids(batch)
    inf = inf_index(betas)
    if inf is None:
        raise InputError("reference_mean needs beta = inf in the grid")
    return v_grid[inf, ..., None]


def _basis(batch: EstimatorInput, options: BasisOptions) -> Array:
    return basis_values(batch, options)[0][..., None]


for _name, _text, _defaults in (
    (
        OFFLINE_NAME,
        "Offline tilted value V^ at the calibrated beta, no refinement.",
        {"refine": False},
    ),
    (
        BASIS_NAME,
        "BASIS, robust default: the UNB refinement with its calibration ratio shrunk towards 1 "
        "by its (robust) variance.",
        {"variant": "unb"},
    ),
    (
        BASIS_PAPER_NAME,
        "BASIS (UNB) as in the paper: unbiased BLUE refinement, no shrinkage.",
        {"variant": "unb", "shrink": False, "ratio_var": "model"},
    ),
    (
        "basis_vop",
        "BASIS-VOP: variance-optimised shrinkage refinement.",
        {"variant": "vop"},
    ),
    (
        "basis_rvg",
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
        call_kernel=BasisKernel,
    )(_basis)

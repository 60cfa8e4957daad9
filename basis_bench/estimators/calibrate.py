"""Step 3 of BASIS: online calibration of the tilt beta on the current batch.

Each step picks beta_t from a grid by an in-batch loss (two readings of the paper):

    initial: L(beta) = mean_i loss(r_i, V^_{i,beta})   fit the tilt, then refine
    refined: L(beta) = mean_i loss(r_i, V~_{i,beta})   V~_i does not use r_i, so in
             expectation L = sigma_i^2 + MSE_i: unbiased, but nearly flat in beta

At extreme beta (1/beta large) the tilted variances s^2_j = V^_j (1 - V^_j) of most prompts
fall below eps, the active set empties, a few prompts carry the calibration ratio S1/S2 and
V~ collapses towards 0 or V^. (For binary rewards the relative weights
V^_j^2 / s^2_j = odds_j are only scaled by e^{1/beta}, so the ratio degrades through the
active set, not through the weights.) Candidates at which fewer than ``min_active`` of the
batch's prompts are active are excluded, unless every candidate is.
"""

from __future__ import annotations

import dataclasses
import math

from array_api_compat import array_namespace

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange, check_choice, check_rewards
from basis_bench.estimators.options import (
    CALIBRATIONS,
    CRITERIA,
    DEFAULT_EPS,
    DEFAULT_MIN_ACTIVE,
    LOSSES,
    BasisOptions,
)
from basis_bench.estimators.refine import _refine

__all__ = [
    "CALIBRATIONS",
    "CRITERIA",
    "DEFAULT_MIN_ACTIVE",
    "LOSSES",
    "active_fraction",
    "basis_estimate",
    "batch_loss",
    "estimate_with",
    "select_beta",
    "take_beta",
]
_LOG_CLIP = 1e-6


def active_fraction(var_grid: Array, eps: float = DEFAULT_EPS) -> Array:
    """Share of the batch's prompts in the active set {j : s^2_j > eps}, per candidate: (K, ...)."""
    xp = array_namespace(var_grid)
    return xp.mean(xp.astype(var_grid > eps, var_grid.dtype), axis=-1)


def batch_loss(pred: Array, rewards: Array, loss: str = "squared") -> Array:
    """Mean loss over the last (batch) axis; log-loss clips predictions into (0, 1)."""
    check_choice(loss, LOSSES, "loss")
    xp = array_namespace(pred)
    if loss == "squared":
        return xp.mean((rewards - pred) ** 2, axis=-1)
    p = xp.clip(pred, _LOG_CLIP, 1 - _LOG_CLIP)
    return -xp.mean(rewards * xp.log(p) + (1 - rewards) * xp.log1p(-p), axis=-1)


def _check_grid(v_grid: Array, rewards: Array, var_grid: Array | None) -> None:
    if v_grid.ndim < 2 or v_grid.shape[0] == 0:
        raise InputError(
            f"v_grid must be (K, ..., B) with K >= 1 candidate betas; got {tuple(v_grid.shape)}"
        )
    if tuple(v_grid.shape[1:]) != tuple(rewards.shape):
        raise InputError(
            f"shape mismatch: v_grid {tuple(v_grid.shape)} is not (K,) + rewards {tuple(rewards.shape)}"
        )
    if var_grid is not None and tuple(var_grid.shape) != tuple(v_grid.shape):
        raise InputError(
            f"shape mismatch: var_grid {tuple(var_grid.shape)} vs v_grid {tuple(v_grid.shape)}"
        )


def select_beta(
    v_grid: Array,
    rewards: Array,
    var_grid: Array | None = None,
    criterion: str = "initial",
    loss: str = "squared",
    variant: str = "unb",
    eps: float = DEFAULT_EPS,
    min_active: float = DEFAULT_MIN_ACTIVE,
    shrink: bool = True,
    reward_range: RewardRange = (0.0, 1.0),
    ratio_var: str = "robust",
) -> tuple[Array, Array]:
    """Index of the chosen beta per batch, and the (K, ...) losses it minimised.

    v_grid, var_grid: (K, ..., B) offline values and variances at each candidate beta;
    rewards: (..., B). Ties go to the earlier candidate.
    """
    check_choice(criterion, CRITERIA, "calibration criterion")
    check_choice(loss, LOSSES, "loss")
    _check_grid(v_grid, rewards, var_grid)
    check_rewards(rewards, reward_range)
    var = v_grid * (1 - v_grid) if var_grid is None else var_grid
    opts = _options(criterion, loss, variant, eps, min_active, shrink, ratio_var)
    return _select_beta(v_grid, var, rewards, opts)


def _options(
    criterion: str, loss: str, variant: str, eps: float, min_active: float, shrink: bool,
    ratio_var: str,
) -> BasisOptions:  # fmt: skip
    """The options that choose beta, as :func:`select_beta` and :func:`basis_estimate` take
    them one by one (checked here, where they are made)."""
    return BasisOptions(
        criterion=criterion, loss=loss, variant=variant, eps=eps, min_active=min_active,
        shrink=shrink, ratio_var=ratio_var,
    )  # fmt: skip


def _select_beta(
    v_grid: Array, var: Array, rewards: Array, opts: BasisOptions
) -> tuple[Array, Array]:
    """The kernel of :func:`select_beta`: inputs checked, ``var`` given."""
    xp = array_namespace(v_grid, rewards)
    r = xp.broadcast_to(rewards[None, ...], v_grid.shape)
    if opts.criterion == "initial":
        pred = v_grid
    else:
        pred = _refine(
            v_grid, r, opts.variant, opts.eps, var, opts.shrink, None, opts.ratio_var,
            opts.threshold,
        )  # fmt: skip
    losses = batch_loss(pred, r, opts.loss)
    if opts.min_active > 0:
        ok = active_fraction(var, opts.eps) >= opts.min_active
        ok = ok | ~xp.any(ok, axis=0, keepdims=True)  # never exclude every candidate
        losses = xp.where(ok, losses, math.inf)
    return xp.argmin(losses, axis=0), losses


def take_beta(grid: Array, index: Array) -> Array:
    """Gather grid[index[...], ..., b] for a (K, ..., B) grid and an index of shape (...)."""
    xp = array_namespace(grid, index)
    idx = xp.broadcast_to(index[None, ..., None], (1, *grid.shape[1:]))
    return xp.take_along_axis(grid, xp.astype(idx, xp.int64), axis=0)[0]


def basis_estimate(
    v_grid: Array,
    var_grid: Array | None,
    rewards: Array,
    calibration: str = "current",
    fixed_index: int | None = None,
    variant: str = "unb",
    criterion: str = "initial",
    loss: str = "squared",
    eps: float = DEFAULT_EPS,
    min_active: float = DEFAULT_MIN_ACTIVE,
    shrink: bool = True,
    clip: tuple[float, float] | None = None,
    refine_values: bool = True,
    reward_range: RewardRange = (0.0, 1.0),
    ratio_var: str = "robust",
) -> tuple[Array, Array]:
    """BASIS values (..., B) and the chosen beta index (...), for one or many batches.

    ``calibration``: ``current`` chooses beta on this batch; ``previous`` applies the beta
    chosen on the previous batch along the leading axis (batch t-1 for batch t, the first
    batch taking the last one's; this keeps Proposition 1's independence); ``fixed`` uses
    ``fixed_index``. ``refine_values=False`` returns the offline V^ at the chosen beta.
    """
    check_choice(calibration, CALIBRATIONS, "calibration")
    _check_grid(v_grid, rewards, var_grid)
    check_rewards(rewards, reward_range)
    chosen = _options(criterion, loss, variant, eps, min_active, shrink, ratio_var)
    opts = dataclasses.replace(chosen, clip=clip, refine=refine_values)
    return estimate_with(v_grid, var_grid, rewards, opts, calibration, fixed_index, reward_range)


def estimate_with(
    v_grid: Array,
    var_grid: Array | None,
    rewards: Array,
    opts: BasisOptions,
    calibration: str | None = None,
    fixed_index: int | None = None,
    reward_range: RewardRange = (0.0, 1.0),
) -> tuple[Array, Array]:
    """:func:`basis_estimate` with its options as a :class:`BasisOptions`, on checked rewards.

    ``calibration`` overrides ``opts.calibration``; ``fixed`` needs the grid index
    ``fixed_index`` (callers map ``opts.fixed_beta`` onto their grid). With ``opts.shrink``
    (the robust default) a refined value outside the open reward range falls back to the
    offline V^, which the smoothed tilt keeps strictly inside it.
    """
    calibration = opts.calibration if calibration is None else calibration
    xp = array_namespace(v_grid, rewards)
    var = v_grid * (1 - v_grid) if var_grid is None else var_grid
    if calibration == "fixed":
        if fixed_index is None or not -v_grid.shape[0] <= fixed_index < v_grid.shape[0]:
            raise InputError(
                f"fixed calibration needs fixed_index in [0, {v_grid.shape[0]}); got {fixed_index}"
            )
        index = xp.full(tuple(rewards.shape[:-1]), fixed_index % v_grid.shape[0], dtype=xp.int64)
    else:
        index, _ = _select_beta(v_grid, var, rewards, opts)
        if calibration == "previous":
            if rewards.ndim < 2:
                raise InputError(
                    "previous calibration over arrays needs a leading batch axis; use Basis for a stream"
                )
            index = xp.roll(index, 1, axis=0)
    v = take_beta(v_grid, index)
    if not opts.refine:
        return v, index
    s2 = take_beta(var, index)
    out = _refine(
        v, rewards, opts.variant, opts.eps, s2, opts.shrink, opts.clip, opts.ratio_var,
        opts.threshold,
    )  # fmt: skip
    if opts.shrink and reward_range is not None:
        inside = (out > reward_range[0]) & (out < reward_range[1])
        out = xp.where(inside | ~((v > reward_range[0]) & (v < reward_range[1])), out, v)
    return out, index

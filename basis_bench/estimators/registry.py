"""Name -> estimator registry, in the style of verl's advantage-estimator registry.

Every registered estimator has one uniform call, ``est(batch, **options)``, that maps an
:class:`EstimatorInput` to baselines of shape (..., B, G), one per rollout, so the
benchmark and the training loop can treat them alike. Register your own with::

    @register_estimator("my_baseline", group=False, uses_cache=True)
    def my_baseline(batch: EstimatorInput, **options) -> Array: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange
from basis_bench.estimators.baselines import grpo, reinforce_pp, rloo, vanilla
from basis_bench.estimators.calibrate import basis_estimate


@dataclass(frozen=True)
class EstimatorInput:
    """One step's data, batched over any leading axes ``...``.

    rewards: (..., B, G) rewards of this step's rollouts (G = 1 for one rollout per prompt).
    v_grid, var_grid: (K, ..., B) offline tilted values and reward variances of the batch's
    prompts, one row per candidate beta in ``betas`` (K,); None for estimators that need
    no reference cache.
    """

    rewards: Array
    v_grid: Array | None = None
    var_grid: Array | None = None
    betas: Array | None = None
    reward_range: RewardRange = (0.0, 1.0)


EstimatorFn = Callable[..., Array]


@dataclass(frozen=True)
class Estimator:
    """A registered value estimator: its function, what data it needs and its defaults."""

    name: str
    fn: EstimatorFn
    group: bool
    uses_cache: bool
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)

    def rollouts_per_prompt(self, group_size: int) -> int:
        """Rollouts each prompt needs per step: G for group estimators, else 1."""
        return group_size if self.group else 1

    def __call__(self, batch: EstimatorInput, **options: Any) -> Array:
        if self.uses_cache and batch.v_grid is None:
            raise InputError(
                f"estimator {self.name!r} needs the reference cache (v_grid) in its input"
            )
        if not self.group and batch.rewards.shape[-1] != 1:
            raise InputError(
                f"estimator {self.name!r} takes one rollout per prompt; got G={batch.rewards.shape[-1]}"
            )
        return self.fn(batch, **{**self.defaults, **options})


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str,
    *,
    group: bool = False,
    uses_cache: bool = False,
    description: str | None = None,
    **defaults: Any,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register ``fn(batch, **options) -> (..., B, G)`` under ``name``.

    ``defaults`` are options passed to ``fn`` on every call (a call's options override
    them), so one function can back several named variants. The description defaults to
    the first line of ``fn``'s docstring.
    """

    def wrap(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered")
        doc = (fn.__doc__ or "").strip().splitlines()
        text = description if description is not None else (doc[0] if doc else "")
        ESTIMATORS[name] = Estimator(name, fn, group, uses_cache, text, dict(defaults))
        return fn

    return wrap


def get(name: str) -> Estimator:
    """The registered estimator called ``name``; a clear error lists the known ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise InputError(
            f"unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}"
        ) from None


def _single(batch: EstimatorInput) -> Array:
    return batch.rewards[..., 0]


@register_estimator("vanilla")
def _vanilla(batch: EstimatorInput) -> Array:
    """REINFORCE: zero baseline."""
    return vanilla(batch.rewards, batch.reward_range)


@register_estimator("reinforce_pp")
def _reinforce_pp(batch: EstimatorInput) -> Array:
    """REINFORCE++: mean of all B rewards in the batch."""
    return reinforce_pp(_single(batch), batch.reward_range)[..., None]


@register_estimator("grpo", group=True)
def _grpo(batch: EstimatorInput) -> Array:
    """GRPO(G): mean of the prompt's G rewards."""
    return grpo(batch.rewards, batch.reward_range)


@register_estimator("rloo", group=True)
def _rloo(batch: EstimatorInput) -> Array:
    """RLOO(G): mean of the prompt's other G - 1 rewards."""
    return rloo(batch.rewards, batch.reward_range)


@register_estimator("reference_mean", uses_cache=True)
def _reference_mean(batch: EstimatorInput) -> Array:
    """Smoothed reference success rate (beta = inf, no refinement)."""
    assert batch.v_grid is not None
    if batch.betas is None:
        raise InputError("reference_mean needs the beta grid (betas) in its input")
    betas = np.asarray(batch.betas.cpu() if hasattr(batch.betas, "cpu") else batch.betas)
    inf = np.flatnonzero(np.isinf(betas))
    if inf.size == 0:
        raise InputError("reference_mean needs beta = inf in the grid")
    return batch.v_grid[int(inf[0]), ..., None]


def _basis(batch: EstimatorInput, **options: Any) -> Array:
    assert batch.v_grid is not None
    values, _ = basis_estimate(
        batch.v_grid, batch.var_grid, _single(batch), reward_range=batch.reward_range, **options
    )
    return values[..., None]


for _name, _text, _opts in (
    (
        "offline",
        "Offline tilted value V^ at the calibrated beta, no refinement.",
        {"refine_values": False},
    ),
    ("basis", "BASIS (UNB): unbiased BLUE refinement at the calibrated beta.", {"variant": "unb"}),
    ("basis_vop", "BASIS-VOP: variance-optimised shrinkage refinement.", {"variant": "vop"}),
    ("basis_rvg", "BASIS-RVG: ratio-average value-guided refinement.", {"variant": "rvg"}),
):
    register_estimator(_name, uses_cache=True, description=_text, **_opts)(_basis)

"""One estimator for a stream of training steps: the one interface of stateful estimators.

:func:`make_step_estimator` turns a registered name, its options and (for cache
estimators) the reference cache into a :class:`StepEstimator`, called once per step with
the batch's prompt ids and rewards (B, G). Whatever the estimator, the state it carries
across steps lives in the step estimator as named numpy arrays, so the training loop, the
verl/TRL plug-ins and trajectory replay handle every estimator alike:

* ``est(prompt_ids, rewards)``: one step of one stream (rewards (B, G));
* ``est.step_columns(cols, rewards)``: one step of R independent streams at once, cols
  (R, B) table columns and rewards (R, B, G) (trajectory replay vectorises repeats so);
* ``est.state_dict()`` / ``est.load_state_dict(state)``: the state, for checkpoints;
* ``est.reset(lead)``: back to the initial state, for ``lead`` parallel streams.

The computation of one step is the :class:`~basis_bench.estimators.kernel.StepKernel` that
the registry entry makes (``est.kernel(est, options, table, ref_rewards, reward_range)``):
``initial_state(lead)`` and ``step(state, cols, rewards)``, which updates the state in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import (
    Array,
    RewardRange,
    as_rewards,
    as_step_rewards,
    check_reference,
    to_numpy,
)
from basis_bench.estimators.kernel import StepKernel
from basis_bench.estimators.options import DEFAULT_PRIOR, BasisOptions
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import Estimator, get
from basis_bench.estimators.table import TiltTable


class StepEstimator:
    """``est(prompt_ids, rewards)``: baselines for one step's rewards (B, G), state carried."""

    def __init__(
        self,
        estimator: Estimator,
        options: Any,
        kernel: StepKernel,
        table: TiltTable | None = None,
        reward_range: RewardRange = (0.0, 1.0),
        lead: tuple[int, ...] = (),
    ) -> None:
        self.estimator = estimator
        self.options = options
        self.kernel = kernel
        self.table = table
        self.reward_range = reward_range
        self.lead = tuple(lead)
        self.state = kernel.initial_state(self.lead)
        # the largest state made and its streams: reset writes into it (or its first streams)
        self._room, self._room_lead = self.state, self.lead

    @property
    def carries_state(self) -> bool:
        """Whether anything is carried from one step to the next: a state, unless the
        kernel says its options leave it unused (its own ``carries_state``, see
        :class:`~basis_bench.estimators.kernel.StepKernel`). Not ``Estimator.stateful``
        (no one-step call): BASIS with ``previous`` calibration carries state, yet has one."""
        return bool(self.state) and getattr(self.kernel, "carries_state", True)

    def reset(self, lead: tuple[int, ...] | None = None) -> None:
        """The initial state, for ``lead`` parallel streams (default: as before). Where the
        kernel can (``reset_state``) it is written into the largest state made so far, or
        into its first streams for fewer: a replay that restarts its streams pass after
        pass then allocates once (a copy of an old state is :meth:`state_dict`'s)."""
        lead = self.lead if lead is None else tuple(lead)
        refill = getattr(self.kernel, "reset_state", None)
        if refill is not None and self._room and _fits(lead, self._room_lead):
            self.state = {k: v[: lead[0]] for k, v in self._room.items()} if lead else self._room
            refill(self.state)
        else:
            self.state = self._room = self.kernel.initial_state(lead)
            self._room_lead = lead
        self.lead = lead

    def state_dict(self) -> dict[str, np.ndarray]:
        """A copy of the state: named numpy arrays (empty for a stateless estimator)."""
        return {k: v.copy() for k, v in self.state.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; names, shapes and dtypes must match this estimator's."""
        fresh = self.kernel.initial_state(self.lead)
        if set(state) != set(fresh):
            raise InputError(
                f"state of {self.estimator.name!r} has keys {sorted(fresh)}; got {sorted(state)}"
            )
        loaded = {}
        for key, init in fresh.items():
            value = np.asarray(state[key], dtype=init.dtype)
            if value.shape != init.shape:
                raise InputError(
                    f"state {key!r} of {self.estimator.name!r} must have shape {init.shape}; "
                    f"got {value.shape} (another cache or number of streams?)"
                )
            loaded[key] = value.copy()
        self.state = self._room = loaded
        self._room_lead = self.lead

    @property
    def previous_index(self) -> int | None:
        """BASIS's ``previous`` calibration state (one stream), else None."""
        index = self.state.get("previous_index")
        return None if index is None or index.ndim else int(index)

    @previous_index.setter
    def previous_index(self, index: int) -> None:
        if "previous_index" in self.state:
            self.state["previous_index"][...] = int(index)

    def columns(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """Table columns of a batch's prompts (the step's ``cols``)."""
        if self.table is None:
            return np.arange(len(prompt_ids), dtype=np.int64)
        return self.table.columns(list(prompt_ids))

    def __call__(self, prompt_ids: Sequence[str], rewards: Any) -> StepOutput:
        """One step: rewards (B, G), one row per prompt id, or (B,) for one rollout each
        (baselines then (B,) too)."""
        if self.lead:
            raise InputError(
                f"this step estimator runs {self.lead} parallel streams; use step_columns"
            )
        rewards = as_rewards(rewards)
        if rewards.ndim not in (1, 2) or rewards.shape[0] != len(prompt_ids):
            raise InputError(
                f"rewards must be ({len(prompt_ids)}, G), one row per prompt id (or "
                f"({len(prompt_ids)},), one each); got {tuple(rewards.shape)}"
            )
        if rewards.ndim == 2:
            return self.step_columns(self.columns(prompt_ids), rewards)
        out = self.step_columns(self.columns(prompt_ids), rewards[:, None])
        return replace(out, baselines=out.baselines[:, 0])

    def step_columns(self, cols: np.ndarray, rewards: Array) -> StepOutput:
        """One step of every stream: cols (*lead, B) columns, rewards (*lead, B, G)."""
        rewards = as_step_rewards(rewards)
        cols = np.asarray(cols, dtype=np.int64)
        if tuple(rewards.shape[:-1]) != cols.shape or cols.shape[:-1] != self.lead:
            raise InputError(
                f"rewards {tuple(rewards.shape)} must be cols {cols.shape} + (G,), cols "
                f"{self.lead} + (B,)"
            )
        if not self.estimator.group and rewards.shape[-1] != 1:
            raise InputError(
                f"{self.estimator.name} takes one rollout per prompt: rewards (B, 1); "
                f"got {tuple(rewards.shape)}"
            )
        return self.kernel.step(self.state, cols, rewards)


def make_step_estimator(
    name: str,
    options: Mapping[str, Any] | Any = None,
    *,
    prompt_ids: Sequence[str] | None = None,
    ref_rewards: Array | None = None,
    betas: Sequence[float] | np.ndarray | None = None,
    prior: float = DEFAULT_PRIOR,
    reward_range: RewardRange = (0.0, 1.0),
    lead: tuple[int, ...] = (),
    features: Array | None = None,
) -> StepEstimator:
    """A :class:`StepEstimator` for the registered estimator ``name``.

    ``options``: its options object or a ``{key: value}`` mapping, validated against its
    options dataclass (an unknown key names the valid ones). Cache estimators need
    ``prompt_ids`` and ``ref_rewards`` (P, n); ``betas`` (default grid) and ``prior`` shape
    their tilt table (BASIS with ``calibration="fixed"`` uses the grid ``[fixed_beta]``).
    ``lead``: parallel streams (trajectory replay), () for one. ``features`` (P, d): one
    row per cached prompt, for ``basis_context`` (None: it runs as ``basis_memory``).
    """
    est = get(name)
    opts = est.parse_options(options)
    if not est.uses_cache:
        kernel = est.kernel(est, opts, None, None, reward_range)
        return StepEstimator(est, opts, kernel, None, reward_range, lead)
    if prompt_ids is None or ref_rewards is None:
        raise InputError(
            f"estimator {name!r} needs the reference cache: prompt_ids and ref_rewards"
        )
    if isinstance(opts, BasisOptions) and opts.calibration == "fixed":
        betas = [opts.fixed_beta]  # type: ignore[list-item]
    ref = to_numpy(ref_rewards, dtype=np.float64)
    check_reference(ref, reward_range)
    table = TiltTable.from_cache(ref, betas, prior, prompt_ids, features)
    kernel = est.kernel(est, opts, table, ref, reward_range)
    return StepEstimator(est, opts, kernel, table, reward_range, lead)


def _fits(lead: tuple[int, ...], room: tuple[int, ...]) -> bool:
    """Whether streams ``lead`` are the first of a state for ``room``: the same but for as
    many or fewer along the first axis."""
    return len(lead) == len(room) and lead[1:] == room[1:] and (not lead or lead[0] <= room[0])

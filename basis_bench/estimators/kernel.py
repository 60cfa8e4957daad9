"""One step's computation: the input of a one-step estimator and the step-kernel contract.

Every registered estimator is a factory of a :class:`StepKernel`:
``factory(estimator, options, table, ref_rewards, reward_range)``. A kernel's
``initial_state(lead)`` is a dict of numpy arrays with leading axes ``lead`` (parallel
streams) and ``step(state, cols, rewards)`` computes one step's baselines from the batch's
table columns (*lead, B) and rewards (*lead, B, G), updating the state in place. An
estimator registered with a one-step function gets :class:`StatelessKernel` (no state:
the function on the batch's columns of the shared tilt table); the BASIS family its own
(``previous`` calibration carries a grid index); stateful estimators register theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from basis_bench.estimators._array import Array, RewardRange
from basis_bench.estimators.output import StepOutput

if TYPE_CHECKING:
    from basis_bench.estimators.table import TiltTable

State = dict[str, np.ndarray]


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


class StepKernel(Protocol):
    """One step's computation; the state is a dict of numpy arrays with leading axes ``lead``.

    A kernel whose options may leave its state unused says so with a ``carries_state``
    property (BASIS: only ``previous`` calibration); without one, a kernel with a state
    carries it (:attr:`~basis_bench.estimators.step.StepEstimator.carries_state`). A kernel
    with a large state may also have ``reset_state(state)``, which writes the initial state
    into one that ``initial_state`` made, in place: a replay that restarts its streams
    then reuses their memory, where a fresh state costs the system a page fault per 4 KiB."""

    def initial_state(self, lead: tuple[int, ...]) -> State: ...

    def step(self, state: State, cols: np.ndarray, rewards: Array) -> StepOutput: ...


def batch_input(
    table: TiltTable | None, cols: np.ndarray, rewards: Array, reward_range: RewardRange
) -> EstimatorInput:
    """The one-step input of a batch: rewards and, with a table, the batch's grids."""
    if table is None:
        return EstimatorInput(rewards, reward_range=reward_range)
    v, var = table.gather(cols, like=rewards)
    return EstimatorInput(rewards, v, var, table.betas, reward_range)


class StatelessKernel:
    """A one-step estimator: no state, its registered call on the batch."""

    def __init__(
        self,
        estimator: Any,
        options: Any,
        table: TiltTable | None,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        self.estimator, self.options, self.table = estimator, options, table
        self.reward_range = reward_range

    def initial_state(self, lead: tuple[int, ...]) -> State:
        return {}

    def step(self, state: State, cols: np.ndarray, rewards: Array) -> StepOutput:
        inputs = batch_input(self.table, cols, rewards, self.reward_range)
        return StepOutput(self.estimator(inputs, self.options))

"""``basis_context``: ``basis_memory`` whose tilt may shift each prompt by what the prompt is.

BASIS moves every prompt's log-odds by one shift 1/beta. Prompts that look alike drift
alike, so the context tilt adds a prompt-dependent shift (docs/method.md, "A tilt that
depends on the prompt"):

    logit V^c_{i,beta} = logit V^_{i,beta} + w . phi_i

phi_i: the prompt's features (``TiltTable.features``), standardised over the cached
prompts (mean 0: the batch-wide part of the shift stays beta's). w comes from a ridge
logistic regression of the rewards on phi with the reference log-odds as offset and a free
intercept a (the shift of the whole batch, not used in V^c):

    P(r = 1 | x_i) = sigmoid(o_i + a + w . phi_i),   o_i = logit V^_{i, beta = inf}

fitted on the discounted history of every prompt's rewards (per-prompt counts S^f, N^f,
discounted by ``fit_memory`` per step) plus the current batch LEAVE-ONE-OUT: prompt i's w
is one Newton step from the history's fit theta on the history and the batch without
prompt i, theta_{-i} = theta + (H - c_i x_i x_i^T)^{-1} (g - e_i x_i), written in closed
form by Sherman-Morrison, O(B d) per stream after one d x d inverse. So b_i never uses r_i.

The context values enter ``basis_memory``'s calibration as a second prior per beta: the
candidates are (prior in {tilt, context tilt}, beta, gamma, m, delta), chosen by the same
accumulated leave-one-out losses. With phi = 0 the two priors coincide and the choice
(ties go to the plain tilt, listed first) is ``basis_memory``'s, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange
from basis_bench.estimators.memory import MemoryKernel, MemoryOptions
from basis_bench.estimators.registry import EstimatorInput, register_estimator
from basis_bench.estimators.table import TiltTable
from basis_bench.settings import check_settings, setting

FIT_MEMORY = 0.9
RIDGE = 4.0
INTERCEPT_RIDGE = 1e-3  # the batch-wide shift: almost free, it is beta's job
NEWTON_STEPS = 2  # per step on the history, warm-started: the fit tracks a moving policy
MAX_SHIFT = 8.0  # |w . phi| cap: the context tilt never moves a prompt beyond beta's range


@dataclass(frozen=True)
class ContextOptions(MemoryOptions):
    """Options of ``basis_context``: ``basis_memory``'s, and how the prompt shift is fitted."""

    estimator: ClassVar[str] = "basis_context"
    ridge: float = setting(
        RIDGE,
        help="Ridge penalty on w, > 0 (features are standardised; one rollout adds at most "
        "0.25 to the curvature).",
        min_val=0.0,
        include_boundaries="right",
    )
    fit_memory: float = setting(
        FIT_MEMORY,
        help="Per-step discount in [0, 1] of the rewards the shift is fitted on "
        "(0: the current batch alone).",
        min_val=0.0,
        max_val=1.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_settings(self, lambda name: f"{self.estimator}.{name}")


def standardised(features: np.ndarray | None, n_prompts: int) -> np.ndarray:
    """Design rows x_i = [1, (phi_i - mean) / std] (P, 1 + d); constant columns become 0."""
    if features is None:
        return np.ones((n_prompts, 1))
    sd = features.std(axis=0)
    z = np.divide(features - features.mean(axis=0), sd, out=np.zeros_like(features), where=sd > 0)
    return np.concatenate([np.ones((n_prompts, 1)), z], axis=1)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def shift_tilt(v: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """sigmoid(logit v + shift) = 1 / (1 + e^-shift (1 - v) / v), exact at v = 0 or 1 and
    v itself, bit for bit, where shift = 0."""
    with np.errstate(divide="ignore"):
        return np.where(shift == 0.0, v, 1.0 / (1.0 + np.exp(-shift) * (1.0 - v) / v))


class ContextKernel(MemoryKernel):
    """``basis_context`` on the step interface: ``basis_memory`` with a second, prompt-shifted
    prior per beta and the ridge-logistic fit of the shift as extra state."""

    def __init__(
        self,
        estimator: Any,
        options: ContextOptions,
        table: TiltTable | None,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        super().__init__(estimator, options, table, ref_rewards, reward_range)
        assert self.table is not None  # the parent refused a missing table
        self.fit_options = options
        self.x = standardised(self.table.features, self.n_prompts)
        inf = self.table.inf_index
        self.offset = _logit(self.table.values[0 if inf is None else inf])
        self.penalty = np.full(self.x.shape[1], options.ridge)
        self.penalty[0] = INTERCEPT_RIDGE

    @property
    def n_priors(self) -> int:
        """Two priors per beta: the tilt, then the context tilt."""
        return 2 * len(self.table.betas)

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        state = super().initial_state(lead)
        state["fit_successes"] = np.zeros((*lead, self.n_prompts))
        state["fit_visits"] = np.zeros((*lead, self.n_prompts))
        state["coef"] = np.zeros((*lead, self.x.shape[1]))
        return state

    def _history(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Gradient (*lead, D) and Hessian (*lead, D, D) of the penalised history
        log-likelihood at the state's coefficients (negative Hessian: positive definite)."""
        theta = state["coef"]
        s = _sigmoid(self.offset + theta @ self.x.T)  # (*lead, P)
        resid = state["fit_successes"] - state["fit_visits"] * s
        grad = resid @ self.x - self.penalty * theta
        curv = state["fit_visits"] * s * (1.0 - s)
        hess = np.einsum("...p,pd,pe->...de", curv, self.x, self.x, optimize=True)
        hess += np.diag(self.penalty)
        return grad, hess

    def context_shift(
        self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray
    ) -> np.ndarray:
        """w_{-i} . phi_i for the batch (*lead, B): one leave-one-out Newton step each."""
        theta = state["coef"]
        grad, hess = self._history(state)
        xb = self.x[cols]  # (*lead, B, D)
        sb = _sigmoid(self.offset[cols] + np.einsum("...bd,...d->...b", xb, theta))
        e, c = r - sb, sb * (1.0 - sb)
        grad = grad + np.einsum("...b,...bd->...d", e, xb)
        hess = hess + np.einsum("...b,...bd,...be->...de", c, xb, xb)
        h_inv = np.linalg.inv(hess)
        hx = np.einsum("...de,...be->...bd", h_inv, xb)  # H^-1 x_i
        hg = np.einsum("...de,...e->...d", h_inv, grad)  # H^-1 g
        q = np.einsum("...bd,...bd->...b", xb, hx)  # x_i' H^-1 x_i
        a = np.einsum("...bd,...d->...b", hx, grad)  # x_i' H^-1 g
        phi = xb[..., 1:]  # v_i = (0, phi_i): the shift leaves the intercept out
        t = np.einsum("...bd,...bd->...b", phi, hx[..., 1:])
        vhg = np.einsum("...bd,...d->...b", phi, hg[..., 1:])
        now = np.einsum("...bd,...d->...b", phi, theta[..., 1:])
        shift = now + vhg - e * t + c * t * (a - e * q) / (1.0 - c * q)
        return np.clip(shift, -MAX_SHIFT, MAX_SHIFT)

    def priors(self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray) -> np.ndarray:
        """(2K, *lead, B): the K tilted values, then each shifted by the prompt's w_{-i} . phi_i."""
        v = self.table.gather(cols)[0]
        return np.concatenate([v, shift_tilt(v, self.context_shift(state, cols, r))])

    def learn(self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray) -> None:
        """Discount the fit's counts, add the batch, refit theta by Newton steps on them."""
        lam = self.fit_options.fit_memory
        for key, add in (("fit_successes", r), ("fit_visits", 1.0)):
            state[key] *= lam
            past = np.take_along_axis(state[key], cols, axis=-1)
            np.put_along_axis(state[key], cols, past + add, axis=-1)
        for _ in range(NEWTON_STEPS):
            grad, hess = self._history(state)
            state["coef"] += np.linalg.solve(hess, grad[..., None])[..., 0]


def _logit(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p) - np.log1p(-p)


@register_estimator("basis_context", uses_cache=True, options=ContextOptions, kernel=ContextKernel)
def _basis_context(batch: EstimatorInput, options: ContextOptions) -> Array:
    """BASIS context: basis_memory with a prompt-dependent tilt w . phi(x), w fitted leave-one-out."""
    raise InputError("basis_context is stateful; use make_step_estimator or trajectory replay")

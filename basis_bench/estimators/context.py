"""``basis_context``: ``basis_memory`` with a second copy of its grid, each prompt's log-odds
moved by an online logistic fit of how the batch departs from its history, by what the
prompt is (docs/method.md, "A one-rollout estimator that conditions on the prompt").

``basis_memory``'s candidates give b_i(c) = sigmoid(logit p^_i(c) + delta). Here every
candidate comes twice: as it is, and moved by a per-prompt shift

    b~_i(c) = sigmoid(logit b_i(c) + a_{-i} + w_{-i} . phi_i)

phi_i: the prompt's features (``TiltTable.features``, standardised over the cached
prompts; none: the intercept alone). (a, w) = theta is a ridge logistic regression of the
rewards with the stream's best candidate's posterior as offset,

    P(r_j = 1) = sigmoid(o_j + x_j . theta),  x_j = (1, phi_j),  o_j = logit b_j(c*),
    c* = the unmoved candidate of least accumulated loss (history only),

fitted online: the history enters as its discounted curvature H (``fit_memory`` per step;
an online Newton method, the history's gradient taken as 0 at the running theta), the
current batch LEAVE-ONE-OUT: prompt i gets one Newton step on the batch without itself,
theta_{-i} = theta + (H + R + sum_{j != i} c_j x_j x_j')^-1 (sum_{j != i} e_j x_j - R theta),
in closed form by Sherman-Morrison (O(B D) per stream after one D x D inverse). So b~_i
never uses r_i. The calibration (``basis_memory``'s accumulated leave-one-out losses)
chooses among the 2C candidates. ``lag=false`` moves by w . phi alone; with phi = 0 the
copies then coincide and the choice (ties go to the unmoved copy) is ``basis_memory``'s,
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from basis_bench.estimators._array import RewardRange
from basis_bench.estimators.memory import History, MemoryKernel, MemoryOptions
from basis_bench.estimators.registry import register_estimator
from basis_bench.estimators.table import TiltTable
from basis_bench.estimators.tilt import sigmoid
from basis_bench.settings import setting

FIT_MEMORY = 0.9
RIDGE = 4.0
INTERCEPT_RIDGE = 1e-3  # the batch-wide lag a: almost free
WIDE = 64  # features wider than this are a model's state (hand-made ones are narrower)
# ... and enter as this many principal components. On the default data SmolLM2's 576-wide
# states cost 4% at 64 components, 1.5% at 8-16, nothing at 4 (ridge 4; docs/results.md):
# 16 binary rewards a step cannot fit more directions.
COMPONENTS = 4
MAX_SHIFT = 8.0  # |shift| cap: never 0/1 in float64, whatever the fit does


@dataclass(frozen=True)
class ContextOptions(MemoryOptions):
    """Options of ``basis_context``: ``basis_memory``'s, and how the per-prompt shift is fitted."""

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
    components: int = setting(
        COMPONENTS,
        help=f"Features wider than {WIDE} columns (a model's hidden state) enter as this many "
        "leading principal components over the cached prompts, each of variance 1 (no reward "
        "is looked at).",
        min_val=1,
    )
    lag: bool = setting(
        True,
        help="Move the second copy by the fitted intercept too (the batch's lag behind its "
        "history, learned online); false: by w . phi alone (phi = 0 is then basis_memory).",
        choices=(True, False),
    )


def standardised(
    features: np.ndarray | None, n_prompts: int, components: int = COMPONENTS
) -> np.ndarray:
    """Design rows x_i = [1, z_i] (P, 1 + d): z the features standardised over the prompts
    (constant columns 0); more than ``WIDE`` columns (a hidden state) are first reduced to
    their ``components`` leading principal components, each rescaled to variance 1. Neither
    step looks at a reward."""
    if features is None:
        return np.ones((n_prompts, 1))
    z = _unit_variance(features - features.mean(axis=0))
    if z.shape[1] > WIDE:
        u, sv, _ = np.linalg.svd(z, full_matrices=False)
        z = _unit_variance(u[:, :components] * sv[:components])
    return np.concatenate([np.ones((n_prompts, 1)), z], axis=1)


def _unit_variance(z: np.ndarray) -> np.ndarray:
    sd = z.std(axis=0)
    return np.divide(z, sd, out=np.zeros_like(z), where=sd > 1e-12 * max(1.0, sd.max(initial=0)))


class ShiftFit(NamedTuple):
    """One step's fit: the batch's leave-one-out shifts and the batch terms of the update."""

    judged: np.ndarray  # (*lead, B) v_i . theta: the history's fit, what the choice sees
    served: np.ndarray  # (*lead, B) v_i . theta_{-i}: with the batch, leave-one-out
    x: np.ndarray  # (*lead, B, D) design rows of the batch
    resid: np.ndarray  # (*lead, B) r_j - sigmoid(o_j + x_j . theta)
    curv: np.ndarray  # (*lead, B) sigmoid' at the same point


class ContextKernel(MemoryKernel):
    """``basis_context`` on the step interface: ``basis_memory``'s grid twice, the second copy
    moved by each prompt's a + w . phi (leave-one-out when served); the online logistic fit
    (theta and the history's curvature) as extra state."""

    variants = 2

    def __init__(
        self,
        estimator: Any,
        options: ContextOptions,
        table: TiltTable | None,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        super().__init__(estimator, options, table, ref_rewards, reward_range)
        self.fit_memory, self.lag = options.fit_memory, options.lag
        self.x = standardised(self.table.features, self.n_prompts, options.components)
        self.penalty = np.full(self.x.shape[1], options.ridge)
        self.penalty[0] = INTERCEPT_RIDGE

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        state = super().initial_state(lead)
        d = self.x.shape[1]
        state["fit_curvature"] = np.zeros((*lead, d, d))
        state["coef"] = np.zeros((*lead, d))
        return state

    def offsets(self, state: dict[str, np.ndarray], history: History) -> np.ndarray:
        """logit of each prompt's posterior (*lead, B) under the stream's best unmoved
        candidate so far (least accumulated loss; history only)."""
        best = np.argmin(state["losses"][..., : self.n_candidates // 2], axis=-1)
        k, g, m, d = np.unravel_index(best, self.grid)
        v = np.take_along_axis(history.v, k[None, ..., None], axis=0)[0]
        s = np.take_along_axis(history.s, g[..., None, None], axis=-2)[..., 0, :]
        n = np.take_along_axis(history.n, g[..., None, None], axis=-2)[..., 0, :]
        weight = np.asarray(self.options.weights)[m][..., None]
        delta = np.asarray(self.options.shifts)[d][..., None]
        p = (weight * v + s) / (weight + n)
        with np.errstate(divide="ignore"):
            return np.log(p) - np.log1p(-p) + delta

    def fit_shift(
        self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray, history: History
    ) -> ShiftFit:
        """w_{-i} . phi_i (*lead, B): one Newton step from theta on the discounted history's
        curvature and the batch without prompt i, by Sherman-Morrison."""
        theta = state["coef"]
        xb = self.x[cols]  # (*lead, B, D)
        sb = sigmoid(self.offsets(state, history) + np.einsum("...bd,...d->...b", xb, theta))
        e, c = r - sb, sb * (1.0 - sb)
        grad = np.einsum("...b,...bd->...d", e, xb) - self.penalty * theta
        hess = self.fit_memory * state["fit_curvature"] + np.diag(self.penalty)
        hess = hess + np.einsum("...b,...bd,...be->...de", c, xb, xb)
        h_inv = np.linalg.inv(hess)
        hx = np.einsum("...de,...be->...bd", h_inv, xb)  # H^-1 x_i
        hg = np.einsum("...de,...e->...d", h_inv, grad)  # H^-1 g
        q = np.einsum("...bd,...bd->...b", xb, hx)  # x_i' H^-1 x_i
        a = np.einsum("...bd,...d->...b", hx, grad)  # x_i' H^-1 g
        j = 0 if self.lag else 1  # the shift is v_i . theta_{-i}, v_i = x_i or (0, phi_i)
        phi = xb[..., j:]
        t = np.einsum("...bd,...bd->...b", phi, hx[..., j:])
        vhg = np.einsum("...bd,...d->...b", phi, hg[..., j:])
        now = np.einsum("...bd,...d->...b", phi, theta[..., j:])
        shift = now + vhg - e * t + c * t * (a - e * q) / (1.0 - c * q)
        clip = (-MAX_SHIFT, MAX_SHIFT)
        return ShiftFit(np.clip(now, *clip), np.clip(shift, *clip), xb, e, c)

    def shift_of(self, fit: ShiftFit) -> tuple[np.ndarray, np.ndarray]:
        return fit.judged, fit.served

    def learn(self, state: dict[str, np.ndarray], fit: ShiftFit) -> None:
        """H <- lambda H + sum_j c_j x_j x_j';  theta <- theta + (H + ridge)^-1 (sum_j e_j x_j
        - ridge theta): the online Newton step on the whole batch."""
        curv = state["fit_curvature"]
        curv *= self.fit_memory
        curv += np.einsum("...b,...bd,...be->...de", fit.curv, fit.x, fit.x)
        grad = np.einsum("...b,...bd->...d", fit.resid, fit.x) - self.penalty * state["coef"]
        step = np.linalg.solve(curv + np.diag(self.penalty), grad[..., None])[..., 0]
        state["coef"] += step


register_estimator(
    "basis_context",
    uses_cache=True,
    options=ContextOptions,
    kernel=ContextKernel,
    uses_features=True,
    description="BASIS context: basis_memory plus its candidates moved by an online fit of the "
    "lag and w . phi(x).",
    reward_bounds=(0.0, 1.0),
)

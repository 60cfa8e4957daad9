"""BASIS in one file: the paper's estimator end to end, numpy only (docs/method.md).

A reading aid, not the package: no input checks, one stream, rewards (B,) one per prompt.
tests/test_basis_in_one_file.py checks it against ``make_step_estimator("basis_paper")``
to 1e-12. The package's default ``basis`` also shrinks the calibration ratio towards 1
(docs/method.md, "A robust default"); this file is the paper's BLUE without shrinkage.

    est = BasisReference(prompt_ids, ref_rewards)   # ref_rewards (P, n), NaN = missing
    baselines, beta = est(batch_ids, rewards)       # advantages = rewards - baselines
"""

from __future__ import annotations

import numpy as np


def default_betas(k: int = 32) -> np.ndarray:
    """K betas log-spaced over [0.05, 50], largest first, then beta = inf."""
    return np.concatenate([np.geomspace(50.0, 0.05, k), [np.inf]])


# Step 1: the offline value under a KL tilt, V_beta = E_ref[r e^{r/beta}] / E_ref[e^{r/beta}]
def tilt(ref: np.ndarray, betas: np.ndarray, prior: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Tilted values and reward variances of P cached prompts at K betas: (K, P) each."""
    seen = ~np.isnan(ref)
    r = np.where(seen, ref, 0.0)
    if np.all(~seen | (ref == 0) | (ref == 1)):  # binary: the tilt shifts the log-odds by 1/beta
        p = (r.sum(1) + prior) / (seen.sum(1) + 2 * prior)  # Jeffreys-smoothed rate at a = 0.5
        with np.errstate(divide="ignore"):
            logit = np.log(p) - np.log1p(-p)
        z = logit[None, :] + 1.0 / betas[:, None]
        v = np.exp(-np.logaddexp(0.0, -z))  # sigmoid, exact at +-inf
        return v, v * (1 - v)
    z = np.where(seen[None], r[None] / betas[:, None, None], -np.inf)  # continuous: log-sum-exp
    w = np.exp(z - z.max(axis=2, keepdims=True))
    w = w / w.sum(axis=2, keepdims=True)
    v = (w * r[None]).sum(axis=2)
    return v, (w * (r[None] - v[:, :, None]) ** 2).sum(axis=2)


# Step 2: the batchwise BLUE, leave-one-out: V~_i = V^_i S1_i / S2_i (Proposition 1)
def loo(terms: np.ndarray) -> np.ndarray:
    """Leave-one-out sums over the last axis, O(B): the total minus each own term."""
    return terms.sum(axis=-1, keepdims=True) - terms


def refine(
    v: np.ndarray, var: np.ndarray, r: np.ndarray, variant: str = "unb", eps: float = 1e-6
) -> np.ndarray:
    """Refined values V~ (..., B) from offline values, their variances and one reward each.

    unb: V^_i S1_i / S2_i, vop: V^_i S1_i / (1 + S2_i), with S1_i = sum_{j in A, j != i}
    a_j r_j, S2_i = sum_{j in A, j != i} a_j V^_j, a_j = V^_j / s^2_j on the active set
    A = {j: s^2_j > eps}; rvg: V^_i times the mean over A minus i of r_j / V^_j.
    Where A minus i is empty (or S2_i <= 0) V~_i = V^_i.
    """
    active = var > eps
    if variant == "rvg":
        ok = active & (v != 0)
        m = loo(ok.astype(float))
        ratio = loo(np.where(ok, r / np.where(active, v, 1.0), 0.0)) / np.where(m > 0, m, 1.0)
        return np.where(m > 0, v * ratio, v)
    a = np.where(active, v / np.where(active, var, 1.0), 0.0)
    s1, s2 = loo(a * r), loo(a * v)
    has = (loo(active.astype(float)) > 0) & (s2 > 0)
    ratio = s1 / np.where(has, s2, 1.0) if variant == "unb" else s1 / (1 + s2)
    return np.where(has, v * ratio, v)


# Step 3: online calibration of beta, by an in-batch loss over the grid
def batch_loss(pred: np.ndarray, r: np.ndarray, loss: str = "squared") -> np.ndarray:
    """Mean over the batch (last axis) of the squared or the log loss."""
    if loss == "squared":
        return ((r - pred) ** 2).mean(axis=-1)
    p = np.clip(pred, 1e-6, 1 - 1e-6)
    return -(r * np.log(p) + (1 - r) * np.log1p(-p)).mean(axis=-1)


def select_beta(
    v_grid: np.ndarray,
    var_grid: np.ndarray,
    r: np.ndarray,
    criterion: str = "initial",
    loss: str = "squared",
    variant: str = "unb",
    eps: float = 1e-6,
    min_active: float = 0.5,
) -> int:
    """Grid index minimising the batch loss of V^ (``initial``) or of V~ (``refined``).

    Candidates with fewer than ``min_active`` of the batch active are skipped (there the
    ratio S1/S2 rests on a few prompts), unless every candidate is. Ties: the first.
    """
    rr = np.broadcast_to(r, v_grid.shape)
    pred = v_grid if criterion == "initial" else refine(v_grid, var_grid, rr, variant, eps)
    losses = batch_loss(pred, rr, loss)
    if min_active > 0:
        ok = (var_grid > eps).mean(axis=-1) >= min_active
        losses = np.where(ok | ~ok.any(), losses, np.inf)
    return int(np.argmin(losses))


class BasisReference:
    """BASIS over a stream of batches: ``est(prompt_ids, rewards) -> (baselines, beta)``.

    ``calibration``: ``current`` picks beta on this batch; ``previous`` applies the beta
    picked on the previous batch (beta = inf at the first: the initial policy is the
    reference), which keeps V^ independent of the rewards it is refined with.
    """

    def __init__(
        self,
        prompt_ids: list[str],
        ref_rewards: np.ndarray,
        betas: np.ndarray | None = None,
        prior: float = 0.5,
        calibration: str = "current",
        **options: object,
    ) -> None:
        self.betas = default_betas() if betas is None else np.asarray(betas, dtype=float)
        self.values, self.variances = tilt(np.asarray(ref_rewards, float), self.betas, prior)
        self.column = {pid: i for i, pid in enumerate(prompt_ids)}
        self.calibration, self.options = calibration, options  # criterion, loss, variant, ...
        self.previous = int(np.flatnonzero(np.isinf(self.betas))[0])

    def __call__(self, prompt_ids: list[str], rewards: np.ndarray) -> tuple[np.ndarray, float]:
        cols = [self.column[pid] for pid in prompt_ids]
        v_grid, var_grid = self.values[:, cols], self.variances[:, cols]
        r = np.asarray(rewards, dtype=float)
        index = select_beta(v_grid, var_grid, r, **self.options)  # type: ignore[arg-type]
        if self.calibration == "previous":
            index, self.previous = self.previous, index
        variant = str(self.options.get("variant", "unb"))
        eps = float(self.options.get("eps", 1e-6))  # type: ignore[arg-type]
        return refine(v_grid[index], var_grid[index], r, variant, eps), float(self.betas[index])

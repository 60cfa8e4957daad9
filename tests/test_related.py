"""Related-work estimators: each against a slow reference written from its formula, and by hand."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import import_extra, rollouts_frame

from basis_bench.errors import InputError
from basis_bench.estimators import (
    ESTIMATORS,
    EstimatorInput,
    SpoTracker,
    apo_value,
    default_betas,
    james_stein,
    spo_prior,
    spo_step,
    tilted_moments,
)
from basis_bench.estimators.related import hermite_weights
from basis_bench.evaluation.replay_plan import ReplayPlan, shared_prompts
from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory

RNG = np.random.default_rng(7)


# --------------------------------------------------------------------------- James-Stein


def js_slow(group: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The official JSPO loop: per prompt, statistics of the other prompts only."""
    n, m = group.shape
    out = np.zeros_like(group)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        means = [sum(group[j]) / m for j in others]
        variances = [
            sum((x - means[k]) ** 2 for x in group[j]) / (m - 1) / m for k, j in enumerate(others)
        ]
        grand = sum(means) / len(means)
        v2 = sum(variances) / len(variances)
        s2 = sum((mu - grand) ** 2 for mu in means) / len(means)
        lam = v2 / (v2 + s2 + eps)
        pooled = sum(x for j in others for x in group[j]) / (len(others) * m)
        for k in range(m):
            rloo = (sum(group[i]) - group[i, k]) / (m - 1)
            out[i, k] = (1 - lam) * rloo + lam * pooled
    return out


@pytest.mark.parametrize("binary", [True, False])
def test_james_stein_matches_slow_reference(binary: bool) -> None:
    shape = (3, 2, 7, 5)
    r = RNG.integers(0, 2, shape).astype(float) if binary else RNG.normal(3.0, 2.0, shape)
    fast = james_stein(r)
    for idx in np.ndindex(*shape[:2]):
        np.testing.assert_allclose(fast[idx], js_slow(r[idx]), rtol=0, atol=1e-12)


def test_james_stein_hand_computed() -> None:
    # Groups: prompt 0 = [1, 0], prompt 1 = [1, 1], prompt 2 = [0, 0].
    r = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    # Prompt 0 sees groups 1 and 2: means 1, 0 (mean 0.5, s2 = 0.25), variances 0 -> lam = 0:
    # plain RLOO, 0 and 1. Prompt 1 sees [1, 0] and [0, 0]: means .5, 0 -> mbar .25,
    # s2 = .0625; v2 = mean(.5/2, 0) = .125 -> lam = .125/.1875 = 2/3, pooled mean .25.
    lam = 0.125 / (0.125 + 0.0625 + 1e-6)
    b1 = (1 - lam) * 1.0 + lam * 0.25
    # Prompt 2 sees [1, 0] and [1, 1]: means .5, 1 -> mbar .75, s2 .0625, v2 .125; pooled .75.
    b2 = (1 - lam) * 0.0 + lam * 0.75
    expected = np.array([[0.0, 1.0], [b1, b1], [b2, b2]])
    np.testing.assert_allclose(james_stein(r), expected, atol=1e-12)


def test_james_stein_torch_and_registry() -> None:
    torch = import_extra("hf", "torch")
    r = RNG.integers(0, 2, (4, 6, 8)).astype(float)
    est = ESTIMATORS["james_stein"]
    assert est.group and not est.uses_cache and est.rollouts_per_prompt(8) == 8
    out = est(EstimatorInput(rewards=torch.tensor(r)))
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), james_stein(r), atol=1e-12)


def test_james_stein_rejects_single_prompt_or_rollout() -> None:
    with pytest.raises(InputError, match="B >= 2"):
        james_stein(np.zeros((1, 4)))
    with pytest.raises(InputError, match="G >= 2"):
        james_stein(np.zeros((4, 1)))


# --------------------------------------------------------------------------- A*-PO


def apo_slow(ref: np.ndarray, beta: float, prior: float = 0.5) -> np.ndarray:
    out = []
    for row in ref:
        xs = [x for x in row if not math.isnan(x)]
        if all(x in (0.0, 1.0) for x in ref[~np.isnan(ref)]):
            p = (sum(xs) + prior) / (len(xs) + 2 * prior)
            out.append(p if math.isinf(beta) else beta * math.log(1 - p + p * math.exp(1 / beta)))
        elif math.isinf(beta):
            out.append(sum(xs) / len(xs))
        else:
            out.append(beta * math.log(sum(math.exp(x / beta) for x in xs) / len(xs)))
    return np.array(out)


@pytest.mark.parametrize("beta", [0.05, 0.5, 3.0, math.inf])
@pytest.mark.parametrize("binary", [True, False])
def test_apo_value_matches_slow_reference(beta: float, binary: bool) -> None:
    ref = RNG.integers(0, 2, (6, 20)).astype(float) if binary else RNG.random((6, 20))
    ref[1, 5:] = np.nan
    np.testing.assert_allclose(apo_value(ref, beta), apo_slow(ref, beta), rtol=1e-12)


def test_apo_value_hand_computed_and_limits() -> None:
    ref = np.array([[1.0, 0.0, 0.0, 0.0]])
    # prior 0: p = 1/4, beta = 1/2: 0.5 log(3/4 + e^2/4).
    assert apo_value(ref, 0.5, prior=0.0)[0] == pytest.approx(0.5 * math.log(0.75 + math.e**2 / 4))
    cont = np.array([[0.2, 0.9, 0.4]])
    assert apo_value(cont, math.inf)[0] == pytest.approx(0.5)
    assert apo_value(cont, 1e-4)[0] == pytest.approx(0.9 - 1e-4 * math.log(3), abs=1e-9)
    assert apo_value(ref, 1e-6, prior=0.0)[0] == pytest.approx(1.0, abs=1e-5)  # no overflow
    with pytest.raises(InputError, match="beta must be > 0"):
        apo_value(ref, 0.0)


def _apo_input(ref: np.ndarray, rewards: np.ndarray, **kw) -> EstimatorInput:
    betas = default_betas()
    v, var = tilted_moments(ref, betas)
    return EstimatorInput(rewards=rewards, v_grid=v, var_grid=var, betas=betas, **kw)


def test_registered_apo_binary_is_exact() -> None:
    ref = RNG.integers(0, 2, (9, 64)).astype(float)
    batch = _apo_input(ref, RNG.integers(0, 2, (9, 1)).astype(float))
    est = ESTIMATORS["apo"]
    assert est.uses_cache and not est.group and est.defaults == {}
    np.testing.assert_allclose(est(batch)[:, 0], apo_value(ref, 0.5), rtol=1e-12)
    np.testing.assert_allclose(est(batch, beta=2.0)[:, 0], apo_value(ref, 2.0), rtol=1e-12)


def test_registered_apo_continuous_from_grid() -> None:
    torch = import_extra("hf", "torch")
    ref = RNG.random((9, 64))
    batch = _apo_input(ref, RNG.random((9, 1)), reward_range=None)
    np.testing.assert_allclose(ESTIMATORS["apo"](batch)[:, 0], apo_value(ref, 0.5), atol=1e-5)
    tbatch = _apo_input(torch.tensor(ref), torch.tensor(RNG.random((9, 1))), reward_range=None)
    out = ESTIMATORS["apo"](tbatch)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out[:, 0].numpy(), apo_value(ref, 0.5), atol=1e-5)


def test_hermite_weights_integrate_cubics_exactly() -> None:
    # For V_s = s^3 (Var_s = 3 s^2) the Hermite interpolant is exact: integral 0..2 = 4.
    betas = np.array([np.inf, 1.0, 0.7, 0.5, 0.25])
    s = np.where(np.isinf(betas), 0.0, 1 / betas)
    a, c = hermite_weights(betas, 0.5)
    assert a @ s**3 + c @ (3 * s**2) == pytest.approx(4.0)
    with pytest.raises(InputError, match="widen the grid"):
        hermite_weights(betas, 0.1)
    with pytest.raises(InputError, match="beta = inf"):
        hermite_weights(betas[1:], 0.5)


# --------------------------------------------------------------------------- SPO tracker


def spo_slow(alpha, beta, index, rewards, decay):
    """Sequential reference: read all baselines first, then update prompt by prompt."""
    alpha, beta = alpha.copy(), beta.copy()
    base = [alpha[i] / (alpha[i] + beta[i]) for i in index]
    for i, r in zip(index, rewards, strict=True):
        alpha[i] = decay * alpha[i] + r
        beta[i] = decay * beta[i] + (1 - r)
    return np.array(base), alpha, beta


def test_spo_step_matches_sequential_reference_with_repeats() -> None:
    a0, b0 = RNG.random(6) * 5 + 0.1, RNG.random(6) * 5 + 0.1
    index = np.array([3, 1, 3, 0, 3, 5])
    rewards = RNG.random(6)
    a, b = a0.copy(), b0.copy()
    base = spo_step(a, b, index, rewards, 0.9)
    want_base, want_a, want_b = spo_slow(a0, b0, index, rewards, 0.9)
    np.testing.assert_allclose(base, want_base)
    np.testing.assert_allclose(a, want_a)
    np.testing.assert_allclose(b, want_b)


def test_spo_step_vectorises_over_repeats() -> None:
    a0, b0 = RNG.random((3, 5)) + 0.5, RNG.random((3, 5)) + 0.5
    index = RNG.integers(0, 5, (3, 4))
    rewards = RNG.integers(0, 2, (3, 4)).astype(float)
    a, b = a0.copy(), b0.copy()
    base = spo_step(a, b, index, rewards, 0.8)
    for r in range(3):
        wb, wa, wbb = spo_slow(a0[r], b0[r], index[r], rewards[r], 0.8)
        np.testing.assert_allclose(base[r], wb)
        np.testing.assert_allclose(a[r], wa)
        np.testing.assert_allclose(b[r], wbb)


def test_spo_tracker_hand_computed() -> None:
    # n = 4 reference samples, k = 1: p0 = 1.5 / 5 = 0.3; decay 0.875 -> N0 = 8.
    torch = import_extra("hf", "torch")
    tracker = SpoTracker(["a", "b"], np.array([[1.0, 0, 0, 0], [1, 1, 1, 1]]))
    np.testing.assert_allclose(tracker.state["alpha"], [2.4, 8 * 4.5 / 5])
    first = tracker(["a"], np.array([1.0])).baselines
    assert first[0] == pytest.approx(0.3)
    # alpha = .875 * 2.4 + 1 = 3.1, beta = .875 * 5.6 = 4.9 -> 3.1 / 8.
    assert tracker.state["alpha"][0] / 8 == pytest.approx(3.1 / 8)
    out = tracker(["a", "b"], torch.tensor([0.0, 1.0], dtype=torch.float64)).baselines
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == pytest.approx([3.1 / 8, 0.9])
    with pytest.raises(InputError, match="not in the reference cache"):
        tracker(["zzz"], np.array([1.0]))
    with pytest.raises(InputError, match=r"outside the declared reward range \[0.0, 1.0\]"):
        tracker(["a"], np.array([2.0]))


def test_spo_prior_options_and_errors() -> None:
    a, b = spo_prior(np.array([[1.0, np.nan]]), decay=0.5, prior=0.0, weight=10)
    assert (a[0], b[0]) == (10.0, 0.0)
    with pytest.raises(InputError, match="decay"):
        spo_prior(np.ones((1, 2)), decay=0.0)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        spo_prior(np.full((1, 2), 3.0))


# --------------------------------------------------------------------------- tracker replay


def replay_tracker(
    df: pl.DataFrame, reference: str, checkpoints: list[str], **settings: int
) -> pl.DataFrame:
    """The SPO tracker alone through trajectory replay: its rows per checkpoint; the
    settings those of the plan (repeats, ref_n) and of the epoch schedule."""
    plan = ReplayPlan(**{k: settings.pop(k) for k in ("repeats", "ref_n") if k in settings})
    table, _ = replay_trajectory(
        df, reference, checkpoints, ["spo_tracker"], plan, EpochSchedule(**settings)
    )
    return table.filter(pl.col("scope") == "checkpoint")


def test_replay_tracker_hand_computed() -> None:
    # Reference: p0 = (k + .5)/(n + 1) with n = 3. Checkpoint pools are constant per prompt,
    # so whatever the draw order, each prompt sees exactly its pool value once per checkpoint.
    ref = {"a": [0.0, 0.0, 0.0], "b": [1.0, 1.0, 0.0], "c": [1.0, 1.0, 1.0], "d": [0, 1.0, 0]}
    early = {
        "a": [0, 1, 0, 1, 1.0],
        "b": [1, 1, 0, 0, 1.0],
        "c": [1, 1, 1, 1, 1.0],
        "d": [1, 0, 1, 0, 0.0],
    }
    late = {
        "a": [1, 1, 1, 1, 0.0],
        "b": [0, 0, 0, 0, 0.0],
        "c": [1, 1, 1, 0, 1.0],
        "d": [0, 0, 0, 0, 0.0],
    }
    df = pl.concat(
        [
            rollouts_frame("reference", ref),
            rollouts_frame("early", early),
            rollouts_frame("late", late),
        ]
    )
    out = replay_tracker(
        df, "reference", ["early", "late"], batch_size=2, repeats=3, oracle_n=4, ref_n=3
    )
    decay, n0 = 0.875, 8.0
    want = []
    alpha = {p: n0 * (sum(v) + 0.5) / 4 for p, v in ref.items()}
    beta = {p: n0 - alpha[p] for p in ref}
    for ckpt in (early, late):
        sq, noise = [], []
        for p, v in ckpt.items():
            oracle = sum(v[:4]) / 4
            sq.append((alpha[p] / (alpha[p] + beta[p]) - oracle) ** 2)
            noise.append(np.var(v[:4], ddof=1) / 4)
            r = v[4]
            alpha[p], beta[p] = decay * alpha[p] + r, decay * beta[p] + 1 - r
        want.append((np.mean(sq), np.mean(sq) - np.mean(noise)))
    assert out["checkpoint"].to_list() == ["early", "late"]
    assert out["estimator"].to_list() == ["spo_tracker"] * 2
    np.testing.assert_allclose(out["mse"].to_numpy(), [w[0] for w in want])
    np.testing.assert_allclose(out["mse_noise_corrected"].to_numpy(), [w[1] for w in want])
    assert out["n_estimates"].to_list() == [12, 12]
    np.testing.assert_allclose(out["ci_low"].to_numpy(), out["mse"].to_numpy())  # no spread


def test_replay_tracker_learns_a_drifted_checkpoint() -> None:
    # Every prompt's value jumps from ~0.2 to 0.9: the tracker must track it over epochs.
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(40)]
    ref = {p: list((rng.random(32) < 0.2).astype(float)) for p in ids}
    ckpt = {p: list((rng.random(300) < 0.9).astype(float)) for p in ids}
    df = pl.concat([rollouts_frame("reference", ref), rollouts_frame("trained", ckpt)])
    one = replay_tracker(
        df, "reference", ["trained"], batch_size=8, repeats=4, oracle_n=200, ref_n=32
    )
    many = replay_tracker(
        df,
        "reference",
        ["trained"],
        batch_size=8,
        repeats=4,
        epochs_per_checkpoint=8,
        oracle_n=200,
        ref_n=32,
    )
    assert many["mse"][0] < 0.5 * one["mse"][0]


def test_replay_tracker_errors() -> None:
    ref = {"a": [0.0, 1.0], "b": [1.0, 1.0]}
    ck = {"a": [0.0, 1.0, 1.0], "b": [1.0, 0.0, 1.0]}
    df = pl.concat(
        [
            rollouts_frame("reference", ref),
            rollouts_frame("ck", ck),
            rollouts_frame("other", {"a": [1.0] * 3}),
        ]
    )
    ids, dropped = shared_prompts(df, "reference", ["ck", "other"])
    assert list(ids) == ["a"] and dropped == 1
    with pytest.raises(InputError, match="no rollouts"):
        replay_tracker(df, "reference", ["nope"], batch_size=1, oracle_n=2)
    with pytest.raises(InputError, match="batch_size"):
        replay_tracker(df, "reference", ["ck"], batch_size=3, oracle_n=2)
    with pytest.raises(InputError, match="fewer than"):
        replay_tracker(df, "reference", ["ck"], batch_size=1, oracle_n=3)

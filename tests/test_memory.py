"""basis_memory: its posterior against a slow reference, leave-current-out unbiasedness,
no 0/1 baselines on degenerate histories, numpy == torch, and the step interface's state."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from basis_bench.errors import InputError
from basis_bench.estimators import (
    EstimatorInput,
    MemoryOptions,
    get,
    make_step_estimator,
)
from basis_bench.estimators.tilt import default_betas, tilted_moments

P, N_REF = 12, 16


@pytest.fixture
def cache() -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(P)]
    ref = (rng.random((P, N_REF)) < rng.uniform(0.05, 0.95, (P, 1))).astype(float)
    return ids, ref


def _slow_memory(ref, ids, stream, options: MemoryOptions):
    """Plain-Python reference: per prompt, a list of its earlier rewards; every candidate
    (beta, gamma, m) scored by the other prompts' squared errors, one prompt at a time."""
    betas = default_betas()
    v_table, _ = tilted_moments(ref, betas)
    v_table = np.asarray(v_table)
    history: dict[int, list[float]] = {i: [] for i in range(len(ids))}
    out = []
    for batch_ids, rewards in stream:
        cols = [ids.index(p) for p in batch_ids]

        def post(col, k, gamma, m):
            past = history[col]
            s = sum(gamma ** (len(past) - 1 - a) * r for a, r in enumerate(past))
            n = sum(gamma ** (len(past) - 1 - a) for a in range(len(past)))
            return (m * v_table[k, col] + s) / (m + n)

        cands = list(itertools.product(range(len(betas)), options.gammas, options.weights))
        base = []
        for i, col in enumerate(cols):
            best, best_loss = None, np.inf
            for k, g, m in cands:
                loss = sum(
                    (rewards[j] - post(cols[j], k, g, m)) ** 2 for j in range(len(cols)) if j != i
                )
                if loss < best_loss - 1e-12:
                    best, best_loss = (k, g, m), loss
            base.append(post(col, *best))
        for col, r in zip(cols, rewards, strict=True):
            history[col].append(float(r))
        out.append(np.array(base))
    return out


def _stream(ids, steps=4, b=5, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        pick = rng.choice(len(ids), b, replace=False)
        yield [ids[i] for i in pick], (rng.random(b) < 0.5).astype(float)


def test_posterior_matches_a_slow_reference(cache):
    ids, ref = cache
    opts = MemoryOptions(gammas=(0.5, 1.0), weights=(1.0, 4.0))
    stream = list(_stream(ids))
    want = _slow_memory(ref, ids, stream, opts)
    est = make_step_estimator("basis_memory", opts, prompt_ids=ids, ref_rewards=ref)
    for (batch_ids, rewards), expected in zip(stream, want, strict=True):
        got = est(batch_ids, rewards[:, None]).baselines[:, 0]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_baseline_is_independent_of_the_current_reward(cache):
    """b_i uses the cache, prompt i's history and r_{-i}: flipping r_i leaves b_i unchanged."""
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    for batch_ids, rewards in _stream(ids, steps=3, b=6, seed=1):
        est(batch_ids, rewards[:, None])
    batch_ids, rewards = next(_stream(ids, steps=1, b=6, seed=2))
    state = est.state_dict()
    base = est(batch_ids, rewards[:, None]).baselines[:, 0]
    for i in range(len(rewards)):
        flipped = rewards.copy()
        flipped[i] = 1 - flipped[i]
        est.load_state_dict(state)
        other = est(batch_ids, flipped[:, None]).baselines[:, 0]
        assert other[i] == base[i], "the current reward entered its own baseline"


def test_unbiased_policy_gradient_by_monte_carlo(cache):
    """E[(r_i - b_i) s_i] = E[r_i s_i] for a score s_i with E[s_i] = 0 tied to r_i's draw."""
    ids, ref = cache
    rng = np.random.default_rng(5)
    opts = MemoryOptions(gammas=(0.5, 1.0), weights=(1.0, 4.0, 16.0))
    est = make_step_estimator("basis_memory", opts, prompt_ids=ids, ref_rewards=ref, lead=(20000,))
    v = rng.uniform(0.2, 0.8, P)
    cols = np.broadcast_to(np.arange(6), (20000, 6))
    for _ in range(3):  # build a history
        r = (rng.random((20000, 6)) < v[:6]).astype(float)
        est.step_columns(cols, r[..., None])
    r = (rng.random((20000, 6)) < v[:6]).astype(float)
    b = np.asarray(est.step_columns(cols, r[..., None]).baselines)[..., 0]
    score = r - v[:6]  # d/dtheta log p of a Bernoulli's outcome, up to a factor
    bias = (b * score).mean(axis=0)  # E[b_i s_i] must be 0
    se = (b * score).std(axis=0) / np.sqrt(20000)
    assert np.all(np.abs(bias) < 4 * se + 1e-12), (bias, se)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_never_zero_or_one_on_degenerate_histories(cache, value):
    ids, ref = cache
    ref = np.full_like(ref, value)  # the cache too is all-0 / all-1
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    batch = ids[:4]
    for _ in range(30):
        out = est(batch, np.full((4, 1), value)).baselines
        assert np.all((out > 0) & (out < 1)), out


def test_numpy_equals_torch(cache):
    torch = pytest.importorskip("torch")
    ids, ref = cache
    a = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    b = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    for batch_ids, rewards in _stream(ids, steps=3, b=6, seed=4):
        x = a(batch_ids, rewards[:, None]).baselines
        y = b(batch_ids, torch.tensor(rewards[:, None], dtype=torch.float64)).baselines
        assert isinstance(y, torch.Tensor)
        np.testing.assert_array_equal(x, y.numpy())


@pytest.mark.parametrize("name", ["basis_memory", "spo_tracker", "basis"])
def test_state_round_trips_through_state_dict(cache, name):
    ids, ref = cache
    options = {"calibration": "previous"} if name == "basis" else None
    est = make_step_estimator(name, options, prompt_ids=ids, ref_rewards=ref)
    stream = list(_stream(ids, steps=6, b=5, seed=7))
    for batch_ids, rewards in stream[:3]:
        est(batch_ids, rewards[:, None])
    saved = est.state_dict()
    assert saved, "a stateful estimator has state"
    first = [est(i, r[:, None]).baselines for i, r in stream[3:]]
    fresh = make_step_estimator(name, options, prompt_ids=ids, ref_rewards=ref)
    fresh.load_state_dict(saved)
    second = [fresh(i, r[:, None]).baselines for i, r in stream[3:]]
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)
    fresh.reset()
    assert all(
        np.array_equal(v, w)
        for v, w in zip(
            fresh.state_dict().values(),
            make_step_estimator(name, options, prompt_ids=ids, ref_rewards=ref)
            .state_dict()
            .values(),
            strict=True,
        )
    )


def test_train_state_survives_weights_only_torch_load(cache, tmp_path):
    torch = pytest.importorskip("torch")
    from basis_bench.train import make_config, make_estimator

    ids, ref = cache
    est = make_estimator(make_config({}, ["estimator=basis_memory"]), ids, ref)
    for batch_ids, rewards in _stream(ids, steps=2, b=5):
        est(batch_ids, rewards[:, None])
    torch.save(est.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    again = make_estimator(make_config({}, ["estimator=basis_memory"]), ids, ref)
    again.load_state_dict(state)
    batch_ids, rewards = next(_stream(ids, steps=1, b=5, seed=9))
    np.testing.assert_array_equal(
        est(batch_ids, rewards[:, None]).baselines, again(batch_ids, rewards[:, None]).baselines
    )


def test_first_visit_is_the_leave_one_out_tilt(cache):
    """With no history the posterior is the prior: V^ at prompt i's leave-one-out beta."""
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    batch_ids, rewards = next(_stream(ids, steps=1, b=6))
    out = est(batch_ids, rewards[:, None]).baselines[:, 0]
    v = np.asarray(tilted_moments(ref, default_betas())[0])[:, [ids.index(p) for p in batch_ids]]
    loss = (rewards - v) ** 2
    k = np.argmin(loss.sum(axis=1, keepdims=True) - loss, axis=0)
    np.testing.assert_allclose(out, v[k, np.arange(6)], atol=1e-15)


def test_refusals(cache):
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    with pytest.raises(InputError, match="at most once"):
        est([ids[0], ids[0]], np.zeros((2, 1)))
    with pytest.raises(InputError, match="B >= 2"):
        est([ids[0]], np.zeros((1, 1)))
    with pytest.raises(InputError, match="carries state"):
        get("basis_memory")(EstimatorInput(np.zeros((3, 1)), np.zeros((1, 3)), np.zeros((1, 3))))
    with pytest.raises(InputError, match="gammas"):
        MemoryOptions(gammas=(0.0,))
    with pytest.raises(InputError, match="weights"):
        MemoryOptions(weights=())
    with pytest.raises(InputError, match="shape"):
        est.load_state_dict({k: v[:, :3] for k, v in est.state_dict().items()})


def test_plugins_call_a_stateful_estimator_like_basis(tmp_path):
    """verl/TRL's cache builder returns a StepBasis for basis_memory: Basis's call, state kept."""
    from basis_bench.integrations.keys import StepBasis

    ids = [f"q{i}" for i in range(6)]
    ref = np.tile([[1.0, 0.0, 0.0, 1.0]], (6, 1))
    adapter = StepBasis(make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref))
    r = np.array([1.0, 0, 1, 0, 1, 0])
    first = adapter(ids, r)
    second = adapter(ids, r)
    assert first.baselines.shape == (6,) and not np.array_equal(first.baselines, second.baselines)
    assert set(adapter.state_dict()) == {"successes", "visits"}

"""basis_track: the filter against a slow reference, unbiasedness given the history, the
learned drift against a known one, convergence on a standing policy, the state, numpy ==
torch, never 0/1, and the step interface the training loop uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_own_reward_unused

from basis_bench.errors import InputError
from basis_bench.estimators import make_step_estimator
from basis_bench.estimators.track import (
    DIFFICULTY_EDGES,
    JUMP_MEMORY,
    JUMP_PRIOR,
    JUMP_VAR,
    LEVEL_NOISE,
    REGIMES,
    candidate_grid,
    logit_grid,
    prior_weights,
)

P, N_REF = 8, 32


@pytest.fixture
def cache() -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(P)]
    ref = (rng.random((P, N_REF)) < rng.uniform(0.05, 0.6, (P, 1))).astype(float)
    return ids, ref


def _stream(n_prompts, steps, b, seed, p=None):
    """Batches of distinct prompt columns and their rewards drawn at ``p`` (default 0.5)."""
    rng = np.random.default_rng(seed)
    value = np.full(n_prompts, 0.5) if p is None else p
    for _ in range(steps):
        cols = rng.choice(n_prompts, b, replace=False)
        yield cols, (rng.random(b) < value[cols]).astype(float)


def _sig(z):
    return 1.0 / (1.0 + math.exp(-z))


def _slow_level(level, var, rate, resid, curv):
    """The level's calm-or-jump step, one scalar at a time."""
    ev, mean, post = [], [], []
    for q in LEVEL_NOISE:
        spread = curv + curv**2 * (var + q)
        ev.append(-0.5 * (math.log(spread) + resid**2 / spread))
        post.append(1 / (1 / (var + q) + curv))
        mean.append(level + resid * post[-1])
    jumped = rate * math.exp(ev[1]) / (rate * math.exp(ev[1]) + (1 - rate) * math.exp(ev[0]))
    u = (1 - jumped) * mean[0] + jumped * mean[1]
    v = (1 - jumped) * (post[0] + (mean[0] - u) ** 2) + jumped * (post[1] + (mean[1] - u) ** 2)
    return u, v, jumped


def _slow_drift(w, shift, var, jump, theta):
    """The posterior moved cell by cell, blurred cell by cell, and mixed with the redrawn one."""
    g, spacing = len(theta), theta[1] - theta[0]
    u = shift / spacing
    n, f = math.floor(u), u - math.floor(u)
    moved = np.zeros(g)
    for k in range(g):
        moved[min(max(k + n, 0), g - 1)] += (1 - f) * w[k]
        moved[min(max(k + n + 1, 0), g - 1)] += f * w[k]
    blurred = np.zeros(g)
    for k in range(g):
        dens = [math.exp(-(((h - k) * spacing) ** 2) / (2 * max(var, 1e-12))) for h in range(g)]
        blurred += moved[k] * np.array(dens) / sum(dens)
    mean = sum(w[k] * theta[k] for k in range(g))
    spread = sum(w[k] * theta[k] ** 2 for k in range(g)) - mean**2 + var + JUMP_VAR
    redrawn = np.array([math.exp(-((t - mean - shift) ** 2) / (2 * spread)) for t in theta])
    return (1 - jump) * blurred + jump * redrawn / redrawn.sum()


def _slow_mix(evidence, bins, ll, pooling):
    """Per prompt: the filters' weights from its difficulty bin's evidence and the other
    bins', the batch's other rewards added."""
    n_models, b = ll.shape
    mix = np.zeros((b, n_models))
    for i in range(b):
        score = np.zeros(n_models)
        for c in range(n_models):
            by_bin = [evidence[c, k] + sum(ll[c, j] for j in range(b) if j != i and bins[j] == k)
                      for k in range(evidence.shape[1])]  # fmt: skip
            score[c] = (1 - pooling) * by_bin[bins[i]] + pooling * sum(by_bin)
        mix[i] = np.exp(score - score.max()) / np.exp(score - score.max()).sum()
    counts = np.zeros_like(evidence)
    for j in range(b):
        counts[:, bins[j]] += ll[:, j]
    return mix, counts


def _slow_step(state, cols, r, options, difficulty):
    """Plain-Python reference of one step of one stream: per filter and per prompt, the
    history's prediction, the leave-one-out level, the drift, then the mix by the evidence of
    the prompt's value bin, without the prompt's own reward."""
    theta = logit_grid()
    g = len(theta)
    b = len(cols)
    models = candidate_grid()
    values, ll = np.zeros((len(models), b)), np.zeros((len(models), b))
    new = {k: v.copy() for k, v in state.items()}
    t = float(state["step"])
    for c, (rho, kappa, eta, regime) in enumerate(models):
        steps = (1 - JUMP_MEMORY**t) / (1 - JUMP_MEMORY)
        rate = (state["jumps"][c] + JUMP_PRIOR) / (steps + REGIMES[int(regime)][0])
        p0 = []
        for col in cols:
            w, gap = state["posteriors"][col, c], t - state["last_visit"][col]
            moved = state["level"][c] - state["visit_level"][col, c]
            jumps0 = state["jump_clock"][c] - state["visit_jump_clock"][col, c]
            var0, jump0 = rho * gap + kappa * jumps0, 1 - math.exp(-eta * jumps0)
            pred = []
            for extra in (0.0, JUMP_VAR):
                scale = 1 / math.sqrt(1 + math.pi * (var0 + extra) / 8)
                pred.append(sum(w[k] * _sig((theta[k] + moved) * scale) for k in range(g)))
            p0.append((1 - jump0) * pred[0] + jump0 * pred[1])
        e = [r[i] - p0[i] for i in range(b)]
        curv = [p * (1 - p) for p in p0]
        for i, col in enumerate(cols):
            others = [j for j in range(b) if j != i]
            level_i, _, jumped_i = _slow_level(
                state["level"][c], state["level_var"][c], rate,
                sum(e[j] for j in others), sum(curv[j] for j in others),
            )  # fmt: skip
            shift = level_i - state["visit_level"][col, c]
            gap = t - state["last_visit"][col]
            jumps = state["jump_clock"][c] + jumped_i - state["visit_jump_clock"][col, c]
            var, jump = rho * gap + kappa * jumps, 1 - math.exp(-eta * jumps)
            now = _slow_drift(state["posteriors"][col, c], shift, var, jump, theta)
            values[c, i] = sum(now[h] * _sig(theta[h]) for h in range(g))
            ll[c, i] = r[i] * math.log(p0[i]) + (1 - r[i]) * math.log(1 - p0[i])
            if col in cols[:i]:
                continue  # a prompt twice: its first copy wrote the state, with every reward
            post = now
            for j in (j for j in range(b) if cols[j] == col):  # Bayes' rule once a copy
                post = post * np.array(
                    [_sig(x) ** r[j] * (1 - _sig(x)) ** (1 - r[j]) for x in theta]
                )
            new["posteriors"][col, c] = np.maximum(post / post.sum(), 1e-250)
            new["visit_level"][col, c] = level_i
            new["visit_jump_clock"][col, c] = state["jump_clock"][c] + jumped_i
        level, level_var, jumped = _slow_level(
            state["level"][c], state["level_var"][c], rate, sum(e), sum(curv)
        )
        new["level"][c], new["level_var"][c] = level, level_var
        new["jumps"][c] = state["jumps"][c] * JUMP_MEMORY + jumped
        new["jump_clock"][c] = state["jump_clock"][c] + jumped
    bins = [int(np.searchsorted(DIFFICULTY_EDGES, difficulty[col])) for col in cols]
    mix, counts = _slow_mix(state["evidence"], bins, ll, options.pooling)
    baseline = np.array([mix[i] @ values[:, i] for i in range(b)])
    new["evidence"] = (state["evidence"] + counts) * options.memory
    new["last_visit"][cols] = t
    new["step"] = state["step"] + 1
    return baseline, new


@pytest.mark.parametrize(
    "options",
    [{}, {"pooling": 0.3}],
    ids=["pooled", "by-value"],
)
def test_filter_matches_a_slow_reference(cache, options):
    ids, ref = cache
    est = make_step_estimator("basis_track", options, prompt_ids=ids, ref_rewards=ref)
    slow = est.state_dict()
    theta = logit_grid()
    difficulty = prior_weights(ref, theta) @ (1 / (1 + np.exp(-theta)))  # the smoothed rate
    for cols, r in _stream(P, steps=6, b=4, seed=1):
        got = np.asarray(est.step_columns(cols, r[:, None]).baselines)[:, 0]
        want, slow = _slow_step(slow, cols, r, est.options, difficulty)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for key, value in est.state_dict().items():
        np.testing.assert_allclose(value, slow[key], rtol=1e-9, atol=1e-12, err_msg=key)
    # each regime's filters start with the reference that many jumps away
    start = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref).state_dict()
    want = [REGIMES[int(k)][1] for k in candidate_grid()[:, 3]]
    np.testing.assert_array_equal(start["jump_clock"], want)


def test_a_prompt_twice_in_a_batch_is_one_posterior_of_every_copy(cache):
    """A training batch across two epochs can hold a prompt twice (the study's basis_track
    arm stopped on the refusal at step 13). Each copy's baseline still holds no reward of its
    own row, and the prompt's state is its first copy's filters updated by Bayes' rule with
    every copy's reward, as the slow reference does it."""
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    slow = est.state_dict()
    difficulty = prior_weights(ref, logit_grid()) @ (1 / (1 + np.exp(-logit_grid())))
    rng = np.random.default_rng(5)
    for cols in ([0, 1, 0, 2], [3, 3, 3, 4], [0, 1, 2, 5], [5, 2, 6, 2]):
        r = (rng.random(4) < 0.5).astype(float)
        got = np.asarray(est.step_columns(np.array(cols), r[:, None]).baselines)[:, 0]
        want, slow = _slow_step(slow, cols, r, est.options, difficulty)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for key, value in est.state_dict().items():
        np.testing.assert_allclose(value, slow[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert_own_reward_unused(est, [ids[c] for c in (4, 1, 4, 4, 7)], np.array([1.0, 0, 0, 1, 1]))


def test_prior_is_the_references_beta_posterior_in_log_odds():
    """k of n with Jeffreys' prior: the grid's mean of sigmoid is the Beta(k + 1/2, n - k +
    1/2) mean, (k + 1/2) / (n + 1), to the grid's accuracy (its ends at log-odds +-8 cut
    the tail of an all-0 or all-1 cache); NaN samples are missing."""
    ref = np.array([[1.0, 0.0, 0.0, np.nan], [1.0] * 4, [0.0] * 4])
    theta = logit_grid()
    w = prior_weights(ref, theta)
    mean = w @ (1 / (1 + np.exp(-theta)))
    np.testing.assert_allclose(mean, [1.5 / 4, 4.5 / 5, 0.5 / 5], atol=5e-3)


def test_baseline_is_independent_of_the_current_reward(cache):
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    for cols, r in _stream(P, steps=5, b=5, seed=2):
        est([ids[c] for c in cols], r[:, None])
    cols, r = next(_stream(P, steps=1, b=5, seed=3))
    assert_own_reward_unused(est, [ids[c] for c in cols], r)


def test_unbiased_given_a_fixed_history_by_monte_carlo(cache):
    """Given one history copied into many streams, E[b_i (r_i - p_i)] = 0 per prompt (b_i
    does not depend on r_i), within 4 standard errors."""
    ids, ref = cache
    one = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    for cols, r in _stream(P, steps=6, b=4, seed=5):
        one.step_columns(cols, r[:, None])
    n, b = 20000, 3
    many = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref, lead=(n,))
    many.load_state_dict(
        {k: np.broadcast_to(v, (n, *v.shape)) for k, v in one.state_dict().items()}
    )
    p = np.linspace(0.3, 0.7, b)
    r = (np.random.default_rng(17).random((n, b)) < p).astype(float)
    base = np.asarray(
        many.step_columns(np.broadcast_to(np.arange(b), (n, b)), r[..., None]).baselines
    )[..., 0]
    prod = (base - base.mean(axis=0)) * (r - p)
    bias, se = prod.mean(axis=0), prod.std(axis=0) / np.sqrt(n)
    assert np.all(np.abs(bias) < 4 * se), (bias, se)
    assert base.std(axis=0).min() > 1e-4  # the batch's other rewards do move b_i


def _evidence_share(state, column, value):
    """The evidence-weighted share of the filters whose drift parameter ``column`` is ``value``."""
    ev = state["evidence"].sum(axis=-1)  # pooled over the value bins
    mix = np.exp(ev - ev.max(axis=-1, keepdims=True))
    mix /= mix.sum(axis=-1, keepdims=True)
    return mix[..., candidate_grid()[:, column] == value].sum(axis=-1)


@pytest.mark.parametrize("rate", [0.0, 0.02])
def test_learned_drift_rate_converges_to_the_true_one(rate):
    """Simulated prompts whose log-odds each take a Gaussian step of variance ``rate`` per
    training step: the evidence (its memory 0.99: about 100 steps of 16 rewards) ends mostly
    on the filters with that drift rate (binary rewards say little about a drift variance:
    one of these cases ends with about 0.7 of the evidence there, not all of it)."""
    rng = np.random.default_rng(11)
    n_prompts, b, steps, streams = 48, 16, 500, 2
    ref = (rng.random((n_prompts, 64)) < 0.5).astype(float)
    est = make_step_estimator(
        "basis_track",
        {"memory": 0.99},
        prompt_ids=[str(i) for i in range(n_prompts)],
        ref_rewards=ref,
        lead=(streams,),
    )
    logit = np.zeros((streams, n_prompts))
    for _ in range(steps):
        logit += math.sqrt(rate) * rng.standard_normal(logit.shape)
        cols = np.argsort(rng.random((streams, n_prompts)), axis=1)[:, :b]
        p = 1 / (1 + np.exp(-np.take_along_axis(logit, cols, 1)))
        est.step_columns(cols, (rng.random(p.shape) < p).astype(float)[..., None])
    share = _evidence_share(est.state, 0, rate)
    assert share.mean() > 0.7, share  # the prior share is 1/2


def _learned_rate(state, pooling):
    """The learned drift rate (variance a step) per difficulty bin (S, K): E[rho] under each
    bin's weights over the filters, softmax_c((1 - w) evidence_{c,k} + w sum_k'
    evidence_{c,k'})."""
    ev = state["evidence"]  # (S, C, K)
    score = (1 - pooling) * ev + pooling * ev.sum(axis=-1, keepdims=True)
    mix = np.exp(score - score.max(axis=1, keepdims=True))
    mix /= mix.sum(axis=1, keepdims=True)
    return np.einsum("sck,c->sk", mix, candidate_grid()[:, 0])


@pytest.mark.parametrize("pooling", [0.0, 0.1])
def test_learned_drift_depends_on_where_the_prompt_stands(pooling):
    """Simulated prompts whose drift depends on their difficulty: prompts of middling
    reference rate (1/2, the middle bin) take a Gaussian step of variance 0.02 a step in
    log-odds; prompts the reference found hard or easy (rates 0.06 and 0.94, the outer bins;
    values 0.18 and 0.82) stand still. The drift rate learned per bin ends near 0.02 in the
    middle and near 0 in the outer bins; one drift model for all prompts cannot do both."""
    rng = np.random.default_rng(21)
    n_mid, n_end, b, steps, streams = 24, 12, 16, 500, 2
    n_prompts = n_mid + 2 * n_end
    rate = np.concatenate([np.full(n_mid, 0.5), np.full(n_end, 0.06), np.full(n_end, 0.94)])
    ref = (rng.random((n_prompts, 64)) < rate[:, None]).astype(float)
    est = make_step_estimator(
        "basis_track",
        {"memory": 1.0, "pooling": pooling},
        prompt_ids=[str(i) for i in range(n_prompts)],
        ref_rewards=ref,
        lead=(streams,),
    )
    stands = np.concatenate([np.zeros(n_mid), np.full(n_end, -1.5), np.full(n_end, 1.5)])
    logit = np.broadcast_to(stands, (streams, n_prompts)).copy()
    for _ in range(steps):
        logit[:, :n_mid] += math.sqrt(0.02) * rng.standard_normal((streams, n_mid))
        cols = np.argsort(rng.random((streams, n_prompts)), axis=1)[:, :b]
        p = 1 / (1 + np.exp(-np.take_along_axis(logit, cols, 1)))
        est.step_columns(cols, (rng.random(p.shape) < p).astype(float)[..., None])
    assert list(np.searchsorted(DIFFICULTY_EDGES, [0.5, 0.06, 0.94])) == [2, 0, 4]
    learned = _learned_rate(est.state, pooling)
    assert np.all(learned[:, 2] > 0.014) and np.all(learned[:, [0, 4]] < 0.006), learned


def _regime_share(state, regime):
    """The pooled evidence's share of the filters in ``regime`` (0 moving, 1 standing)."""
    ev = state["evidence"].sum(axis=-1)
    mix = np.exp(ev - ev.max(axis=-1, keepdims=True))
    mix /= mix.sum(axis=-1, keepdims=True)
    return mix[..., candidate_grid()[:, 3] == regime].sum(axis=-1)


def test_a_policy_that_jumps_often_is_learned_as_moving(cache):
    """Every 10 steps the policy's log-odds take a common shift of +-1.5 and a move of their
    own (N(0, 1) per prompt), every prompt each step: the evidence ends on the moving
    regime's filters (a jump per ten steps), not on the standing ones (a jump per hundred)."""
    ids, ref = cache
    est = make_step_estimator("basis_track", {"memory": 1.0}, prompt_ids=ids, ref_rewards=ref)
    rng = np.random.default_rng(8)
    stands, shift, own = np.linspace(-1.5, 1.5, P), -1.5, np.zeros(P)
    for t in range(300):
        if t % 10 == 0:
            shift, own = -shift, rng.standard_normal(P)
        p = 1 / (1 + np.exp(-(stands + shift + own)))
        est.step_columns(np.arange(P), (rng.random(P) < p).astype(float)[:, None])
    assert _regime_share(est.state, 0) > 0.9


def test_standing_policy_converges_to_its_values(cache):
    """A policy that never moves, every prompt each step: the error falls from the
    reference's to a floor of a few hundredths (the soft jump count keeps a little drift in
    the filters the evidence prefers; docs/method.md), and the evidence learns that the
    prompts do not drift step by step (rho = 0) and that the policy stands (the standing
    regime: a jump per hundred steps)."""
    ids, ref = cache
    p = np.linspace(0.1, 0.9, P)
    est = make_step_estimator("basis_track", {"memory": 1.0}, prompt_ids=ids, ref_rewards=ref)
    rng = np.random.default_rng(8)
    cols, errors = np.arange(P), []
    for _ in range(400):
        out = est.step_columns(cols, (rng.random(P) < p).astype(float)[:, None])
        errors.append(np.abs(np.asarray(out.baselines)[:, 0] - p).mean())
    late = np.mean(errors[-100:])
    assert late < 0.07 and late < errors[0] / 4, (errors[0], late)
    assert _evidence_share(est.state, 0, 0.0) > 0.9
    assert _regime_share(est.state, 1) > 0.9


def test_a_checkpoint_of_the_old_layout_is_refused_by_name(cache):
    """The state before the posteriors' layout changed (weights (C, P, G), last_level and
    last_jump_clock (C, P)): refused with the keys named, never loaded transposed."""
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    state = est.state_dict()
    old = {
        k: v for k, v in state.items() if k not in ("posteriors", "visit_level", "visit_jump_clock")
    }
    old["weights"] = np.swapaxes(state["posteriors"], 0, 1)
    old["last_level"], old["last_jump_clock"] = state["visit_level"].T, state["visit_jump_clock"].T
    with pytest.raises(InputError, match=r"has keys .*posteriors"):
        est.load_state_dict(old)


def test_state_round_trips_through_state_dict(cache):
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    stream = list(_stream(P, steps=6, b=4, seed=7))
    for cols, r in stream[:3]:
        est.step_columns(cols, r[:, None])
    saved = est.state_dict()
    first = [est.step_columns(c, r[:, None]).baselines for c, r in stream[3:]]
    fresh = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    fresh.load_state_dict(saved)
    second = [fresh.step_columns(c, r[:, None]).baselines for c, r in stream[3:]]
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)


def test_numpy_equals_torch_and_fractional_rewards(cache):
    torch = pytest.importorskip("torch")
    ids, ref = cache
    a = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    b = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    rng = np.random.default_rng(4)
    for cols, _ in _stream(P, steps=3, b=4, seed=4):
        r = rng.random(4)  # rewards in [0, 1]: the fractional Bernoulli likelihood
        x = a.step_columns(cols, r[:, None]).baselines
        y = b.step_columns(cols, torch.tensor(r[:, None], dtype=torch.float64)).baselines
        assert isinstance(y, torch.Tensor)
        np.testing.assert_array_equal(x, y.numpy())


@pytest.mark.parametrize(
    ("reward", "reward_range", "message"),
    [
        (np.nan, (0.0, 1.0), "NaN or infinite"),
        (1.5, (0.0, 1.0), "outside the declared reward range"),
        (1.5, (0.0, 2.0), r"needs rewards in \[0, 1\]"),
        (-0.5, None, r"needs rewards in \[0, 1\]"),
    ],
)
@pytest.mark.parametrize("streams", [None, 2])
def test_a_bad_reward_is_refused_before_the_state_moves(
    cache, reward, reward_range, message, streams
):
    """Checked where the step reads the rewards (:func:`track_loops.gather`), no pass of
    its own: the check's messages, the state as it was."""
    ids, ref = cache
    lead = () if streams is None else (streams,)
    est = make_step_estimator(
        "basis_track", prompt_ids=ids, ref_rewards=ref, reward_range=reward_range, lead=lead
    )
    cols = np.arange(4).reshape(*lead, -1) if lead else np.arange(4)
    r = np.full((*cols.shape, 1), 0.25)
    est.step_columns(cols, r)
    before = est.state_dict()
    r[(0,) * r.ndim] = reward
    with pytest.raises(InputError, match=message):
        est.step_columns(cols, r)
    for key, value in est.state_dict().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


@pytest.mark.parametrize("cache_value, reward_value", [(0, 0), (1, 1), (0, 1), (1, 0)])
def test_never_zero_or_one(cache, cache_value, reward_value):
    ids, ref = cache
    est = make_step_estimator(
        "basis_track", prompt_ids=ids, ref_rewards=np.full_like(ref, cache_value)
    )
    for _ in range(60):
        out = est(ids[:2], np.full((2, 1), float(reward_value))).baselines
        assert np.all((out > 0) & (out < 1)), out


def test_runs_through_make_step_estimator_for_a_training_stream(cache):
    """What the training loop and the verl/TRL plug-ins do: prompt ids and (B, 1) rewards,
    step after step; a prompt seen in a batch moves its own baseline on its next visit."""
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    assert est.carries_state
    before = est(ids[:4], np.zeros((4, 1))).baselines
    for _ in range(5):
        out = est(ids[:4], np.ones((4, 1)))
        assert out.baselines.shape == (4, 1)
    assert np.all(out.baselines > before)
    assert est.state_dict()["step"] == 6


def test_refusals(cache):
    ids, ref = cache
    est = make_step_estimator("basis_track", prompt_ids=ids, ref_rewards=ref)
    with pytest.raises(InputError):
        est(ids[:2], np.array([[2.0], [0.0]]))
    with pytest.raises(InputError, match="memory"):
        make_step_estimator("basis_track", {"memory": 1.5}, prompt_ids=ids, ref_rewards=ref)


def test_training_loop_builds_it_and_its_checkpoint_resumes_exactly(cache, tmp_path):
    """`basis-bench train`'s estimator and checkpoint: the state through torch.save and a
    weights-only torch.load gives the same next baselines."""
    torch = pytest.importorskip("torch")
    from basis_bench.train import make_config, make_estimator
    from basis_bench.train.checkpoint import estimator_state, load_estimator_state

    ids, ref = cache
    est = make_estimator(make_config({}, ["estimator=basis_track"]), ids, ref)
    for cols, r in _stream(P, steps=3, b=4, seed=12):
        est([ids[c] for c in cols], r[:, None])
    torch.save(estimator_state(est), tmp_path / "s.pt")
    again = make_estimator(make_config({}, ["estimator=basis_track"]), ids, ref)
    load_estimator_state(again, torch.load(tmp_path / "s.pt", weights_only=True))
    cols, r = next(_stream(P, steps=1, b=4, seed=13))
    batch = [ids[c] for c in cols]
    np.testing.assert_array_equal(
        est(batch, r[:, None]).baselines, again(batch, r[:, None]).baselines
    )


def test_the_level_step_stays_finite_when_the_batch_carries_no_information() -> None:
    """Every prediction of the batch at 0 or 1 rounds the sensitivity H to 0 or a hair below
    (seen on the default data at B = 12, 100 repeats: a NaN level, then an IndexError)."""
    from basis_bench.estimators.track import LEVEL_NOISE
    from basis_bench.estimators.track_loops import level_collapse, level_spreads

    noise = np.array(LEVEL_NOISE)
    for curv in (0.0, -1.1e-16, -3e-31):
        spreads = [level_spreads(curv, 204.8 + q) for q in LEVEL_NOISE]
        ev = [-0.5 * (np.log(x) + 0.0**2 / x) for x in spreads]
        mean, var, jumped = level_collapse(
            0.3, 204.8, 0.43, 0.0, curv, np.exp(ev[0] - ev[1]), noise
        )
        assert np.isfinite([mean, var, jumped]).all()

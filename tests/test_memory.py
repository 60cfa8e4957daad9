"""basis_memory: its selection against a slow reference, unbiasedness given a fixed history,
no 0/1 baselines on degenerate histories, numpy == torch, and the step interface's state."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import assert_own_reward_unused

from basis_bench.errors import InputError
from basis_bench.estimators import (
    EstimatorInput,
    MemoryOptions,
    get,
    make_step_estimator,
)
from basis_bench.estimators.memory import MEMORY_SHIFTS
from basis_bench.estimators.tilt import default_betas, tilted_moments

P, N_REF = 12, 16


@pytest.fixture
def cache() -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(P)]
    ref = (rng.random((P, N_REF)) < rng.uniform(0.05, 0.95, (P, 1))).astype(float)
    return ids, ref


def _slow_memory(ref, ids, stream, options: MemoryOptions):
    """Plain-Python reference: per prompt, a list of its earlier rewards; per candidate
    (beta, gamma, m, delta), a running discounted sum of its past batches' losses; prompt i's choice
    minimises that sum plus the other prompts' (``loo``) or all prompts' (``batch``) losses of
    this batch, one prompt and one candidate at a time.

    Returns, per step, each prompt's admissible baselines (the predictions of every
    candidate within 1e-9 of the minimum: float order may break a near-tie either way), and
    the accumulated losses after the last step, {candidate: A}."""
    betas = default_betas()
    v_table, _ = tilted_moments(ref, betas)
    v_table = np.asarray(v_table)
    history: dict[int, list[float]] = {i: [] for i in range(len(ids))}
    cands = list(
        itertools.product(range(len(betas)), options.gammas, options.weights, options.shifts)
    )
    acc = {c: 0.0 for c in cands}
    lam = options.loss_memory

    def post(col, k, gamma, m, shift):
        past = history[col]
        s = sum(gamma ** (len(past) - 1 - a) * r for a, r in enumerate(past))
        n = sum(gamma ** (len(past) - 1 - a) for a in range(len(past)))
        b = (m * v_table[k, col] + s) / (m + n)
        return 1 / (1 + math.exp(-(math.log(b / (1 - b)) + shift)))

    def loss(r, b):
        if options.loss == "squared":
            return (r - b) ** 2
        b = min(max(b, 1e-6), 1 - 1e-6)
        return -(r * math.log(b) + (1 - r) * math.log(1 - b))

    out = []
    for batch_ids, rewards in stream:
        cols = [ids.index(p) for p in batch_ids]
        own = {c: [loss(rewards[j], post(col, *c)) for j, col in enumerate(cols)] for c in cands}
        admissible = []
        for i, col in enumerate(cols):
            score = {}
            for c in cands:
                others = [
                    own[c][j] for j in range(len(cols)) if options.selection == "batch" or j != i
                ]
                score[c] = acc[c] + sum(others)
            best = min(score.values())
            admissible.append([post(col, *c) for c in cands if score[c] <= best + 1e-9])
        for c in cands:
            acc[c] = lam * (acc[c] + sum(own[c]))
        for col, r in zip(cols, rewards, strict=True):
            history[col].append(float(r))
        out.append(admissible)
    return out, acc


def _stream(ids, steps=4, b=5, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        pick = rng.choice(len(ids), b, replace=False)
        yield [ids[i] for i in pick], (rng.random(b) < 0.5).astype(float)


@pytest.mark.parametrize(
    "loss_memory, selection, loss, shifts",
    [(0.0, "loo", "squared", (-1.0, 0.0, 2.0)), (0.5, "loo", "squared", (-1.0, 0.0, 2.0)),
     (1.0, "loo", "squared", (0.0, 1.0)), (0.7, "loo", "log", (-1.0, 0.0, 2.0)),
     (0.5, "batch", "squared", (-1.0, 0.0, 2.0)), (0.5, "loo", "squared", (0.0,))],
)  # fmt: skip
def test_selection_matches_a_slow_reference(cache, loss_memory, selection, loss, shifts):
    """Baselines and the accumulated losses (the state) against the loop-based reference."""
    ids, ref = cache
    opts = MemoryOptions(
        gammas=(0.5, 1.0), weights=(1.0, 4.0), shifts=shifts, loss_memory=loss_memory,
        selection=selection, loss=loss,
    )  # fmt: skip
    stream = list(_stream(ids, steps=8, b=5, seed=11))
    want, acc = _slow_memory(ref, ids, stream, opts)
    est = make_step_estimator("basis_memory", opts, prompt_ids=ids, ref_rewards=ref)
    for (batch_ids, rewards), admissible in zip(stream, want, strict=True):
        got = est(batch_ids, rewards[:, None]).baselines[:, 0]
        for value, allowed in zip(got, admissible, strict=True):
            assert np.min(np.abs(np.asarray(allowed) - value)) < 1e-12, (value, allowed)
    np.testing.assert_allclose(est.state_dict()["losses"], list(acc.values()), rtol=1e-12)


def _exact_memory_values(v, s, n, rewards, options, past=None, prompt_shift=None):
    """memory_values one stream and one prompt at a time, every candidate's leave-one-out
    score computed (no pruning), the batch's losses summed prompt after prompt: the same
    floating point operations in the same order, so its outputs must agree to the bit."""
    w, shifts = np.asarray(options.weights), np.asarray(options.shifts)
    lead, b = rewards.shape[:-1], rewards.shape[-1]
    values, choice = np.empty(rewards.shape), np.empty(rewards.shape, dtype=np.intp)
    totals = []

    def moved(p, shift):
        with np.errstate(divide="ignore"):
            return p if shift == 0.0 else 1.0 / (1.0 + np.exp(-shift) * (1.0 - p) / p)

    for j in np.ndindex(*lead):
        preds = []
        for i in range(b):
            vi, si, ni = v[(slice(None), *j, i)], s[(*j, slice(None), i)], n[(*j, slice(None), i)]
            post = (w * vi[:, None, None] + si[:, None]) / (w + ni[:, None])  # (K, Gm, M)
            if shifts.shape == (1,) and shifts[0] == 0.0:
                pred = post[..., None].ravel()
            else:
                odds = ((1.0 - post) / post)[..., None]
                pred = (1.0 / (odds * np.exp(-shifts) + 1.0)).ravel()
            if prompt_shift is not None:
                pred = np.concatenate([pred, moved(pred, prompt_shift[0][j][i])])
            preds.append(pred)
        r = rewards[j]
        if options.loss == "squared":
            loss = [np.square(r[i] - preds[i]) for i in range(b)]
        else:
            clipped = [np.clip(p, 1e-6, 1 - 1e-6) for p in preds]
            loss = [-(r[i] * np.log(c) + (1 - r[i]) * np.log1p(-c)) for i, c in enumerate(clipped)]
        total = loss[0] + 0.0
        for row in loss[1:]:
            total += row
        totals.append(total)
        score = total if past is None else total + past[j]
        for i in range(b):
            k = int(np.argmin(score - loss[i] if options.selection == "loo" else score))
            choice[(*j, i)], values[(*j, i)] = k, preds[i][k]
            half = len(score) // 2
            if prompt_shift is not None and k >= half:
                values[(*j, i)] = moved(preds[i][k - half], prompt_shift[1][j][i])
    return values, choice, np.reshape(totals, (*lead, -1))


@pytest.mark.parametrize(
    "loss, selection", [("squared", "loo"), ("log", "loo"), ("squared", "batch")]
)
@pytest.mark.parametrize("chunk_streams", [None, 2])
@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("shifts", [MEMORY_SHIFTS, (0.0,), (0.5,), (-1.0, 0.0, 0.5, 1.0, 3.0)])
def test_memory_values_agree_with_an_exact_reference_to_the_bit(
    monkeypatch, loss, selection, chunk_streams, context, shifts
):
    """Baselines, choices and the batch's losses equal the reference's bit for bit: on a
    first step (no history, no past: every discount ties) and on later steps whose
    accumulated losses leave a few candidates in the running (the leave-one-out choice
    computes only theirs); in chunks of 2 streams and 1, or all at once; with the copy of
    the grid moved by a per-prompt shift (basis_context), some of the shifts 0; with the
    default 4 logit shifts, none (b itself), one, and 5 (the compiled loop is specialised
    to the number of shifts)."""
    from basis_bench.estimators import memory, memory_values

    rng = np.random.default_rng(7)
    lead, b, k = (3,), 6, 5
    options = MemoryOptions(selection=selection, loss=loss, shifts=shifts)
    n_cand = k * len(options.gammas) * len(options.weights) * len(options.shifts)
    n_cand *= 2 if context else 1
    if chunk_streams is not None:
        monkeypatch.setattr(memory, "_CHUNK_ELEMENTS", chunk_streams * b * n_cand)
    v = rng.uniform(0.02, 0.98, (k, *lead, b))
    past = None
    for visits in (0, 1, 3, 8):
        n = np.broadcast_to(
            np.asarray([(1 - g**visits) / (1 - g) if g < 1 else visits for g in options.gammas])[
                :, None
            ],
            (*lead, len(options.gammas), b),
        ).copy()
        s = n * rng.uniform(0, 1, n.shape)
        rewards = (rng.random((*lead, b)) < 0.5).astype(float)
        shift = None
        if context:
            judged, served = rng.normal(0, 1, (2, *lead, b))
            judged[..., 0] = 0.0
            served[..., 1] = 0.0
            shift = (judged, served)
        got = memory_values(v, s, n, rewards, options, past, shift)
        want = _exact_memory_values(v, s, n, rewards, options, past, shift)
        for x, y in zip(got, want, strict=True):
            assert x.shape == y.shape and x.tobytes() == y.tobytes()
        past = got[2] * 10.0 if past is None else 0.9 * (past + got[2])


def test_accumulated_losses_change_the_choice(cache):
    """The past enters the choice: on the same stream, lambda = 0.9 and lambda = 0 differ."""
    ids, ref = cache
    stream = list(_stream(ids, steps=8, b=5, seed=11))
    outs = []
    for lam in (0.0, 0.9):
        est = make_step_estimator(
            "basis_memory", {"loss_memory": lam}, prompt_ids=ids, ref_rewards=ref
        )
        outs.append(np.concatenate([est(i, r[:, None]).baselines[:, 0] for i, r in stream]))
    np.testing.assert_array_equal(outs[0][:5], outs[1][:5])  # the first step has no past
    assert not np.array_equal(outs[0], outs[1])


def test_baseline_is_independent_of_the_current_reward(cache):
    """b_i uses the cache, prompt i's history and r_{-i}: flipping r_i leaves b_i unchanged."""
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    for batch_ids, rewards in _stream(ids, steps=3, b=6, seed=1):
        est(batch_ids, rewards[:, None])
    batch_ids, rewards = next(_stream(ids, steps=1, b=6, seed=2))
    assert_own_reward_unused(est, batch_ids, rewards)


def _fixed_history_streams(ids, ref, options, r_streams, seed=5):
    """One stream's history (accumulated losses included), copied into ``r_streams``."""
    one = make_step_estimator("basis_memory", options, prompt_ids=ids, ref_rewards=ref)
    for batch_ids, rewards in _stream(ids, steps=6, b=6, seed=seed):
        one(batch_ids, rewards[:, None])
    many = make_step_estimator(
        "basis_memory", options, prompt_ids=ids, ref_rewards=ref, lead=(r_streams,)
    )
    many.load_state_dict(
        {k: np.broadcast_to(v, (r_streams, *v.shape)) for k, v in one.state_dict().items()}
    )
    return many


def _gradient_bias(options, cache, b, r_streams=20000):
    """Given a fixed history, E[b_i (r_i - p_i)] per prompt and its standard error: zero
    exactly when b_i does not depend on r_i, since then E[(r_i - b_i) s_i] = E[r_i s_i] for
    the score s_i = r_i - p_i (d/dlogit log p of a Bernoulli's outcome)."""
    ids, ref = cache
    rng = np.random.default_rng(17)
    est = _fixed_history_streams(ids, ref, options, r_streams)
    p = np.linspace(0.3, 0.7, b)
    cols = np.broadcast_to(np.arange(b), (r_streams, b))
    r = (rng.random((r_streams, b)) < p).astype(float)
    base = np.asarray(est.step_columns(cols, r[..., None]).baselines)[..., 0]
    prod = (base - base.mean(axis=0)) * (r - p)  # E[s_i] = 0: E[b_i s_i] = Cov(b_i, s_i)
    return prod.mean(axis=0), prod.std(axis=0) / np.sqrt(r_streams)


@pytest.mark.parametrize("loss_memory", [0.0, 0.9, 1.0])
def test_unbiased_given_a_fixed_history_by_monte_carlo(cache, loss_memory):
    opts = MemoryOptions(gammas=(0.5, 1.0), weights=(1.0, 4.0, 16.0), loss_memory=loss_memory)
    bias, se = _gradient_bias(opts, cache, b=3)
    assert np.all(np.abs(bias) < 4 * se), (bias, se)


def test_monte_carlo_detects_a_baseline_that_sees_its_own_reward(cache):
    """The same check fails for ``selection="batch"`` (r_i takes part in b_i's choice)."""
    opts = MemoryOptions(gammas=(0.5, 1.0), weights=(1.0, 4.0, 16.0), selection="batch")
    bias, se = _gradient_bias(opts, cache, b=3)
    assert np.any(np.abs(bias) > 6 * se), (bias, se)


@pytest.mark.parametrize("b", [2, 4])
@pytest.mark.parametrize("cache_value, reward_value", [(0, 0), (1, 1), (0, 1), (1, 0)])
@pytest.mark.parametrize("loss_memory", [0.0, 0.9, 1.0])
def test_never_zero_or_one_on_degenerate_batches(cache, b, cache_value, reward_value, loss_memory):
    """All-0 / all-1 cache and batches, B = 2 included, for many steps: b strictly in (0, 1)."""
    ids, ref = cache
    ref = np.full_like(ref, float(cache_value))
    opts = {"loss_memory": loss_memory, "weights": [0.01, 1.0, 128.0]}
    est = make_step_estimator("basis_memory", opts, prompt_ids=ids, ref_rewards=ref)
    for _ in range(40):
        out = est(ids[:b], np.full((b, 1), float(reward_value))).baselines
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


@pytest.mark.parametrize("chunk_streams", [None, 1, 2])
def test_parallel_streams_equal_separate_streams(cache, monkeypatch, chunk_streams):
    """lead = (3,): each stream's baselines and state as if it ran alone (no mixing), whether
    the streams go through in one chunk, one at a time, or in chunks of 2 and 1."""
    from basis_bench.estimators import memory

    if chunk_streams is not None:  # B = 4 prompts x C candidates per stream
        o = MemoryOptions()
        n_cand = len(default_betas()) * len(o.gammas) * len(o.weights) * len(o.shifts)
        monkeypatch.setattr(memory, "_CHUNK_ELEMENTS", chunk_streams * 4 * n_cand)
    ids, ref = cache
    streams = [list(_stream(ids, steps=5, b=4, seed=20 + k)) for k in range(3)]
    many = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref, lead=(3,))
    alone = [make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref) for _ in range(3)]
    for t in range(5):
        cols = np.stack([many.columns(streams[k][t][0]) for k in range(3)])
        rewards = np.stack([streams[k][t][1] for k in range(3)])[..., None]
        got = np.asarray(many.step_columns(cols, rewards).baselines)
        for k in range(3):
            want = alone[k](streams[k][t][0], rewards[k]).baselines
            np.testing.assert_array_equal(got[k], want)
    for key, value in many.state_dict().items():
        for k in range(3):
            np.testing.assert_array_equal(value[k], alone[k].state_dict()[key])


def test_train_state_survives_weights_only_torch_load(cache, tmp_path):
    torch = pytest.importorskip("torch")
    from basis_bench.train import make_config, make_estimator
    from basis_bench.train.checkpoint import estimator_state, load_estimator_state

    ids, ref = cache
    est = make_estimator(make_config({}, ["estimator=basis_memory"]), ids, ref)
    for batch_ids, rewards in _stream(ids, steps=2, b=5):
        est(batch_ids, rewards[:, None])
    torch.save(estimator_state(est), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    assert set(state) == {"basis_previous_index", "estimator_state"}  # the checkpoint's keys
    again = make_estimator(make_config({}, ["estimator=basis_memory"]), ids, ref)
    load_estimator_state(again, state)
    batch_ids, rewards = next(_stream(ids, steps=1, b=5, seed=9))
    np.testing.assert_array_equal(
        est(batch_ids, rewards[:, None]).baselines, again(batch_ids, rewards[:, None]).baselines
    )


def test_first_visit_is_the_leave_one_out_tilt(cache):
    """With no history the posterior is the prior: V^ at prompt i's leave-one-out beta, its
    logit moved by the leave-one-out shift."""
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    batch_ids, rewards = next(_stream(ids, steps=1, b=6))
    out = est(batch_ids, rewards[:, None]).baselines[:, 0]
    v = np.asarray(tilted_moments(ref, default_betas())[0])[:, [ids.index(p) for p in batch_ids]]
    shifts = np.asarray(MemoryOptions().shifts)[:, None, None]
    v = (1 / (1 + np.exp(-(np.log(v / (1 - v)) + shifts)))).reshape(-1, 6)  # (D K, B)
    loss = (rewards - v) ** 2
    k = np.argmin(loss.sum(axis=1, keepdims=True) - loss, axis=0)
    np.testing.assert_allclose(out, v[k, np.arange(6)], atol=1e-15)


def test_a_prompt_twice_in_a_batch_adds_both_rewards_at_one_age(cache):
    """A training batch across two epochs can hold a prompt twice: both copies are one
    visit's age, S <- gamma S + r_1 + r_2 and N <- gamma N + 2 for every gamma of the grid,
    and neither copy's baseline holds its own reward."""
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    for batch, r in _stream(ids, steps=3, b=5, seed=4):
        est(batch, r[:, None])
    gamma = np.asarray(est.options.gammas)[:, None]
    batch, r = [ids[0], ids[1], ids[0], ids[0], ids[2]], np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    before = est.state_dict()
    assert_own_reward_unused(est, batch, r)
    est.load_state_dict(before)
    est(batch, r[:, None])
    after = est.state_dict()
    for col, wins, visits in ((0, 2.0, 3.0), (1, 0.0, 1.0), (2, 1.0, 1.0)):
        np.testing.assert_allclose(
            after["successes"][:, col], gamma[:, 0] * before["successes"][:, col] + wins
        )
        np.testing.assert_allclose(
            after["visits"][:, col], gamma[:, 0] * before["visits"][:, col] + visits
        )


def test_refusals(cache):
    ids, ref = cache
    est = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    with pytest.raises(InputError, match="B >= 2"):
        est([ids[0]], np.zeros((1, 1)))
    with pytest.raises(InputError, match="carries state"):
        get("basis_memory")(EstimatorInput(np.zeros((3, 1)), np.zeros((1, 3)), np.zeros((1, 3))))
    with pytest.raises(InputError, match="gammas"):
        MemoryOptions(gammas=(0.0,))
    with pytest.raises(InputError, match="weights"):
        MemoryOptions(weights=())
    with pytest.raises(InputError, match="shape"):
        est.load_state_dict({k: v[..., :3] for k, v in est.state_dict().items()})
    with pytest.raises(InputError, match="loss_memory"):
        MemoryOptions(loss_memory=1.5)
    for shifts in ((), (math.inf,), (math.nan,)):
        with pytest.raises(InputError, match="shifts"):
            MemoryOptions(shifts=shifts)


def test_plugins_call_a_stateful_estimator_like_basis(tmp_path):
    """verl/TRL call a stateful estimator as they call BASIS, one rollout per prompt, state kept."""
    from basis_bench.integrations.keys import one_rollout_step

    ids = [f"q{i}" for i in range(6)]
    ref = np.tile([[1.0, 0.0, 0.0, 1.0]], (6, 1))
    adapter = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    r = np.array([1.0, 0, 1, 0, 1, 0])
    first = one_rollout_step(adapter, ids, r)
    second = one_rollout_step(adapter, ids, r)
    assert first.baselines.shape == (6,) and not np.array_equal(first.baselines, second.baselines)
    assert set(adapter.state_dict()) == {"successes", "visits", "losses"}

"""basis_context: its leave-one-out shift against explicit refits, unbiasedness given a fixed
history, no 0/1 baselines, invariances, basis_memory as its phi = 0 case, and its state."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import assert_own_reward_unused, run_main

from basis_bench.errors import InputError
from basis_bench.estimators import ContextOptions, make_step_estimator
from basis_bench.estimators.context import INTERCEPT_RIDGE, standardised
from basis_bench.estimators.memory import History
from basis_bench.rollouts.features import (
    plain_features,
    prompt_features,
    stored_features,
    text_features,
)

P, N_REF, D = 12, 16, 3


@pytest.fixture
def cache() -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(P)]
    ref = (rng.random((P, N_REF)) < rng.uniform(0.05, 0.95, (P, 1))).astype(float)
    return ids, ref, rng.normal(size=(P, D))


def _stream(ids, steps=4, b=5, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        pick = rng.choice(len(ids), b, replace=False)
        yield [ids[i] for i in pick], (rng.random(b) < 0.5).astype(float)


def _run(est, stream):
    return [np.asarray(est(i, r[:, None]).baselines)[:, 0] for i, r in stream]


@pytest.mark.parametrize("lag", [True, False])
def test_shift_matches_explicit_leave_one_out_refits(cache, lag):
    """The closed form (Sherman-Morrison) against one explicit Newton step per prompt on the
    history's curvature and the batch without that prompt."""
    ids, ref, feats = cache
    est = make_step_estimator(
        "basis_context", {"lag": lag}, prompt_ids=ids, ref_rewards=ref, features=feats
    )
    kernel = est.kernel
    for batch_ids, rewards in _stream(ids, steps=5, b=6, seed=2):
        est(batch_ids, rewards[:, None])
    batch_ids, r = next(_stream(ids, steps=1, b=6, seed=9))
    cols = est.columns(batch_ids)
    state = est.state_dict()
    s = np.take_along_axis(state["successes"], np.broadcast_to(cols, (4, 6)), axis=-1)
    n = np.take_along_axis(state["visits"], np.broadcast_to(cols, (4, 6)), axis=-1)
    history = History(kernel.table.values[:, cols], s, n)
    fit = kernel.fit_shift(state, cols, r, history)
    got = fit.served
    # the offsets by brute force: the best unmoved candidate's posterior, shift included
    opts = est.options
    best = int(np.argmin(state["losses"][: kernel.n_candidates // 2]))
    k, g, m, d = np.unravel_index(best, kernel.grid)
    w = opts.weights[m]
    post = (w * kernel.table.values[k, cols] + s[g]) / (w + n[g])
    o = np.log(post / (1 - post)) + opts.shifts[d]
    x = standardised(feats, P)[cols]
    theta, curv = state["coef"], state["fit_curvature"]
    pen = np.diag([INTERCEPT_RIDGE] + [opts.ridge] * D)
    p = 1 / (1 + np.exp(-(o + x @ theta)))
    for i in range(6):
        keep = np.arange(6) != i
        c, e = p[keep] * (1 - p[keep]), r[keep] - p[keep]
        hess = opts.fit_memory * curv + pen + (x[keep].T * c) @ x[keep]
        theta_i = theta + np.linalg.solve(hess, x[keep].T @ e - pen @ theta)
        want = x[i] @ theta_i if lag else x[i, 1:] @ theta_i[1:]
        assert got[i] == pytest.approx(want, abs=1e-12)
    judged = x @ theta if lag else x[:, 1:] @ theta[1:]
    np.testing.assert_allclose(fit.judged, judged, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("features", [None, "zeros"])
def test_without_features_or_lag_it_is_basis_memory(cache, features):
    """phi = 0 and lag = false: the moved copy is the unmoved one, the choice basis_memory's."""
    ids, ref, _ = cache
    feats = np.zeros((P, D)) if features == "zeros" else None
    stream = list(_stream(ids, steps=8, b=5, seed=4))
    ctx = make_step_estimator(
        "basis_context", {"lag": False}, prompt_ids=ids, ref_rewards=ref, features=feats
    )
    mem = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    for x, y in zip(_run(ctx, stream), _run(mem, stream), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_predictive_feature_moves_the_baselines():
    """200 prompts seen once each, rewards that follow a feature: the moved copy wins and
    beats basis_memory, which has only the tilt on a first visit."""
    rng = np.random.default_rng(0)
    ids = [f"q{i}" for i in range(200)]
    ref = (rng.random((200, 16)) < 0.5).astype(float)
    feats = rng.normal(size=(200, 3))
    ctx = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
    mem = make_step_estimator("basis_memory", prompt_ids=ids, ref_rewards=ref)
    order, err, moved = rng.permutation(200), np.zeros(2), []
    for t in range(25):
        pick = order[8 * t : 8 * t + 8]
        batch, r = [ids[i] for i in pick], (feats[pick, 0] > 0).astype(float)[:, None]
        out = ctx(batch, r)
        moved.append(out.info["moved"])
        err += [np.mean((out.baselines - r) ** 2), np.mean((mem(batch, r).baselines - r) ** 2)]
    assert err[0] < 0.8 * err[1], err
    assert np.mean(moved[-10:]) > 0.5


def test_baseline_is_independent_of_the_current_reward(cache):
    ids, ref, feats = cache
    est = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
    for batch_ids, rewards in _stream(ids, steps=4, b=6, seed=1):
        est(batch_ids, rewards[:, None])
    batch_ids, rewards = next(_stream(ids, steps=1, b=6, seed=2))
    assert_own_reward_unused(est, batch_ids, rewards)


def test_unbiased_given_a_fixed_history_by_monte_carlo(cache):
    """E[b_i (r_i - p_i)] = 0 given the history (the score of a Bernoulli outcome): b_i does
    not depend on r_i, so the advantage's gradient is unbiased. 20,000 copies of one history."""
    ids, ref, feats = cache
    opts = {"gammas": [0.5, 1.0], "weights": [1.0, 4.0, 16.0]}
    one = make_step_estimator(
        "basis_context", opts, prompt_ids=ids, ref_rewards=ref, features=feats
    )
    for batch_ids, rewards in _stream(ids, steps=6, b=6, seed=5):
        one(batch_ids, rewards[:, None])
    streams, b = 20000, 3
    many = make_step_estimator(
        "basis_context", opts, prompt_ids=ids, ref_rewards=ref, features=feats, lead=(streams,)
    )
    many.load_state_dict(
        {k: np.broadcast_to(v, (streams, *v.shape)) for k, v in one.state_dict().items()}
    )
    rng = np.random.default_rng(17)
    p = np.linspace(0.3, 0.7, b)
    r = (rng.random((streams, b)) < p).astype(float)
    cols = np.broadcast_to(np.arange(b), (streams, b))
    base = np.asarray(many.step_columns(cols, r[..., None]).baselines)[..., 0]
    assert np.ptp(base, axis=0).max() > 1e-3, "the baselines must vary with the others' rewards"
    prod = (base - base.mean(axis=0)) * (r - p)
    bias, se = prod.mean(axis=0), prod.std(axis=0) / np.sqrt(streams)
    assert np.all(np.abs(bias) < 4 * se), (bias, se)


@pytest.mark.parametrize("cache_value, reward_value", [(0, 0), (1, 1), (0, 1), (1, 0)])
def test_never_zero_or_one_on_degenerate_batches(cache, cache_value, reward_value):
    """All-0 / all-1 caches and batches for many steps, extreme features: b strictly in (0, 1)."""
    ids, ref, feats = cache
    ref = np.full_like(ref, float(cache_value))
    opts = {"weights": [0.01, 1.0, 128.0], "ridge": 1e-6, "fit_memory": 1.0}
    est = make_step_estimator(
        "basis_context", opts, prompt_ids=ids, ref_rewards=ref, features=1e6 * feats
    )
    for _ in range(40):
        out = est(ids[:2], np.full((2, 1), float(reward_value))).baselines
        assert np.all((out > 0) & (out < 1)), out


def test_invariances(cache):
    """Permuting the batch permutes the baselines; the features' scale, offset and column
    order do not matter (they are standardised)."""
    ids, ref, feats = cache
    stream = list(_stream(ids, steps=6, b=6, seed=3))
    want = _run(
        make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats),
        stream,
    )
    moved = 5.0 * feats[:, ::-1] - 2.0
    est = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=moved)
    for x, y in zip(_run(est, stream), want, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    perm = np.random.default_rng(0).permutation(6)
    est = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
    got = _run(est, [([i[j] for j in perm], r[perm]) for i, r in stream])
    for x, y in zip(got, want, strict=True):
        np.testing.assert_allclose(x, y[perm], rtol=1e-9, atol=1e-12)


def test_state_resumes_exactly_and_streams_do_not_mix(cache):
    ids, ref, feats = cache
    stream = list(_stream(ids, steps=6, b=5, seed=7))
    est = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
    _run(est, stream[:3])
    saved = est.state_dict()
    assert {"coef", "fit_curvature", "losses"} <= set(saved)
    first = _run(est, stream[3:])
    fresh = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
    fresh.load_state_dict(saved)
    for x, y in zip(first, _run(fresh, stream[3:]), strict=True):
        np.testing.assert_array_equal(x, y)
    streams = [list(_stream(ids, steps=4, b=4, seed=20 + k)) for k in range(3)]
    many = make_step_estimator(
        "basis_context", prompt_ids=ids, ref_rewards=ref, features=feats, lead=(3,)
    )
    alone = [
        make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats)
        for _ in range(3)
    ]
    for t in range(4):
        cols = np.stack([many.columns(streams[k][t][0]) for k in range(3)])
        rewards = np.stack([streams[k][t][1] for k in range(3)])[..., None]
        got = np.asarray(many.step_columns(cols, rewards).baselines)
        for k in range(3):
            np.testing.assert_allclose(
                got[k], alone[k](streams[k][t][0], rewards[k]).baselines, rtol=1e-12, atol=1e-14
            )


def test_refusals(cache):
    ids, ref, feats = cache
    with pytest.raises(InputError, match="features must be"):
        make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref, features=feats[:3])
    with pytest.raises(InputError, match="finite"):
        make_step_estimator(
            "basis_context", prompt_ids=ids, ref_rewards=ref, features=np.full((P, 2), np.nan)
        )
    with pytest.raises(InputError, match=r"basis_context\.ridge"):
        ContextOptions(ridge=0.0)
    with pytest.raises(InputError, match=r"basis_context\.fit_memory"):
        ContextOptions(fit_memory=1.5)
    with pytest.raises(InputError, match=r"basis_context\.gammas"):
        ContextOptions(gammas=(0.0,))


def test_text_features_are_stable_hashed_ngrams():
    x = text_features(["What is 4 * 5?", "What is 4 * 5?", "what IS 4 * 5 ?"], dim=16)
    assert x.shape == (3, 16)
    np.testing.assert_array_equal(x[0], x[1])  # deterministic across calls (and processes)
    np.testing.assert_array_equal(x[0], x[2])  # case and spacing do not matter
    assert not np.array_equal(x[0], text_features(["What is 4 + 5?"], dim=16)[0])
    with pytest.raises(InputError, match="dim"):
        text_features(["a"], dim=0)


def test_plain_features_of_arithmetic_and_math():
    prompts = pl.DataFrame(
        {
            "prompt_id": ["a", "b", "c"],
            "problem": ["What is 7 - 9?", "What is 8 * 9?", "Solve x^2 = -4 over the reals."],
            "answer": ["-2", "72", "no solution"],
            "level": [1, 2, 5],
            "subject": ["Algebra", "Algebra", "Geometry"],
        }
    )
    x, names = plain_features(prompts)
    row = dict(zip(names, x.T, strict=True))
    np.testing.assert_array_equal(row["answer_negative"], [1, 0, 0])
    np.testing.assert_array_equal(row["answer_digits"], [1, 2, 0])
    np.testing.assert_array_equal(row["op-"], [1, 0, 0])
    np.testing.assert_array_equal(row["op*"], [0, 1, 0])
    np.testing.assert_array_equal(row["level"], [1, 2, 5])
    np.testing.assert_array_equal(row["subject=Geometry"], [0, 0, 1])


def test_prompt_features_read_the_stored_column_in_prompt_order():
    prompts = pl.DataFrame(
        {
            "prompt_id": ["a", "b"],
            "problem": ["x", "y"],
            "answer": ["1", "2"],
            "features": [[1.0, 2.0], [3.0, 4.0]],
        }
    )
    np.testing.assert_array_equal(prompt_features(prompts, ["b", "a"]), [[3, 4], [1, 2]])
    assert prompt_features(prompts, ["a"], "text").shape == (1, 32)
    assert prompt_features(prompts, ["a"], "none") is None
    assert prompt_features(None, ["a"]) is None
    with pytest.raises(
        InputError,
        match=r"2 of the 3 prompts \(e.g. 'zz'\) are not in the prompts table.*--features none",
    ):
        prompt_features(prompts, ["a", "zz", "yy"])
    with pytest.raises(InputError, match="unknown prompt feature kind"):
        prompt_features(prompts, ["a"], "hidden")
    bad = prompts.with_columns(pl.Series("features", [[1.0], [1.0, 2.0]]))
    with pytest.raises(InputError, match="one length"):
        stored_features(bad)


def test_training_and_plugins_take_it(cache, tmp_path):
    """The training loop's estimator (state through a weights-only torch checkpoint) and the
    verl/TRL adapter run basis_context like basis_memory (no features: the lag alone)."""
    torch = pytest.importorskip("torch")
    from basis_bench.integrations.keys import one_rollout_step
    from basis_bench.train import make_config, make_estimator
    from basis_bench.train.checkpoint import estimator_state, load_estimator_state

    ids, ref, _ = cache
    est = make_estimator(make_config({}, ["estimator=basis_context"]), ids, ref)
    for batch_ids, rewards in _stream(ids, steps=3, b=5):
        est(batch_ids, rewards[:, None])
    torch.save(estimator_state(est), tmp_path / "s.pt")
    again = make_estimator(make_config({}, ["estimator=basis_context"]), ids, ref)
    load_estimator_state(again, torch.load(tmp_path / "s.pt", weights_only=True))
    batch_ids, rewards = next(_stream(ids, steps=1, b=5, seed=9))
    np.testing.assert_array_equal(
        est(batch_ids, rewards[:, None]).baselines, again(batch_ids, rewards[:, None]).baselines
    )
    step = make_step_estimator("basis_context", prompt_ids=ids, ref_rewards=ref)
    out = one_rollout_step(step, ids[:6], np.array([1.0, 0, 1, 0, 1, 0]))
    assert out.baselines.shape == (6,) and np.all((out.baselines > 0) & (out.baselines < 1))


def test_replay_hands_the_prompts_features_to_it():
    """Trajectory replay on the shipped data: the prompts table's features reach the
    estimator (kind none runs the lag alone, which differs), never a 0/1 baseline."""
    from basis_bench.evaluation.dataset import open_dataset
    from basis_bench.evaluation.replay_plan import ReplayPlan
    from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
    from basis_bench.rollouts.store import load_prompts

    ds = open_dataset()
    rows = {}
    for kind in ("auto", "none"):
        plan = ReplayPlan(repeats=4, features=kind)
        s = EpochSchedule(batch_size=16, epochs_per_checkpoint=2)
        table, _ = replay_trajectory(
            ds.rewards, ds.reference, ds.checkpoints[:2], ["basis_context"], plan, s,
            prompts=load_prompts(ds.root),
        )  # fmt: skip
        rows[kind] = table.filter(pl.col("scope") == "epoch")
    assert rows["auto"]["extreme_rate"].max() == 0
    assert not rows["auto"]["mse"].equals(rows["none"]["mse"])


def test_evaluate_takes_the_feature_kind(tmp_path, monkeypatch, capsys):
    """``evaluate --features``: the kind reaches the trajectory replay and run.json; the
    default data's stored hidden states give other numbers than none."""
    mse = {}
    for kind in ("none", "stored"):
        out = tmp_path / kind
        run = run_main(
            monkeypatch, capsys, "evaluate", "--estimators", "basis_context", "--batch-size", "16",
            "--repeats", "2", "--no-estimates", "--features", kind, "--out", str(out),
        )  # fmt: skip
        assert run.code == 0, run.message
        assert json.loads((out / "run.json").read_text())["trajectory"]["features"] == kind
        mse[kind] = pl.read_csv(out / "trajectory.csv")["mse"].to_list()
    assert mse["none"] != mse["stored"]


def test_wide_features_are_reduced_to_principal_components():
    """A hidden state (d > WIDE) enters as its leading principal components, each of
    variance 1; narrower features (plain, text) are only standardised."""
    from basis_bench.estimators.context import COMPONENTS, WIDE

    rng = np.random.default_rng(1)
    wide = rng.normal(size=(150, 200)) @ rng.normal(size=(200, 200))
    x = standardised(wide, 150)
    assert x.shape == (150, 1 + COMPONENTS)
    assert standardised(wide, 150, components=8).shape == (150, 9)
    np.testing.assert_allclose(x[:, 1:].std(axis=0), 1.0)
    np.testing.assert_allclose(x[:, 1:].mean(axis=0), 0.0, atol=1e-12)
    narrow = standardised(wide[:, :WIDE], 150)
    np.testing.assert_allclose(
        narrow[:, 1:], (wide[:, :WIDE] - wide[:, :WIDE].mean(0)) / wide[:, :WIDE].std(0)
    )


def test_a_features_column_survives_prompts_parquet(tmp_path):
    """prompts.parquet keeps a list column through the store's writer and reader (the import
    path's), and ``auto`` then takes it over the plain features."""
    from basis_bench.rollouts.store import load_prompts, write_parquet_atomic

    prompts = pl.DataFrame(
        {
            "prompt_id": ["a", "b", "c"],
            "problem": ["What is 1 + 2?", "What is 3 - 5?", "What is 2 * 2?"],
            "answer": ["3", "-2", "4"],
            "features": [[0.5, 1.0, -1.0], [0.25, 0.0, 2.0], [1.0, 1.0, 1.0]],
        }
    )
    write_parquet_atomic(prompts, tmp_path / "prompts.parquet")
    back = load_prompts(tmp_path)
    assert back is not None
    np.testing.assert_array_equal(
        prompt_features(back, ["c", "a"]), [[1.0, 1.0, 1.0], [0.5, 1.0, -1.0]]
    )
    assert prompt_features(back, ["a"], "plain").shape[1] == 6  # negative, digits, 4 operators

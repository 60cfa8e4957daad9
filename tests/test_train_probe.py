"""The value probe's arithmetic without a model: its corrected squared error is unbiased for
(b - v)^2 (exactly, by enumerating every outcome, and by Monte Carlo), the estimator it
probes keeps its state, and its settings are checked in one line."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from basis_bench.errors import InputError
from basis_bench.estimators import make_step_estimator
from basis_bench.train import make_config
from basis_bench.train.config import check_probe
from basis_bench.train.probe import probe_baselines, probe_rows, value_error


@pytest.mark.parametrize("m", [2, 3, 5])
@pytest.mark.parametrize("v", [0.1, 0.5, 0.83])
def test_corrected_error_is_exactly_unbiased_over_every_outcome(m, v):
    """E (b - ybar)^2 - s^2/M = (b - v)^2 over all 2^M outcomes of the M targets, each
    weighted by its Bernoulli(v) probability; the raw error is off by v (1 - v) / M."""
    b = np.array([[0.3, 0.9]])  # two baselines of one prompt (G' = 2)
    outcomes = np.array(list(itertools.product([0.0, 1.0], repeat=m)))
    weights = np.prod(np.where(outcomes == 1, v, 1 - v), axis=1)
    records = [value_error(b, row[None]) for row in outcomes]
    corrected = sum(w * r["probe_value_error"] for w, r in zip(weights, records, strict=True))
    raw = sum(w * r["probe_value_mse"] for w, r in zip(weights, records, strict=True))
    truth = float(((b - v) ** 2).mean())
    assert corrected == pytest.approx(truth, abs=1e-12)
    assert raw == pytest.approx(truth + v * (1 - v) / m, abs=1e-12)
    mean_value = sum(w * r["probe_value"] for w, r in zip(weights, records, strict=True))
    assert mean_value == pytest.approx(v, abs=1e-12)


def test_corrected_error_by_monte_carlo_on_bernoulli_values():
    """200,000 synthetic prompts, values v ~ U(0, 1), baselines b = v + noise independent of
    M = 4 Bernoulli(v) targets: the corrected error's mean is (b - v)^2's within 4 standard
    errors, and equals the 0/1 form (b - ybar)^2 - ybar (1 - ybar) / (M - 1); the raw error
    is biased up by mean v (1 - v) / M."""
    rng = np.random.default_rng(7)
    n, m = 200_000, 4
    v = rng.uniform(size=n)
    b = np.clip(v[:, None] + rng.normal(0, 0.2, size=(n, 3)), 0, 1)  # G' = 3 baselines each
    targets = (rng.uniform(size=(n, m)) < v[:, None]).astype(np.float64)
    record = value_error(b, targets)
    ybar = targets.mean(axis=1, keepdims=True)
    per_prompt = ((b - ybar) ** 2 - ybar * (1 - ybar) / (m - 1)).mean(axis=1)
    assert record["probe_value_error"] == pytest.approx(per_prompt.mean(), abs=1e-12)
    truth = ((b - v[:, None]) ** 2).mean()
    se = per_prompt.std() / np.sqrt(n)
    assert abs(record["probe_value_error"] - truth) < 4 * se
    bias = record["probe_value_mse"] - truth
    assert bias == pytest.approx((v * (1 - v)).mean() / m, abs=4 * se)
    assert bias > 20 * se, "the correction matters at this M"


@pytest.mark.parametrize("name", ["basis_memory", "basis_track"])
def test_probe_leaves_the_estimator_as_it_was_and_gives_each_batch_a_fresh_copy(name):
    """A stateful estimator after a few steps: the probe's baselines are those its next step
    would give each batch of B_p prompts (a fresh copy per batch, not one copy fed twice),
    and its state and its own next step are unchanged."""
    rng = np.random.default_rng(3)
    ids = [f"p{i}" for i in range(12)]
    est = make_step_estimator(
        name, {}, prompt_ids=ids, ref_rewards=rng.integers(0, 2, size=(12, 8)).astype(float)
    )
    for _ in range(3):
        batch = sorted(rng.choice(12, size=4, replace=False))
        est([ids[i] for i in batch], rng.integers(0, 2, size=(4, 1)).astype(float))
    before = est.state_dict()
    pristine = copy.deepcopy(est)
    probe_ids = [ids[i] for i in probe_rows(12, 6)]
    rewards = rng.integers(0, 2, size=(6, 1)).astype(float)

    baselines = probe_baselines(est, probe_ids, rewards, per_batch=4)

    assert baselines.shape == (6, 1)
    for part in (slice(0, 4), slice(4, 6)):
        alone = copy.deepcopy(pristine)(probe_ids[part], rewards[part]).baselines
        assert np.array_equal(baselines[part], np.asarray(alone).reshape(-1, 1))
    after = est.state_dict()
    assert est.carries_state and before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    step = ([ids[0], ids[5]], np.array([[1.0], [0.0]]))
    assert np.array_equal(est(*step).baselines, pristine(*step).baselines)


def test_probe_set_is_fixed_and_settings_are_checked_in_one_line():
    rows = probe_rows(100, 8)
    assert np.array_equal(rows, probe_rows(100, 8)) and len(set(rows.tolist())) == 8
    assert np.all((rows >= 0) & (rows < 100))
    check_probe(make_config({"probe_prompts": 500}), 8, 100)  # probe off: nothing to check
    with pytest.raises(InputError, match=r"leaves 1 Monte Carlo samples .* probe_samples >= 10"):
        check_probe(make_config({"probe_every": 10, "probe_samples": 9}), 8, 100)
    with pytest.raises(InputError, match="probe_prompts = 101 exceeds the 100 training"):
        check_probe(make_config({"probe_every": 10, "probe_prompts": 101}), 1, 100)
    with pytest.raises(ValueError, match="probe_samples"):
        make_config({"probe_samples": 2})

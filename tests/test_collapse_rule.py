"""The collapse rule (basis_bench/train/summary.py, issue 42): on simulated held-out
evaluations with binomial noise at the study's size (100 prompts, 13 evaluations), a stable
run is called collapsed at most 5% of the time, and a real fall of 0.2 is caught."""

from __future__ import annotations

import numpy as np
import pytest

from basis_bench.train.summary import ALPHA, collapsed, decline, heldout_size

HELDOUT, EVALUATIONS, RUNS = 100, 13, 4000  # the study's held-out size and evaluation count


def _rate(true_accuracy: np.ndarray, seed: int) -> float:
    """The share of RUNS simulated runs (evaluation t: Binomial(HELDOUT, true_accuracy[t]) /
    HELDOUT) that the rule calls collapsed."""
    rng = np.random.default_rng(seed)
    runs = rng.binomial(HELDOUT, true_accuracy, size=(RUNS, true_accuracy.size)) / HELDOUT
    return float(np.mean([collapsed(run) for run in runs]))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_a_stable_run_is_called_collapsed_at_most_5_percent_of_the_time(p):
    # measured (RUNS = 4000, seed 0): 0.0% at 0.1 and 0.9, 1.4% at 0.3 and 0.7, 2.8% at 0.5
    rate = _rate(np.full(EVALUATIONS, p), seed=0)
    assert rate <= ALPHA
    # the rule it replaced, peak - final >= 0.15, on the same noise: 8-14% at p = 0.3-0.7
    runs = np.random.default_rng(0).binomial(HELDOUT, p, size=(RUNS, EVALUATIONS)) / HELDOUT
    old = float(np.mean(runs.max(axis=1) - runs[:, -1] >= 0.15 - 1e-9))
    assert old > ALPHA if 0.3 <= p <= 0.7 else old <= ALPHA


@pytest.mark.parametrize("p", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("shape", ["step", "ramp"])
def test_a_fall_of_0_2_is_caught(p, shape):
    # step: p, then p - 0.2 at the last three evaluations; ramp: p to step 60, then down
    # evenly to p - 0.2 at step 120. Measured (seed 1): 99.98-100% and 99.4-99.95%.
    true = np.full(EVALUATIONS, p)
    if shape == "step":
        true[-3:] -= 0.2
    else:
        true[6:] -= 0.2 * np.arange(1, EVALUATIONS - 5) / (EVALUATIONS - 6)
    assert _rate(true, seed=1) >= 0.99


def test_the_levels_and_the_held_out_size_by_hand():
    # levels: a_0 = 0.41 and the windows (0.41, 0.16, 0.00), (0.16, 0.00, 0.14), (0.00,
    # 0.14, 0.15); the last three average 0.15: a collapse in the first ten steps is one below the start (BASIS
    # at lr 1e-4, seed 2), where no window stands above the last by 0.1
    run = [0.41, 0.16, 0.00, 0.14, 0.15, 0.16]
    assert decline(run) == pytest.approx(0.41 - 0.15)
    assert collapsed(run)  # 0.26 >= z_{1 - 0.05/4} * 0.5 * sqrt((1 + 1/3) / 100) = 0.129
    assert not collapsed([0.41, 0.30, 0.30, 0.30, 0.30])  # 0.11 below one evaluation: noise
    assert np.isnan(decline([0.5, 0.1, 0.1])) and not collapsed([0.5, 0.1, 0.1])
    assert heldout_size([0.41, 0.5, 0.07]) == 100 and heldout_size([0.5, 0.25]) == 4
    # at 200 prompts (0.495 = 99/200) the noise allows less, and the least fall called a collapse is 0.10
    assert collapsed([0.6] * 10 + [0.495] * 3) and not collapsed([0.6] * 10 + [0.505] * 3)

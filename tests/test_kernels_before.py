"""The faster basis_track kernel of issue 46 against the kernel as it stood before it
(tests/track_before.py: main at ab7caf4, verbatim), on random data: every baseline equal to
1e-9 relative. (basis_memory's and basis_context's compiled loops give numpy's numbers bit
for bit: tests/test_memory.py holds them to an exact reference.)

basis_track's posterior is a chaotic system in its far tails: a one-ulp change anywhere in
its arithmetic (the kernel before it against itself with one ulp of noise in its shift, say)
grows by about 1e7 over some 100 visits of a prompt. The new kernel's sums run in another
order (the blur's normaliser, the compiled loops' vectorised sums, the sigmoid as 1 / (1 +
e^-z)), so its baselines agree with the old ones to about 1e-13 over the few visits a prompt
gets in the trajectory replay (3 at the paper's shape) and these tests (about 10), not bit
for bit; the
state's far tails (cells of 1e-250 against 1e-9 after repeated surprising rewards) need not
agree at all, so the state is compared where it carries weight."""

from __future__ import annotations

import numpy as np
import pytest
import track_before

from basis_bench.estimators import make_step_estimator
from basis_bench.estimators.step import StepEstimator

RTOL = 1e-9


def _track_pair(p: int, streams: int | None, seed: int, options: dict | None = None):
    """basis_track now and before, over ``streams`` parallel streams (None: no lead axis)."""
    lead = () if streams is None else (streams,)
    rng = np.random.default_rng(seed)
    ref = (rng.random((p, 32)) < rng.uniform(0.0, 1.0, (p, 1))).astype(float)
    ids = [f"q{i}" for i in range(p)]
    new = make_step_estimator("basis_track", options, prompt_ids=ids, ref_rewards=ref, lead=lead)
    kernel = track_before.TrackKernel(new.estimator, new.options, None, ref, new.reward_range)
    old = StepEstimator(new.estimator, new.options, kernel, None, new.reward_range, lead)
    return new, old, rng


@pytest.mark.parametrize(
    ("options", "seed"),
    [(None, 0), ({"pooling": 0.3, "memory": 0.8}, 1)],
    ids=["default", "by-bin"],
)
def test_track_equals_the_kernel_before(options, seed):
    """Random prompts (reference rates anywhere in [0, 1]), 3 streams, 40 steps of 8 of 30
    prompts (about 10 visits a prompt): 0/1 rewards, fractional ones, a prompt twice in a
    batch; every baseline to 1e-9 relative, the state's levels and evidence to 1e-6."""
    p, streams, b = 30, 3, 8
    new, old, rng = _track_pair(p, streams, seed, options)
    value = rng.uniform(0.0, 1.0, p)
    worst = 0.0
    for t in range(40):
        cols = np.argsort(rng.random((streams, p)), axis=1)[:, :b]
        if t % 7 == 3:
            cols[:, 1] = cols[:, 0]  # a training batch across two epochs
        r = (rng.random((streams, b)) < value[cols]).astype(float)
        if t % 5 == 4:
            r = rng.random((streams, b))  # fractional rewards in [0, 1]
        got = np.asarray(new.step_columns(cols, r[..., None]).baselines)
        want = np.asarray(old.step_columns(cols, r[..., None]).baselines)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=0, err_msg=f"step {t}")
        worst = max(worst, float(np.max(np.abs(got - want) / np.abs(want))))
    for key in ("step", "last_visit"):
        np.testing.assert_array_equal(new.state[key], old.state[key])
    for key in ("level", "level_var", "jumps", "jump_clock", "last_level", "evidence"):
        np.testing.assert_allclose(new.state[key], old.state[key], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(new.state["weights"], old.state["weights"], rtol=0, atol=1e-6)
    assert worst < 1e-11, worst  # in practice about 1e-13: rounding, not a different sum


def test_track_one_stream_without_a_lead_axis():
    """The training loop's shape: one stream, no lead axis, batches of 4 of 12 prompts."""
    new, old, rng = _track_pair(12, None, 2)
    for _ in range(25):
        cols = rng.choice(12, 4, replace=False)
        r = (rng.random(4) < 0.5).astype(float)[:, None]
        np.testing.assert_allclose(
            np.asarray(new.step_columns(cols, r).baselines),
            np.asarray(old.step_columns(cols, r).baselines),
            rtol=RTOL,
            atol=0,
        )

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

import itertools

import numpy as np
import pytest
import track_before
import track_numpy_before
from numba import njit

from basis_bench.estimators import make_step_estimator
from basis_bench.estimators.step import StepEstimator
from basis_bench.estimators.track import JUMP_VAR, logit_grid

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
    mine = _old_layout(new.state)
    for key in ("level", "level_var", "jumps", "jump_clock", "last_level", "evidence"):
        np.testing.assert_allclose(mine[key], old.state[key], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(mine["weights"], old.state["weights"], rtol=0, atol=1e-6)
    assert worst < 1e-11, worst  # in practice about 1e-13: rounding, not a different sum


def _old_layout(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """basis_track's state as the kernels before had it: each prompt's filters apart,
    weights (.., C, P, G), last_level and last_jump_clock (.., C, P)."""
    renamed = {
        "posteriors": "weights", "visit_level": "last_level", "visit_jump_clock": "last_jump_clock"
    }  # fmt: skip
    axis = {"posteriors": -3, "visit_level": -2, "visit_jump_clock": -2}
    return {
        renamed.get(k, k): np.swapaxes(v, axis[k], axis[k] + 1) if k in axis else v
        for k, v in state.items()
    }


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


@pytest.mark.parametrize("shift", [0.0, 0.37, -3.2, 750.0, -800.0])
def test_the_sigmoids_running_product_equals_the_exponentials(shift):
    """The predictive's sigmoids 1 / (1 + e^-z_g), e^-z_g a running product along the grid
    from its ends' exponentials (each cell's own exponential where an end passes e^+-700),
    the reciprocal on vectors, against numpy's: to 1e-13 relative, and where |z| is large
    to the rounding that z itself carries (eps |z|); on grids of 64 cells (vectors of 8),
    40 and 8 (each cell from the one 8 before) and 7 (each cell's own exponential)."""
    from basis_bench.estimators import predict_loops

    for theta, var in itertools.product(
        (logit_grid(), logit_grid(40), logit_grid(8), logit_grid(7)), (0.0, 0.02, 1.7, 40.0)
    ):
        scale, ends = np.empty((2, 1)), np.empty((4, 1))
        predict_loops._exp_arguments(np.array([shift]), np.array([var]), theta, 1.0, scale, ends)
        with np.errstate(over="ignore"):  # the ends past e^700: cell by cell
            ends, got = np.exp(ends), np.empty(len(theta))
        finite = predict_loops._exps(theta, shift, scale[0, 0], ends[0, 0], ends[2, 0], got)
        predict_loops._sigmoids(got, finite)  # as the predictive takes them
        z = (-theta - shift) * (1.0 / np.sqrt(1.0 + np.pi * var / 8.0))  # as the kernel before
        with np.errstate(over="ignore"):
            want = 1.0 / (1.0 + np.exp(z))
        bound = want * (1e-13 + 4.0 * np.finfo(float).eps * np.abs(z))
        assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)


_RECIPROCALS = """
import sys
import numpy as np
from numba import njit
from basis_bench.estimators.lanes import LANES, _load, _reciprocal, _store

@njit
def reciprocals(x, out):
    for g in range(0, x.size, LANES):
        _store(out, g, _reciprocal(_load(x, g)))

x = np.load(sys.argv[1])
out = np.empty_like(x)
reciprocals(x, out)
np.save(sys.argv[1], out)
"""


@pytest.mark.parametrize("cpu", ["host", "generic"])
def test_the_vector_reciprocal_is_within_an_ulp_of_the_division(cpu, tmp_path):
    """_reciprocal on 1 to 1e300 and the sigmoids' 1 + e^-z (1 to e^700): within an ulp of
    1 / x on this CPU (with AVX-512 an estimate and two Newton steps), and the division
    itself bit for bit where numba compiles for a generic CPU (no AVX-512), in a child
    process (numba's target is set when it is imported)."""
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(7)
    x = np.concatenate([10 ** rng.uniform(0, 300, 4000), 1 + np.exp(rng.uniform(-40, 700, 4000))])
    path = tmp_path / "x.npy"
    np.save(path, x)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    if cpu == "generic":
        env["NUMBA_CPU_NAME"] = "generic"
    script = tmp_path / "reciprocals.py"
    script.write_text(_RECIPROCALS)
    subprocess.run([sys.executable, str(script), str(path)], env=env, check=True, timeout=300)
    got = np.load(path)
    if cpu == "generic":
        np.testing.assert_array_equal(got, 1.0 / x)
    else:
        np.testing.assert_array_max_ulp(got, 1.0 / x, maxulp=1)


def _densities(var: float, g: int):
    """loops._densities for a blur N(0, var) on a grid of g cells of 16 / (g - 1): the
    densities (2 g - 1,), 1 / norm (g,) and q, as the drift calls it."""
    from basis_bench.estimators import loops

    h = 16.0 / (g - 1)
    log_q = -h * h / (2.0 * var)
    reach = int(min(np.sqrt(loops.LOG_TINY / log_q), g - 1.0))
    dens, inv, scratch = np.full(2 * g - 1, np.nan), np.full(g, np.nan), np.empty(g)
    loops._densities(np.exp(log_q), reach, dens, 0, inv, 0, scratch)
    return dens, inv


@pytest.mark.parametrize("g", [64, 13])
@pytest.mark.parametrize("var", [1e-3, 0.02, 0.6, 5.0, 300.0])
def test_the_gaussians_running_products_equal_the_exponentials(var, g):
    """The blur's densities q^(k^2) and the redrawn posterior's cells, running products,
    against numpy's exponentials: to 1e-12 relative wherever a cell is at least TINY, and
    0 (not a subnormal number, which would cost the CPU a hundred cycles a product) where
    it is below; the normalisers 1 / norm_g against numpy's sums of the densities. On 64
    cells (the densities on vectors from 8 cells' reach on) and 13 (one by one)."""
    from basis_bench.estimators import loops

    theta = logit_grid(g)
    h = theta[1] - theta[0]
    dens, inv = _densities(var, g)
    d = dens[g - 1 :]
    np.testing.assert_array_equal(dens[: g - 1], d[:0:-1])
    want = np.exp(-((np.arange(g) * h) ** 2) / (2.0 * var))
    big = want >= loops.TINY * (1 + 1e-12)
    np.testing.assert_allclose(d[big], want[big], rtol=1e-12)
    assert np.all((d[~big] == 0.0) | (d[~big] >= loops.TINY * (1 - 1e-12)))
    offsets = np.abs(np.arange(g)[:, None] - np.arange(g)[None, :])
    np.testing.assert_allclose(1.0 / inv, d[offsets].sum(axis=0), rtol=1e-14)
    for mean, shift in ((0.3, 0.0), (-7.9, 0.5), (9.5, 1.0), (-20.0, -3.0)):
        out = np.full(2 * g, np.nan)
        loops._redrawn(mean, mean * mean + 0.4, shift, var + JUMP_VAR, theta, out, g)
        logd = -((theta - mean - shift) ** 2) / (2.0 * (0.4 + var + JUMP_VAR))
        want = np.exp(logd - logd.max())
        got = out[g:]
        big = want >= loops.TINY * (1 + 1e-12)
        np.testing.assert_allclose(got[big], want[big], rtol=1e-12)
        assert np.all((got[~big] == 0.0) | (got[~big] >= loops.TINY * (1 - 1e-12)))
        assert np.isnan(out[:g]).all()  # nothing written outside its slot


@njit(fastmath={"reassoc"}, error_model="numpy")
def _dot_before(x, y):
    acc = 0.0
    for g in range(x.size):
        acc += x[g] * y[g]
    return acc


@njit(fastmath={"reassoc"}, error_model="numpy")
def _toeplitz_before(dens, x, out):
    """The blur's Toeplitz product as main f123b52 computed it (loops._toeplitz, verbatim)."""
    g_n = x.size
    top = g_n - g_n % 4
    for h in range(0, top, 4):
        a0 = a1 = a2 = a3 = 0.0
        d = dens[g_n - 4 - h :]
        for g in range(g_n):
            xg = x[g]
            a0 += xg * d[g + 3]
            a1 += xg * d[g + 2]
            a2 += xg * d[g + 1]
            a3 += xg * d[g]
        out[h], out[h + 1], out[h + 2], out[h + 3] = a0, a1, a2, a3
    for h in range(top, g_n):
        out[h] = _dot_before(x, dens[g_n - 1 - h : 2 * g_n - 1 - h])


@pytest.mark.parametrize("g", [64, 96, 40, 7])
def test_the_blur_equals_the_kernel_before(g):
    """The blur on vectors of loops.LANES doubles with fused multiply-adds (G a multiple of
    4 LANES: 64, 96) or as sums (40, 7) against the kernel of main f123b52, on random
    posteriors whose cells span 1e-250 (the state's floor) to 1 and blurs from none to wider
    than the grid, in either slot of the buffers: every cell to 1e-12 relative. A sum of
    terms >= 0 in any order is within G u (7.1e-15 at G = 64) of the exact sum: the two
    orders agree to twice that."""
    from basis_bench.estimators import loops

    rng = np.random.default_rng(g)
    worst = 0.0
    for var in (1e-3, 0.02, 0.3, 0.6, 2.0, 5.0, 40.0, 300.0):
        dens, inv = _densities(var, g)
        for k in range(20):
            w = rng.dirichlet(np.full(g, 0.3)) * 10.0 ** rng.uniform(-250.0, 0.0, g)
            x = np.maximum(w / w.sum(), 1e-250) * inv
            slot = k % 2
            got, want = np.full(2 * g, np.nan), np.empty(g)
            loops._toeplitz(np.concatenate([dens] * 2), slot * (2 * g - 1), x, got, slot * g)
            _toeplitz_before(dens, x, want)
            got = got[slot * g : slot * g + g]
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"var {var}")
            worst = max(worst, float(np.max(np.abs(got - want) / want)))
    u = np.finfo(float).eps / 2
    assert worst < 2 * g * u, worst  # the bound; in practice some 1e-15


def _moved_before(w: np.ndarray, move: float) -> np.ndarray:
    """The move as the kernel before made it: the cumulative mass (0 below the grid, the
    total above) read at every cell edge moved back, interpolated, and differenced."""
    g = w.size
    edges = np.arange(g + 1) - move
    cum = np.concatenate([[0.0], np.cumsum(w)])
    out = np.diff(np.interp(edges, np.arange(g + 1), cum))
    out[0], out[-1] = (
        np.interp(edges[1], np.arange(g + 1), cum),
        cum[-1] - np.interp(edges[-2], np.arange(g + 1), cum),
    )
    return out


@pytest.mark.parametrize("move", [0.0, 0.37, -0.37, 1.0, -2.5, 5.75, -40.2, 63.5, 70.0, -90.0])
def test_the_move_spreads_each_cells_mass_over_its_moved_cell(move):
    """loops._moved against the cumulative-mass interpolation of the kernel before: equal
    to a few roundings of the total mass (4e-15) in every cell, the total kept (mass moved off the grid piles
    into the end cells); and, each cell a sum of terms >= 0, within a few roundings of its
    exact value however small, where a difference of cumulative masses carries the total's
    rounding: a posterior at its floor of 1e-250 moves to cells of 1e-250, not of 1e-17."""
    from basis_bench.estimators import loops

    g = 64
    rng = np.random.default_rng(7)
    w = rng.dirichlet(np.full(g, 0.3)) * 10.0 ** rng.uniform(-250.0, 0.0, g)
    w = np.maximum(w / w.sum(), 1e-250)
    got = np.full(2 * g, np.nan)
    loops._moved(w[None, :], 0, move, np.ones(g), 0, got, g)
    assert np.isnan(got[:g]).all()
    got = got[g:]
    np.testing.assert_allclose(got, _moved_before(w, move), rtol=0, atol=4e-15)
    assert abs(got.sum() - w.sum()) < 1e-15
    floor = np.full(g, 1e-250)
    loops._moved(floor[None, :], 0, move, np.ones(g), 0, got, 0)
    k = int(np.floor(-move))
    inside = np.arange(g)
    inside = inside[(inside + k >= 0) & (inside + k + 1 <= g - 1)]
    inside = inside[(inside > 0) & (inside < g - 1)]
    np.testing.assert_allclose(got[inside], 1e-250, rtol=1e-15)


def test_the_drift_updated_in_place_equals_the_drift_then_the_update():
    """The drift that writes each posterior's Bayes update straight into the state (the
    replay's batches: every prompt once) gives the same values and state, bit for bit, as
    the drift followed by the separate update (the path a prompt twice in a batch takes)."""
    from basis_bench.estimators import loops
    from basis_bench.estimators.track import _FLOOR

    theta = logit_grid()
    sig = 1.0 / (1.0 + np.exp(-theta))
    rng = np.random.default_rng(5)
    weights, n = rng.dirichlet(np.full(64, 0.3), 50), 30
    rows = rng.permutation(50)[:n]
    shift, var = rng.normal(0.0, 0.4, n), rng.uniform(0.0, 3.0, n) * (rng.random(n) < 0.8)
    jump = np.where(rng.random(n) < 0.5, rng.random(n), 0.0)
    moments = np.stack([weights[rows] @ theta, weights[rows] @ theta**2], axis=1)
    table = np.stack([1.0 - sig, sig, sig**0.3 * (1.0 - sig) ** 0.7])
    which = rng.integers(0, 3, n)
    separate, fused = weights.copy(), weights.copy()
    post, v_sep, v_fused = np.empty((n, 64)), np.empty(n), np.empty(n)
    none, lines = np.empty((0, 64)), np.empty(0, np.intp)
    args = (shift, var, jump, moments, theta, sig, JUMP_VAR)
    loops.track_drift(separate, rows, *args, post, v_sep, none, lines, _FLOOR)
    loops.track_update(post, table, which, separate, rows, _FLOOR)
    loops.track_drift(fused, rows, *args, np.empty((1, 64)), v_fused, table, which, _FLOOR)
    np.testing.assert_array_equal(v_fused, v_sep)
    np.testing.assert_array_equal(fused, separate)
    assert not np.array_equal(fused[rows], weights[rows])  # the rows were updated


def _sum_without_before(x):
    """The leave-one-out sum as numpy computed it before (main at 4241357)."""
    zero = np.zeros((*x.shape[:-1], 1))
    before = np.concatenate([zero, np.cumsum(x, axis=-1)[..., :-1]], axis=-1)
    after = np.concatenate([np.cumsum(x[..., ::-1], axis=-1)[..., -2::-1], zero], axis=-1)
    return before + after


@pytest.mark.parametrize("shape", [(4, 16, 64), (3, 1), (2, 5, 2), (6, 64, 5)])
def test_the_leave_one_out_sum_is_numpys_bit_for_bit(shape):
    """The compiled sum without each term (along the last axis, or the one before it as the
    filters' mixing sums its bins) against numpy's cumulative sums: the same bits, signed
    zeros included (most of the mixing's terms are zeros)."""
    from basis_bench.estimators.track_loops import sum_without

    def _sum_without(x, axis=-1):
        flat = x.reshape(-1, x.shape[axis], 1 if axis == -1 else x.shape[-1])
        out = np.empty_like(flat)
        sum_without(np.ascontiguousarray(flat), out)
        return out.reshape(x.shape)

    rng = np.random.default_rng(len(shape))
    x = rng.normal(size=shape) * (rng.random(shape) < 0.6)
    x[x == 0] *= np.sign(rng.normal(size=int((x == 0).sum())))  # -0.0 and 0.0
    for got, want in (
        (_sum_without(x), _sum_without_before(x)),
        (_sum_without(x, axis=-2), _sum_without_before(x.swapaxes(-1, -2)).swapaxes(-1, -2)),
    ):
        np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def _mixing_before(evidence, where, ll, pool):
    """The filters' scores before their softmax and the bins' log-likelihoods, as numpy
    computed them before (main at 4241357)."""
    onehot = (where[..., None] == np.arange(evidence.shape[-1])).astype(float)
    by_bin = ll[..., None] * onehot[:, None]
    others = _sum_without_before(by_bin.swapaxes(-1, -2)).swapaxes(-1, -2)
    score = evidence[:, :, None, :] + others
    own = np.take_along_axis(score, where[:, None, :, None], -1)[..., 0]
    return (1.0 - pool) * own + pool * score.sum(-1), by_bin.sum(2)


@pytest.mark.parametrize("pool", [1.0, 0.3, 0.0])
@pytest.mark.parametrize("batch", [1, 2, 8, 64])
def test_the_filters_mixing_is_numpys_bit_for_bit(pool, batch):
    """The compiled mixing of the filters by the evidence of each prompt's difficulty bin
    (a bin's own evidence plus the batch's other prompts in it, pooled with the other bins')
    against numpy's: the same bits, signed zeros included, on random evidence and
    log-likelihoods of magnitudes 1e-3 to 1e3."""
    from basis_bench.estimators import track_loops

    rng = np.random.default_rng(batch)
    for _ in range(20):
        s, c, k = int(rng.integers(1, 5)), 16, 5
        evidence = rng.normal(size=(s, c, k)) * 10 ** rng.uniform(-3, 3)
        where = rng.integers(0, k, (s, batch))
        ll = -rng.exponential(size=(s, c, batch)) * 10 ** rng.uniform(-3, 3, (s, c, batch))
        mixed, counts = np.empty(ll.shape), np.empty(evidence.shape)
        track_loops.track_mixing(evidence, where, ll, pool, mixed, counts)
        want_mixed, want_counts = _mixing_before(evidence, where, ll, pool)
        np.testing.assert_array_equal(mixed.view(np.int64), want_mixed.view(np.int64))
        np.testing.assert_array_equal(counts.view(np.int64), want_counts.view(np.int64))


def _numpy_pair(p: int, streams: int | None, seed: int, options: dict | None = None):
    """basis_track now and with its per-step numpy code of main eee2e6e
    (tests/track_numpy_before.py), over ``streams`` parallel streams (None: no lead axis)."""
    lead = () if streams is None else (streams,)
    rng = np.random.default_rng(seed)
    ref = (rng.random((p, 32)) < rng.uniform(0.0, 1.0, (p, 1))).astype(float)
    ids = [f"q{i}" for i in range(p)]
    new = make_step_estimator("basis_track", options, prompt_ids=ids, ref_rewards=ref, lead=lead)
    kernel = track_numpy_before.TrackKernel(new.estimator, new.options, None, ref, new.reward_range)
    old = StepEstimator(new.estimator, new.options, kernel, None, new.reward_range, lead)
    return new, old, rng


@pytest.mark.parametrize(
    ("streams", "batch", "options", "seed"),
    [
        (3, 8, None, 0),
        (2, 1, None, 1),
        (1, 2, {"pooling": 0.3, "memory": 0.8}, 2),
        (4, 7, {"pooling": 0.0}, 3),
        (None, 5, None, 4),
    ],
    ids=["default", "batch-of-one", "by-bin", "unpooled", "no-lead-axis"],
)
def test_the_compiled_step_is_the_numpy_step_bit_for_bit(streams, batch, options, seed):
    """The step's arithmetic compiled (track_loops) against the numpy code it replaced, on
    random data over 60 steps of ``batch`` of 20 prompts (some 20 visits a prompt): 0/1
    rewards, fractional ones, a prompt twice in a batch (twice in a row too), a level that
    has jumped (the filters with eta J > 0 then mix in the redrawn posterior; eta = 0 and
    the first visits have eta J = 0). The whole state the same bits; every baseline within
    4 units in the last place (its filters' softmax adds the filters in order, as numpy's
    einsum does with a batch axis inside, not with B = 1: nothing the state carries)."""
    p = 20
    new, old, rng = _numpy_pair(p, streams, seed, options)
    shape = (1 if streams is None else streams, batch)
    value = rng.uniform(0.0, 1.0, p)
    for t in range(60):
        if t == 30:
            value = 1.0 - value  # the policy jumps: the levels move, J grows
        cols = np.argsort(rng.random((shape[0], p)), axis=1)[:, :batch]
        if t % 7 == 3 and batch > 1:
            cols[:, 1] = cols[:, 0]  # a training batch across two epochs
        if t % 11 == 5 and batch > 2:
            cols[:, 2] = cols[:, 1] = cols[:, 0]
        r = (rng.random(shape) < value[cols]).astype(float)
        if t % 5 == 4:
            r = rng.random(shape)  # fractional rewards in [0, 1]
        if streams is None:
            cols, r = cols[0], r[0]
        got = np.asarray(new.step_columns(cols, r[..., None]).baselines)
        want = np.asarray(old.step_columns(cols, r[..., None]).baselines)
        np.testing.assert_array_max_ulp(got, want, maxulp=4)
        if batch > 1:
            np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64), f"step {t}")
    mine = _old_layout(new.state)
    assert set(mine) == set(old.state)
    for key, state in old.state.items():
        np.testing.assert_array_equal(mine[key], state, err_msg=key)
    assert np.any(new.state["jump_clock"] > 1.5)  # the levels jumped: eta J > 0 was tried


@pytest.mark.parametrize("n", [1, 5, 8, 13, 64, 127, 128, 129, 300, 1000])
def test_the_batch_sum_is_numpys_pairwise_sum(n):
    """The compiled sum over a batch against numpy's reduction along a contiguous axis (its
    pairwise summation): the same bits, at each of its branches' lengths."""
    from basis_bench.estimators import track_loops

    rng = np.random.default_rng(n)
    for _ in range(20):
        x = rng.normal(size=n) * 10 ** rng.uniform(-8, 8, n)
        got = 0.0 + track_loops._pairwise_sum(x)
        assert np.float64(got).view(np.int64) == x.sum().view(np.int64)

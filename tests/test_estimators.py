"""The estimator core checked against mathematics: closed forms, slow references,
unbiasedness and variance by Monte Carlo, invariances, and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import import_extra
from hypothesis import given, settings
from hypothesis import strategies as st

from basis_bench import estimators as E
from basis_bench.errors import InputError


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def logit(p):
    return np.log(p) - np.log1p(-p)


# ---------------------------------------------------------------- step 1: the tilt


def test_beta_inf_gives_reference_mean_continuous_and_binary():
    rng = np.random.default_rng(0)
    cont = rng.normal(size=(5, 40))
    assert np.allclose(E.tilted_value(cont, np.inf), cont.mean(axis=1))
    binary = (rng.random((5, 40)) < 0.3).astype(float)
    assert np.allclose(E.tilted_value(binary, np.inf, prior=0.0), binary.mean(axis=1))
    k = binary.sum(axis=1)
    assert np.allclose(E.tilted_value(binary, np.inf, prior=0.5), (k + 0.5) / (40 + 1))


def test_beta_to_zero_gives_best_cached_reward():
    rng = np.random.default_rng(1)
    cont = rng.normal(size=(6, 30))
    assert np.allclose(E.tilted_value(cont, 1e-6), cont.max(axis=1))


def test_binary_tilt_is_a_logit_shift_of_one_over_beta():
    rng = np.random.default_rng(2)
    ref = (rng.random((50, 64)) < rng.random((50, 1))).astype(float)
    betas = np.array([0.05, 0.3, 1.0, 7.0, np.inf])
    v = E.tilted_value(ref, betas, prior=0.5)
    p = (ref.sum(axis=1) + 0.5) / 65
    assert np.allclose(logit(v) - logit(p)[None, :], 1 / betas[:, None], atol=1e-9)
    assert np.all((v > 0) & (v < 1)), "smoothing keeps every value off 0 and 1"


def test_binary_closed_form_with_no_prior_equals_the_plug_in():
    rng = np.random.default_rng(3)
    ref = (rng.random((20, 16)) < rng.random((20, 1))).astype(float)
    betas = np.array([0.2, 1.0, 5.0])
    closed, cvar = E.tilted_moments(ref, betas, prior=0.0, binary=True)
    plug, pvar = E.tilted_moments(ref, betas, binary=False)
    assert np.allclose(closed, plug) and np.allclose(cvar, pvar)


def test_continuous_plug_in_matches_direct_weights():
    rng = np.random.default_rng(4)
    ref = rng.random((7, 12))
    beta = 0.7
    w = np.exp(ref / beta)
    v = (w * ref).sum(1) / w.sum(1)
    var = (w * (ref - v[:, None]) ** 2).sum(1) / w.sum(1)
    got_v, got_var = E.tilted_moments(ref, beta)
    assert np.allclose(got_v, v) and np.allclose(got_var, var)


def test_large_rewards_do_not_overflow():
    ref = np.array([[1e3, 0.0, 5.0], [1e3, 1e3 - 1, -1e3]])
    v = E.tilted_value(ref, np.array([0.05, 1.0, np.inf]))
    assert np.all(np.isfinite(v))
    assert v[0, 0] == pytest.approx(1e3)
    assert v[1, 1] == pytest.approx((1e3 + (1e3 - 1) * math.exp(-1)) / (1 + math.exp(-1)))


def test_nan_marks_missing_samples():
    rng = np.random.default_rng(5)
    full = rng.random((1, 10))
    padded = np.concatenate([full, np.full((1, 5), np.nan)], axis=1)
    padded = padded[:, rng.permutation(15)]
    for beta in (0.1, 1.0, np.inf):
        assert np.allclose(E.tilted_value(padded, beta), E.tilted_value(full, beta))
    b_full = np.array([[1.0, 0, 0, 1, 1]])
    b_pad = np.array([[1.0, np.nan, 0, 0, np.nan, 1, 1]])
    assert np.allclose(E.tilted_value(b_pad, [0.5, np.inf]), E.tilted_value(b_full, [0.5, np.inf]))


def test_all_success_or_failure_without_prior_pins_the_value():
    ref = np.array([[1.0, 1, 1], [0.0, 0, 0]])
    v = E.tilted_value(ref, [0.1, np.inf], prior=0.0)
    assert np.array_equal(v, [[1.0, 0.0], [1.0, 0.0]])


def test_default_grid_is_log_spaced_with_infinity():
    betas = E.default_betas(32)
    assert betas.shape == (33,) and np.isinf(betas[-1])
    assert betas[0] == pytest.approx(50) and betas[-2] == pytest.approx(0.05)
    assert np.allclose(np.diff(np.log(betas[:-1])), np.log(0.05 / 50) / 31)


# ---------------------------------------------------------------- step 2: refinement


def slow_refine(v, r, variant, eps=1e-6, var=None):
    """Straight from the formulas, O(B^2) with Python loops."""
    var = v * (1 - v) if var is None else var
    B = len(v)
    out = np.empty(B)
    for i in range(B):
        others = [j for j in range(B) if j != i and var[j] > eps]
        if variant == "rvg":
            others = [j for j in others if v[j] != 0]
            out[i] = v[i] * np.mean([r[j] / v[j] for j in others]) if others else v[i]
            continue
        s2 = sum(v[k] ** 2 / var[k] for k in others)
        if not others or s2 <= 0:
            out[i] = v[i]
            continue
        denom = s2 if variant == "unb" else 1 + s2
        w = {j: v[i] * (v[j] / var[j]) / denom for j in others}
        out[i] = sum(w[j] * r[j] for j in others)
    return out


@pytest.mark.parametrize("variant", ["unb", "vop", "rvg"])
def test_refine_matches_slow_reference(variant):
    rng = np.random.default_rng(10)
    for B in (1, 2, 3, 17):
        for _ in range(5):
            v = rng.uniform(0.01, 0.99, B)
            r = (rng.random(B) < 0.5).astype(float)
            var = v * (1 - v)
            var[rng.random(B) < 0.3] = 1e-9  # inactive sources
            got = E.refine(v, r, variant=variant, reward_var=var)
            assert np.allclose(got, slow_refine(v, r, variant, var=var))


@pytest.mark.parametrize("variant", ["unb", "vop", "rvg"])
def test_refine_is_vectorised_over_leading_axes(variant):
    rng = np.random.default_rng(11)
    v = rng.uniform(0.05, 0.95, (4, 3, 9))
    r = (rng.random((4, 3, 9)) < v).astype(float)
    got = E.refine(v, r, variant=variant)
    for a in range(4):
        for b in range(3):
            assert np.allclose(got[a, b], slow_refine(v[a, b], r[a, b], variant))


def test_refine_falls_back_to_initial_estimate():
    v = np.array([0.3])
    assert np.array_equal(E.refine(v, np.array([1.0])), v)
    v = np.array([0.2, 0.7, 0.9])
    var = np.zeros(3)  # empty active set
    for variant in ("unb", "vop", "rvg"):
        assert np.array_equal(
            E.refine(v, np.array([1.0, 0, 1]), variant=variant, reward_var=var), v
        )


def test_refine_is_permutation_equivariant_and_clips_on_request():
    rng = np.random.default_rng(12)
    v = rng.uniform(0.05, 0.95, 20)
    r = (rng.random(20) < v).astype(float)
    perm = rng.permutation(20)
    assert np.allclose(E.refine(v, r)[perm], E.refine(v[perm], r[perm]))
    clipped = E.refine(v, np.ones(20), clip=(0.0, 1.0))
    assert clipped.max() <= 1.0 and E.refine(v, np.ones(20)).max() > 1.0


def _monte_carlo(values, draws, rng, variant, shrink=False):
    r = (rng.random((draws, len(values))) < values).astype(float)
    v = np.broadcast_to(values, r.shape)
    return E.refine(v, r, variant=variant, shrink=shrink)


def test_unb_and_rvg_unbiased_vop_biased_with_true_values():
    rng = np.random.default_rng(13)
    values = np.linspace(0.1, 0.9, 12)
    draws = 200_000
    for variant, unbiased in (("unb", True), ("rvg", True), ("vop", False)):
        est = _monte_carlo(values, draws, rng, variant)
        z = (est.mean(0) - values) / (est.std(0) / np.sqrt(draws))
        if unbiased:
            assert np.all(np.abs(z) < 4.5), (variant, z)
        else:
            assert np.any(np.abs(z) > 10), (variant, z)


def test_unb_has_the_smallest_variance_among_unbiased_weights():
    rng = np.random.default_rng(14)
    values = rng.uniform(0.1, 0.9, 10)
    sig2 = values * (1 - values)
    draws = 200_000
    unb = _monte_carlo(values, draws, rng, "unb")
    rvg = _monte_carlo(values, draws, rng, "rvg")
    assert np.all(unb.var(0) < rvg.var(0))
    # exact BLUE variance V_i^2 / S2_i, with S2_i = sum_{j != i} V_j^2 / sigma_j^2
    s2 = (values**2 / sig2).sum() - values**2 / sig2
    assert np.allclose(unb.var(0), values**2 / s2, rtol=0.03)
    # any other weights satisfying sum_j w_j V_j = V_i have larger exact variance
    for i in range(len(values)):
        others = np.arange(len(values)) != i
        vj, sj = values[others], sig2[others]
        blue = values[i] * (vj / sj) / (vj**2 / sj).sum()
        for _ in range(200):
            w = blue + rng.normal(scale=0.05, size=vj.size)
            w += (values[i] - w @ vj) * vj / (vj @ vj)  # project back onto the constraint
            assert w @ vj == pytest.approx(values[i])
            assert (w**2 * sj).sum() >= (blue**2 * sj).sum() - 1e-12


def test_vop_mse_is_below_unb():
    rng = np.random.default_rng(15)
    values = rng.uniform(0.1, 0.9, 8)
    unb = _monte_carlo(values, 100_000, rng, "unb")
    vop = _monte_carlo(values, 100_000, rng, "vop")
    assert ((vop - values) ** 2).mean() < ((unb - values) ** 2).mean()


def test_shrinking_the_ratio_helps_when_there_is_no_drift():
    rng = np.random.default_rng(16)
    values = rng.uniform(0.1, 0.9, (1, 16))
    unb = _monte_carlo(values[0], 50_000, rng, "unb")
    shrunk = _monte_carlo(values[0], 50_000, rng, "unb", shrink=True)
    assert ((shrunk - values) ** 2).mean() < ((unb - values) ** 2).mean()


# ---------------------------------------------------------------- step 3: calibration


def _tilt_world(rng, prompts, n, true_beta):
    p = rng.uniform(0.05, 0.95, prompts)
    ref = (rng.random((prompts, n)) < p[:, None]).astype(float)
    values = sigmoid(logit(p) + 1 / true_beta)
    return ref, values


@pytest.mark.parametrize("loss", ["squared", "log"])
def test_select_beta_recovers_the_tilt_with_large_batches(loss):
    rng = np.random.default_rng(20)
    betas = E.default_betas(32)
    true_index = 20
    ref, values = _tilt_world(rng, 8192, 512, betas[true_index])
    v_grid = E.tilted_value(ref, betas)
    rewards = (rng.random((4, 8192)) < values).astype(float)
    index, losses = E.select_beta(
        np.broadcast_to(v_grid[:, None], (33, 4, 8192)), rewards, loss=loss
    )
    assert losses.shape == (33, 4)
    assert np.all(np.abs(index - true_index) <= 1), index


def test_previous_calibration_applies_the_beta_of_the_previous_batch():
    rng = np.random.default_rng(21)
    betas = E.default_betas(16)
    ref, values = _tilt_world(rng, 300, 64, 0.5)
    v_table, var_table = E.tilted_moments(ref, betas)
    idx = np.stack([rng.choice(300, 32, replace=False) for _ in range(6)])
    rewards = (rng.random(idx.shape) < values[idx]).astype(float)
    vg, varg = v_table[:, idx], var_table[:, idx]
    _, current = E.basis_estimate(vg, varg, rewards, calibration="current")
    prev_values, previous = E.basis_estimate(vg, varg, rewards, calibration="previous")
    assert np.array_equal(previous, np.roll(current, 1))
    fixed = np.stack(
        [
            E.basis_estimate(
                vg[:, t], varg[:, t], rewards[t], calibration="fixed", fixed_index=int(previous[t])
            )[0]
            for t in range(6)
        ]
    )
    assert np.allclose(prev_values, fixed)

    basis = E.Basis([str(i) for i in range(300)], ref, betas=betas, calibration="previous")
    first = basis([str(i) for i in idx[0]], rewards[0])
    assert np.isinf(first.beta), "the first step uses the reference policy (beta = inf)"
    second = basis([str(i) for i in idx[1]], rewards[1])
    assert second.beta_index == current[0]


def test_basis_object_matches_the_array_functions():
    rng = np.random.default_rng(22)
    ref, values = _tilt_world(rng, 100, 64, 1.0)
    ids = [f"p{i}" for i in range(100)]
    basis = E.Basis(ids, ref)
    batch = rng.choice(100, 24, replace=False)
    rewards = (rng.random(24) < values[batch]).astype(float)
    out = basis([ids[i] for i in batch], rewards)
    v_table, var_table = E.tilted_moments(ref, E.default_betas())
    want, index = E.basis_estimate(v_table[:, batch], var_table[:, batch], rewards)
    assert np.allclose(out.baselines, want) and out.beta_index == int(index)
    with pytest.raises(InputError, match="not in the reference cache"):
        basis(["nope"] * 24, rewards)


def test_betas_that_empty_the_active_set_are_excluded():
    # candidate 0 is an extreme tilt: four of five prompts have s^2 < eps, one prompt carries
    # the whole ratio and happens to fit these rewards exactly; candidate 1 is a normal tilt.
    v_grid = np.array([[1 - 1e-9] * 4 + [0.5], [0.7] * 4 + [0.5]])
    rewards = np.array([1.0, 1, 1, 1, 0.5])
    assert np.allclose(E.active_fraction(v_grid * (1 - v_grid)), [0.2, 1.0])
    unguarded, losses = E.select_beta(v_grid, rewards, criterion="refined", min_active=0)
    assert int(unguarded) == 0 and np.all(np.isfinite(losses))
    guarded, losses = E.select_beta(v_grid, rewards, criterion="refined")
    assert int(guarded) == 1 and np.isinf(losses[0])
    # never exclude every candidate
    only, _ = E.select_beta(v_grid[:1], rewards, criterion="refined")
    assert int(only) == 0


# ---------------------------------------------------------------- baselines and registry


def test_baselines_match_hand_computed_examples():
    r = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    assert np.allclose(E.grpo(r), [[0.75] * 4, [0.25] * 4])
    assert np.allclose(E.rloo(r), [[2 / 3, 1.0, 2 / 3, 2 / 3], [1 / 3, 1 / 3, 1 / 3, 0.0]])
    assert np.allclose(E.reinforce_pp(np.array([1.0, 0.0, 0.0, 1.0, 1.0])), [0.6] * 5)
    assert np.array_equal(E.vanilla(np.array([1.0, 0.0])), [0.0, 0.0])


def test_numpy_and_torch_give_the_same_numbers_for_every_registered_estimator():
    torch = import_extra("hf", "torch")
    rng = np.random.default_rng(30)
    betas = E.default_betas(8)
    ref = (rng.random((40, 32)) < rng.random((40, 1))).astype(float)
    v_table, var_table = E.tilted_moments(ref, betas)
    idx = np.stack([rng.choice(40, 16, replace=False) for _ in range(3)])
    single = (rng.random((3, 16, 1)) < 0.5).astype(float)
    group = (rng.random((3, 16, 4)) < 0.5).astype(float)
    for name, est in E.ESTIMATORS.items():
        if est.stateful:  # no one-step call; numpy == torch in tests/test_memory.py
            continue
        rewards = group if est.group else single
        np_in = E.EstimatorInput(rewards, v_table[:, idx], var_table[:, idx], betas)
        t_in = E.EstimatorInput(
            *(torch.tensor(a) for a in (rewards, v_table[:, idx], var_table[:, idx], betas))
        )
        a, b = est(np_in), est(t_in)
        assert isinstance(b, torch.Tensor) and b.dtype == torch.float64, name
        assert a.shape == rewards.shape, name
        assert np.allclose(a, b.numpy()), name
    f32 = torch.tensor(single[..., 0], dtype=torch.float32)
    assert E.refine(torch.full_like(f32, 0.4), f32).dtype == torch.float32


def test_registry_lookup_and_registration():
    with pytest.raises(InputError, match=r"unknown estimator 'nope'.*basis"):
        E.get("nope")

    with E.ESTIMATORS.temporary():

        @E.register_estimator("test_constant_half")
        def half(batch):
            """Always one half."""
            return batch.rewards * 0 + 0.5

        est = E.get("test_constant_half")
        assert est.description == "Always one half." and not est.group
        assert np.allclose(est(E.EstimatorInput(np.ones((2, 3, 1)))), 0.5)
        with pytest.raises(ValueError, match="already registered"):
            E.register_estimator("test_constant_half")(half)
    assert "test_constant_half" not in E.ESTIMATORS


def test_every_registered_estimator_is_a_step_kernel_factory_that_steps():
    """One contract: each registry entry builds its kernel, and the kernel runs two steps of
    two parallel streams; a stateful estimator has no one-step function (none only raises)."""
    rng = np.random.default_rng(0)
    p, b, g = 6, 4, 3
    ref = rng.integers(0, 2, (p, 16)).astype(float)
    features = rng.normal(size=(p, 2))  # for basis_context
    table = E.TiltTable.from_cache(ref, None, 0.5, [f"p{i}" for i in range(p)], features)
    for name, est in E.available().items():
        opts = est.parse_options()
        kernel = est.kernel(est, opts, table if est.uses_cache else None, ref, (0.0, 1.0))
        state = kernel.initial_state((2,))
        width = est.rollouts_per_prompt(g)
        for _ in range(2):
            cols = np.stack([rng.permutation(p)[:b] for _ in range(2)])
            rewards = rng.integers(0, 2, (2, b, width)).astype(float)
            out = kernel.step(state, cols, rewards)
            assert np.shape(out.baselines) == (2, b, width), name
            assert np.all(np.isfinite(out.baselines)), name
        assert est.stateful == (est.fn is None), name
        if est.stateful:
            with pytest.raises(InputError, match="no one-step call"):
                est(E.EstimatorInput(np.ones((b, 1))))


def test_a_stateful_estimator_registers_its_kernel_alone():
    """``register_estimator(name, kernel=...)`` registers at once and takes no function (the
    decorator form, whose body was never the estimator, is refused)."""

    class Count:
        """Counts the steps: a stateful toy."""

        def __init__(self, estimator, options, table, ref_rewards, reward_range):
            pass

        def initial_state(self, lead):
            return {"steps": np.zeros(lead)}

        def step(self, state, cols, rewards):
            state["steps"] += 1
            return E.StepOutput(rewards * 0 + state["steps"][..., None, None])

    with E.ESTIMATORS.temporary():
        E.register_estimator("test_count", kernel=Count)
        assert E.get("test_count").description == "Counts the steps: a stateful toy."

        est = E.get("test_count")
        assert est.stateful and est.fn is None
        step = E.make_step_estimator("test_count")
        step(["a", "b"], np.zeros((2, 1)))
        assert step(["a", "b"], np.zeros((2, 1))).baselines.tolist() == [[2.0], [2.0]]
        with pytest.raises(TypeError, match="'test_count_old' is registered with its kernel"):

            @E.register_estimator("test_count_old", kernel=Count)
            def _old(batch, options):
                raise AssertionError("never called")


# The numbers the Basis and SpoTracker classes gave on main ce9c9a6, before they became names
# for make_step_estimator: three batches of a stream, per option set (baselines, beta, index).
PINNED_BATCHES = [
    (["p0", "p3", "p5", "p6"], [1.0, 0.0, 1.0, 1.0]),
    (["p1", "p2", "p3", "p7"], [0.0, 0.0, 1.0, 0.0]),
    (["p4", "p0", "p6", "p2"], [1.0, 1.0, 0.0, 1.0]),
]
PINNED_BASIS = [
    ({}, [
        ([0.8340790190139855, 0.7510071262686628, 0.6149107707944701, 0.8044190205659604], 0.905804597100207, 18),
        ([0.3461538461538461, 0.7307692307692307, 0.5, 0.5769230769230769], math.inf, 32),
        ([0.681986409341876, 0.7238392683968259, 0.681986409341876, 0.8101968118075114], 2.2086723515700353, 14),
    ]),
    ({"calibration": "previous"}, [
        ([0.625, 0.5, 0.3461538461538461, 0.5769230769230769], math.inf, 32),
        ([0.6149107707944701, 0.8911478386458653, 0.7510071262686628, 0.8044190205659604], 0.905804597100207, 18),
        ([0.5769230769230769, 0.625, 0.5769230769230769, 0.7307692307692307], math.inf, 32),
    ]),
    ({"calibration": "fixed", "fixed_beta": 2.0}, [
        ([0.7331816940508624, 0.6224593312018546, 0.4660551039608244, 0.6921425176015688], 2.0, 0),
        ([0.4660551039608244, 0.8173549539017856, 0.6224593312018546, 0.6921425176015688], 2.0, 0),
        ([0.6921425176015688, 0.7331816940508624, 0.6921425176015688, 0.8173549539017856], 2.0, 0),
    ]),
    ({"variant": "vop", "eps": 1e-4}, [
        ([0.6611753444195398, 0.8789825730082886, 0.5206754896874799, 0.6519884531929958], 0.905804597100207, 18),
        ([0.11390532544378698, 0.37542265426880816, 0.5, 0.22004437869822488], math.inf, 32),
        ([0.604197872782291, 0.6371602327359612, 0.8179186029205869, 0.692968966418337], 2.2086723515700353, 14),
    ]),
]  # fmt: skip
PINNED_SPO = [
    [0.625, 0.5, 0.34615384615384615, 0.5769230769230769],
    [0.34615384615384615, 0.7307692307692307, 0.4, 0.5769230769230769],
    [0.5769230769230769, 0.7, 0.6615384615384615, 0.5846153846153845],
]


def _pinned_cache() -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(7)
    ref = rng.integers(0, 2, (8, 12)).astype(float)
    ref[0, 3] = np.nan
    return [f"p{i}" for i in range(8)], ref


@pytest.mark.parametrize(("options", "want"), PINNED_BASIS)
def test_basis_gives_the_numbers_of_the_class_it_replaced(options, want):
    ids, ref = _pinned_cache()
    basis = E.Basis(ids, ref, **options)
    assert isinstance(basis, E.StepEstimator)
    for (batch, rewards), (values, beta, index) in zip(PINNED_BATCHES, want, strict=True):
        out = basis(batch, np.array(rewards))
        np.testing.assert_allclose(out.baselines, values, rtol=1e-14, atol=0)
        assert (out.beta, out.beta_index) == (beta, index)


def test_spo_tracker_gives_the_numbers_of_the_class_it_replaced():
    ids, ref = _pinned_cache()
    tracker = E.SpoTracker(ids, ref, decay=0.8)
    assert isinstance(tracker, E.StepEstimator)
    for (batch, rewards), values in zip(PINNED_BATCHES, PINNED_SPO, strict=True):
        np.testing.assert_allclose(tracker(batch, np.array(rewards)).baselines, values, rtol=1e-14)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    b=st.integers(min_value=2, max_value=12),
    variant=st.sampled_from(["unb", "vop", "rvg"]),
    shrink=st.booleans(),
)
def test_refine_is_permutation_equivariant(data, b, variant, shrink):
    """Reordering the prompts of a batch reorders the refined values and changes nothing else."""
    unit = st.floats(min_value=0.01, max_value=0.99, allow_nan=False)
    v = np.array(data.draw(st.lists(unit, min_size=b, max_size=b)))
    r = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b, max_size=b)))
    perm = np.array(data.draw(st.permutations(range(b))))
    out = E.refine(v, r, variant=variant, shrink=shrink)
    # the batch sums change order, so rounding does: 9e-12 relative was seen (v = 0.9375,
    # shrink), far below any real mix-up of prompts
    np.testing.assert_allclose(
        E.refine(v[perm], r[perm], variant=variant, shrink=shrink),
        out[perm],
        rtol=1e-9,
        atol=1e-12,
    )


# ---------------------------------------------------------------- bad input


def test_bad_input_gives_clear_errors():
    v = np.full(4, 0.5)
    with pytest.raises(InputError, match="shape mismatch"):
        E.refine(v, np.ones(3))
    with pytest.raises(InputError, match="outside the declared reward range"):
        E.refine(v, np.array([0.0, 1, 2, 1]))
    with pytest.raises(InputError, match="NaN"):
        E.refine(v, np.array([0.0, 1, np.nan, 1]))
    with pytest.raises(InputError, match="grid is empty"):
        E.tilted_value(np.ones((2, 3)), [])
    with pytest.raises(InputError, match=r"the beta grid's size k \(candidates\) must be >= 1"):
        E.default_betas(0)
    with pytest.raises(InputError, match="unknown refinement variant"):
        E.refine(v, np.ones(4), variant="blue")
    with pytest.raises(InputError, match="positive"):
        E.tilted_value(np.ones((2, 3)), -1.0)
    with pytest.raises(InputError, match="G >= 2"):
        E.rloo(np.ones((3, 1)))
    with pytest.raises(InputError, match="one rollout per prompt"):
        E.get("basis")(E.EstimatorInput(np.ones((4, 2)), np.full((3, 4), 0.5), None, np.ones(3)))
    assert E.refine(v, np.array([0.0, 3, 2, 1]), reward_range=None).shape == (4,)


# ---------------------------------------------------------------- the step boundary (issue 35)


def _step_inputs(name: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    ids = ["a", "b", "c", "d"]
    cache = np.random.default_rng(0).integers(0, 2, size=(4, 16)).astype(float)
    g = 2 if E.get(name).group else 1
    rewards = np.tile(np.array([[1.0], [0.0], [0.0], [1.0]]), (1, g))
    rewards[0, -1] = 0.0
    return ids, cache, rewards


@pytest.mark.parametrize("dtype", ["bfloat16", "torch_bool", "bool", "int8", "list"])
@pytest.mark.parametrize("name", sorted(E.available()))
def test_every_step_estimator_takes_any_real_rewards(name, dtype):
    """bfloat16, boolean, int8 and list rewards give the float64 baselines (they raised
    TypeError / RuntimeError / AttributeError past make_step_estimator's boundary)."""
    if dtype in ("bfloat16", "torch_bool"):
        torch = import_extra("hf", "torch")
    ids, cache, rewards = _step_inputs(name)
    expected = np.asarray(
        E.make_step_estimator(name, prompt_ids=ids, ref_rewards=cache)(ids, rewards).baselines
    )
    given = {
        "bfloat16": lambda r: torch.tensor(r, dtype=torch.bfloat16),
        "torch_bool": lambda r: torch.tensor(r.astype(bool)),
        "bool": lambda r: r.astype(bool),
        "int8": lambda r: r.astype(np.int8),
        "list": lambda r: r.tolist(),
    }[dtype](rewards)
    est = E.make_step_estimator(name, prompt_ids=ids, ref_rewards=cache)
    got = est(ids, given).baselines
    values = got.float().numpy() if hasattr(got, "detach") else np.asarray(got)
    np.testing.assert_allclose(values, expected, atol=1e-2)


@pytest.mark.parametrize("name", sorted(E.available()))
def test_every_step_estimator_takes_a_bfloat16_cache_and_refuses_an_empty_step(name):
    torch = import_extra("hf", "torch")
    ids, cache, rewards = _step_inputs(name)
    expected = E.make_step_estimator(name, prompt_ids=ids, ref_rewards=cache)(ids, rewards)
    half = torch.tensor(cache, dtype=torch.bfloat16)  # 0/1 rewards are exact in bfloat16
    got = E.make_step_estimator(name, prompt_ids=ids, ref_rewards=half)(ids, rewards)
    np.testing.assert_allclose(np.asarray(got.baselines), np.asarray(expected.baselines))
    est = E.make_step_estimator(name, prompt_ids=ids, ref_rewards=cache)
    with pytest.raises(InputError, match="no prompts"):
        est([], np.zeros((0, rewards.shape[1])))


def test_the_direct_step_classes_take_lists_and_refuse_an_empty_batch():
    ids, cache = ["a", "b"], np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    spo = E.SpoTracker(ids, cache)(ids, [1, 0]).baselines  # a step estimator's StepOutput
    want = E.SpoTracker(ids, cache)(ids, np.array([1.0, 0.0])).baselines
    np.testing.assert_allclose(spo, want)
    with pytest.raises(InputError, match="no prompts"):
        E.SpoTracker(ids, cache)([], np.zeros(0))
    with pytest.raises(InputError, match="no prompts"):  # it gave NaN with two warnings
        E.Basis(ids, cache, refine=False)([], np.zeros(0))


@pytest.mark.parametrize("name", sorted(n for n, e in E.available().items() if e.uses_cache))
def test_a_reference_cache_outside_the_reward_range_is_refused(name):
    """A cache of rewards in [0, 2] with the default range [0, 1] gave baselines above 1."""
    ids, cache, _ = _step_inputs(name)
    with pytest.raises(InputError, match="ref_rewards fall outside the declared reward range"):
        E.make_step_estimator(name, prompt_ids=ids, ref_rewards=2 * cache)
    missing = cache.copy()
    missing[0, 0] = np.nan  # a missing sample is not out of range
    E.make_step_estimator(name, prompt_ids=ids, ref_rewards=missing)
    if name != "spo_tracker":  # its Beta posterior needs [0, 1] whatever the range says
        E.make_step_estimator(name, prompt_ids=ids, ref_rewards=2 * cache, reward_range=(0, 2))


def test_basis_refuses_a_reference_cache_outside_its_reward_range():
    ids, cache = ["a", "b"], np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    with pytest.raises(InputError, match="outside the declared reward range"):
        E.Basis(ids, 3 * cache)
    with pytest.raises(InputError, match="infinite"):
        E.Basis(ids, np.where(cache > 0, np.inf, 0.0), reward_range=None)
    assert E.Basis(ids, 3 * cache, reward_range=None).table.values.max() > 1

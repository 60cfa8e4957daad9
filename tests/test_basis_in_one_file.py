"""docs/basis_in_one_file.py, the one-screen reference of BASIS, against the package: the
same baselines and betas to 1e-12 over several batches and steps of calibration."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from basis_bench.estimators import make_step_estimator

_PATH = Path(__file__).resolve().parents[1] / "docs" / "basis_in_one_file.py"
_SPEC = importlib.util.spec_from_file_location("basis_in_one_file", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
ref = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ref)


def _cache(rng: np.random.Generator, binary: bool):
    """40 prompts x 16 cached rewards, some missing (NaN), three never solved; and the
    reference's success rates."""
    p = rng.beta(0.6, 0.6, size=40)
    p[:3] = 0.0
    draw = rng.random((40, 16))
    cache = (draw < p[:, None]).astype(float) if binary else draw * p[:, None]
    cache[rng.random(cache.shape) < 0.1] = np.nan
    return [f"q{i}" for i in range(40)], cache, p


def _batches(rng: np.random.Generator, ids: list[str], p: np.ndarray, binary: bool):
    """Batches of 16 prompts from a policy that drifts from the reference: its log-odds
    rise by 1/beta_t, beta_t falling from 20 to 0.05 over seven steps (at the last, nearly
    every rollout succeeds: the guard on the active set binds)."""
    for beta in [*np.geomspace(20, 0.5, 6), 0.05]:
        rows = rng.choice(len(ids), size=16, replace=False)
        q = np.clip(p[rows], 0.02, 0.98)
        v = 1 / (1 + (1 - q) / q * np.exp(-1 / beta))
        draw = rng.random(16)
        yield [ids[i] for i in rows], ((draw < v).astype(float) if binary else draw * v)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "continuous"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"calibration": "previous"},
        {"criterion": "refined", "variant": "vop"},
        {"criterion": "refined", "loss": "log", "calibration": "previous"},
        {"variant": "rvg", "min_active": 0.0},
        {"loss": "log", "eps": 1e-3, "min_active": 0.9},
    ],
    ids=["default", "previous", "refined-vop", "refined-log-previous", "rvg", "log-eps"],
)
def test_reference_matches_the_package_step_by_step(binary, options):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        ids, cache, p = _cache(rng, binary)
        package = make_step_estimator("basis_paper", options, prompt_ids=ids, ref_rewards=cache)
        mine = ref.BasisReference(ids, cache, **options)
        betas_seen = set()
        for batch, rewards in _batches(rng, ids, p, binary):
            got, beta = mine(batch, rewards)
            want = package(batch, rewards)
            np.testing.assert_allclose(got, want.baselines, rtol=0, atol=1e-12)
            assert beta == want.beta
            betas_seen.add(beta)
        assert len(betas_seen) > 1, "calibration moved beta across the steps"


def test_reference_tilt_matches_the_closed_form():
    """Binary: logit V_beta = logit p + 1/beta with p the smoothed rate (the spec's fact)."""
    rng = np.random.default_rng(7)
    cache = (rng.random((10, 64)) < rng.random((10, 1))).astype(float)
    betas = ref.default_betas(8)
    v, var = ref.tilt(cache, betas)
    p = (cache.sum(1) + 0.5) / 65
    logit = np.log(v) - np.log1p(-v)
    np.testing.assert_allclose(logit, np.log(p / (1 - p))[None] + 1 / betas[:, None], atol=1e-9)
    np.testing.assert_allclose(var, v * (1 - v))

"""The simulator: the documented generative model, its labels and its determinism."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from basis_bench.errors import InputError
from basis_bench.guards.outputs import read_metadata
from basis_bench.rollouts.simulate import checkpoint_values, reference_values, simulate
from basis_bench.rollouts.simulation import SETTINGS, SimulationConfig, parse_stages
from basis_bench.rollouts.store import dataset_metadata, load_prompts, load_rollouts


def _logit(p):
    return np.log(p) - np.log1p(-p)


def test_writes_store_schema_with_simulated_label(tmp_path):
    cfg = SimulationConfig(n_prompts=50, ref_n=8, checkpoint_n=12, seed=1)
    simulate(cfg, tmp_path)
    df = load_rollouts(tmp_path)
    counts = df.group_by("policy").len().sort("policy")
    assert dict(counts.iter_rows()) == {
        "reference": 50 * 8,
        "early": 50 * 12,
        "middle": 50 * 12,
        "late": 50 * 12,
    }
    assert df["reward"].is_in([0.0, 1.0]).all()
    for meta in dataset_metadata(tmp_path):
        assert meta["simulated"] is True
        assert meta["label"].startswith("simulated")
        assert meta["reference_policy"] == "reference"
        assert meta["policies"] == ["reference", "early", "middle", "late"]
    prompts = load_prompts(tmp_path)
    assert prompts is not None and prompts.height == 50
    assert read_metadata(tmp_path / "prompts.parquet")["simulated"] is True
    assert {"sim_value_reference", "sim_value_late"} <= set(prompts.columns)


def test_same_seed_same_bytes_other_seed_other_rewards(tmp_path):
    cfg = SimulationConfig(n_prompts=40, ref_n=4, checkpoint_n=6, seed=5)
    a, b = simulate(cfg, tmp_path / "a"), simulate(cfg, tmp_path / "b")
    for f in sorted(a.rglob("*.parquet")):
        assert f.read_bytes() == (b / f.relative_to(a)).read_bytes()
    c = simulate(SimulationConfig(n_prompts=40, ref_n=4, checkpoint_n=6, seed=6), tmp_path / "c")
    assert not load_rollouts(a)["reward"].equals(load_rollouts(c)["reward"])


def test_tilt_setting_is_a_constant_logit_shift_up_to_its_noise():
    cfg = SimulationConfig(n_prompts=5000, setting="tilt")
    rng = np.random.default_rng(0)
    p = reference_values(cfg, rng)
    values = checkpoint_values(p, cfg, rng)
    for name, delta in cfg.stages.items():
        shift = _logit(values[name]) - _logit(p)
        assert shift.mean() == pytest.approx(delta, abs=0.01)
        assert shift.std() == pytest.approx(SETTINGS["tilt"].tau, rel=0.05)


def test_misspecified_settings_break_the_shared_shift():
    base = SimulationConfig(n_prompts=5000)
    rng = np.random.default_rng(0)
    p = reference_values(base, rng)
    spread = {}
    for setting in SETTINGS:
        cfg = SimulationConfig(n_prompts=5000, setting=setting)
        shift = _logit(checkpoint_values(p, cfg, np.random.default_rng(1))["late"]) - _logit(p)
        spread[setting] = shift.std()
        assert SETTINGS[setting].misspecified == (setting != "tilt")
    assert all(spread[s] > 5 * spread["tilt"] for s in SETTINGS if s != "tilt")
    forget = SimulationConfig(n_prompts=5000, setting="forget")
    shift = _logit(checkpoint_values(p, forget, np.random.default_rng(1))["late"]) - _logit(p)
    assert np.mean(shift < 0) == pytest.approx(SETTINGS["forget"].phi, abs=0.03)
    sharpen = SimulationConfig(n_prompts=5000, setting="sharpen")
    shift = _logit(checkpoint_values(p, sharpen, np.random.default_rng(1))["late"]) - _logit(p)
    slope = np.polyfit(_logit(p), shift, 1)[0]
    assert slope == pytest.approx(SETTINGS["sharpen"].kappa, abs=0.02)


def test_empirical_rates_follow_the_true_values(tmp_path):
    simulate(SimulationConfig(n_prompts=200, ref_n=400, checkpoint_n=400, seed=2), tmp_path)
    prompts = load_prompts(tmp_path)
    assert prompts is not None
    rates = load_rollouts(tmp_path).group_by("policy", "prompt_id").agg(pl.col("reward").mean())
    for policy in ("reference", "late"):
        got = prompts.join(rates.filter(pl.col("policy") == policy), on="prompt_id")
        err = (got["reward"] - got[f"sim_value_{policy}"]).to_numpy()
        assert np.abs(err).max() < 0.1  # 400 Bernoulli draws: sd <= 0.025


def test_bad_configs_are_input_errors():
    with pytest.raises(InputError, match="--setting must be one of tilt, noisy"):
        SimulationConfig(setting="nope")
    with pytest.raises(InputError, match="reference"):
        SimulationConfig(stages={"reference": 1.0})
    with pytest.raises(InputError, match="--prompts must be >= 2; got 1"):
        SimulationConfig(n_prompts=1)
    with pytest.raises(InputError, match="mixture weight or Beta parameter must be > 0"):
        SimulationConfig(mixture=((1.0, 0.0, 1.0),))
    with pytest.raises(InputError, match="NAME=LOGODDS_SHIFT"):
        parse_stages(["late"])
    with pytest.raises(InputError, match="NAME=LOGODDS_SHIFT"):
        parse_stages(["late=fast"])
    assert parse_stages(["a=0.5", "b=-1"]) == {"a": 0.5, "b": -1.0}


def test_a_stage_name_that_is_no_file_name_or_given_twice_is_refused(tmp_path):
    """--stage ../../evil=1 wrote evil.parquet outside --out; a=1 --stage a=2 kept a=2."""
    for name in ("../../evil", "a/b", ".hidden", "a b", "x" * 201, "late\n"):
        with pytest.raises(InputError, match=r"--stage .*letters, digits"):
            simulate(SimulationConfig(n_prompts=4, stages={name: 1.0}), tmp_path / "d" / "e")
    assert not list(tmp_path.rglob("*.parquet"))
    with pytest.raises(InputError, match="--stage 'a' is given twice"):
        parse_stages(["a=1", " a =2"])

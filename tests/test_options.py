"""Typed estimator options, the registry's lifecycle, the step-estimator factory and
third-party plug-ins found through the ``basis_bench.estimators`` entry point group."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from basis_bench import estimators as E
from basis_bench.errors import InputError
from basis_bench.estimators import options as O
from basis_bench.guards.outputs import write_parquet_atomic

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("cls", "values", "message"),
    [
        (O.BasisOptions, {"eps": math.nan}, "basis.eps must be a number, not NaN"),
        (O.BasisOptions, {"eps": -1e-6}, "basis.eps must be >= 0; got -1e-06"),
        (O.BasisOptions, {"eps": "1e-6"}, "basis.eps must be a number"),
        (O.BasisOptions, {"min_active": 1.5}, "basis.min_active must be in [0, 1]; got 1.5"),
        (
            O.BasisOptions,
            {"variant": "blue"},
            "basis.variant must be one of unb, vop, rvg; got 'blue'",
        ),
        (O.BasisOptions, {"calibration": "fixed"}, "calibration fixed needs fixed_beta"),
        (O.BasisOptions, {"fixed_beta": 1.0}, "fixed_beta only applies with calibration fixed"),
        (
            O.BasisOptions,
            {"calibration": "fixed", "fixed_beta": 0.0},
            "basis.fixed_beta must be > 0; got 0.0",
        ),
        (O.BasisOptions, {"clip": (1.0, 0.0)}, "low <= high"),
        (O.BasisOptions, {"clip": 5}, "basis.clip must be a pair [low, high]; got 5"),  # TypeError
        (O.BasisOptions, {"clip": (0, 1, 2)}, "basis.clip must be a pair [low, high]"),
        (E.MemoryOptions, {"gammas": (0.5, 2)}, "basis_memory.gammas must be in (0, 1]; got 2"),
        (E.MemoryOptions, {"weights": []}, "basis_memory.weights must not be empty"),
        (O.BasisOptions, {"shrink": 1}, "basis.shrink must be true or false"),
        (O.JamesSteinOptions, {"eps": math.inf}, "james_stein.eps must be finite"),
        (O.ApoOptions, {"beta": math.nan}, "apo.beta must be a number, not NaN"),
        (O.ApoOptions, {"beta": 0}, "apo.beta must be > 0; got 0"),
        (O.SpoOptions, {"decay": 1.0}, "never forgets"),
        (O.TableOptions, {"grid_size": 0}, "table.grid_size must be in [1, 1024]; got 0"),
    ],
)
def test_options_refuse_values_the_estimator_cannot_use(cls, values, message):
    with pytest.raises(InputError) as err:
        cls(**values)
    assert message in str(err.value)


def test_options_are_frozen_normalised_and_documented():
    opts = O.BasisOptions(eps=0, clip=[0, 1], calibration="fixed", fixed_beta=math.inf)
    assert opts.eps == 0.0 and isinstance(opts.eps, float) and opts.clip == (0.0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.eps = 1.0  # type: ignore[misc]
    for cls in (O.BasisOptions, O.TableOptions, O.JamesSteinOptions, O.ApoOptions, O.SpoOptions):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_parse_options_merges_defaults_and_names_valid_keys():
    assert E.parse_options("basis_vop", {"eps": 1e-3}) == O.BasisOptions(variant="vop", eps=1e-3)
    assert E.parse_options("offline") == O.BasisOptions(refine=False)
    assert E.parse_options("apo", {"beta": 1}) == O.ApoOptions(beta=1.0)
    with pytest.raises(
        InputError, match=r"unknown option\(s\) js_eps for estimator 'james_stein'; valid: eps"
    ):
        E.parse_options("james_stein", {"js_eps": 1e-3})
    with pytest.raises(InputError, match=r"valid: calibration, fixed_beta, variant"):
        E.parse_options("basis", {"epsilon": 1e-3})
    with pytest.raises(InputError, match="unknown estimator"):
        E.parse_options("nope", {})


def test_registered_estimators_each_name_their_options_class():
    classes = {name: est.options_class for name, est in E.ESTIMATORS.items()}
    assert classes["basis"] is classes["offline"] is classes["basis_rvg"] is O.BasisOptions
    assert classes["grpo"] is classes["reference_mean"] is O.NoOptions
    assert classes["james_stein"] is O.JamesSteinOptions and classes["apo"] is O.ApoOptions
    assert list(E.ESTIMATORS)[:4] == ["vanilla", "reinforce_pp", "grpo", "rloo"]


# ---------------------------------------------------------------- registry


def test_temporary_registrations_are_removed():
    before = list(E.ESTIMATORS)
    with E.ESTIMATORS.temporary():

        @E.register_estimator("test_tmp", options=O.JamesSteinOptions)
        def tmp(batch, options):
            """Returns eps."""
            return batch.rewards * 0 + options.eps

        out = E.get("test_tmp")(E.EstimatorInput(np.ones((3, 1))), {"eps": 0.25})
        assert np.all(out == 0.25)
    assert list(E.ESTIMATORS) == before


def test_registry_checks_input_once_at_the_boundary():
    bad = E.EstimatorInput(np.array([[0.5], [np.nan]]))
    with pytest.raises(InputError, match="NaN or infinite"):
        E.get("reinforce_pp")(bad)
    with pytest.raises(InputError, match="outside the declared reward range"):
        E.get("vanilla")(E.EstimatorInput(np.array([[2.0]])))


# ---------------------------------------------------------------- factory


def test_step_estimator_matches_basis_and_the_registry():
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(12)]
    ref = (rng.random((12, 16)) < rng.random((12, 1))).astype(float)
    rewards = (rng.random((6, 1)) < 0.5).astype(float)
    batch = ids[3:9]
    step = E.make_step_estimator("basis_vop", {"eps": 1e-4}, prompt_ids=ids, ref_rewards=ref)
    out = step(batch, rewards)
    want = E.Basis(ids, ref, variant="vop", eps=1e-4)(batch, rewards[:, 0])
    np.testing.assert_array_equal(out.baselines[:, 0], want.baselines)
    assert (out.beta, out.beta_index) == (want.beta, want.beta_index)

    apo = E.make_step_estimator("apo", prompt_ids=ids, ref_rewards=ref)(batch, rewards)
    np.testing.assert_allclose(apo.baselines[:, 0], E.apo_value(ref[3:9], 0.5), rtol=1e-12)
    assert apo.beta is None

    grpo = E.make_step_estimator("grpo")(batch, np.ones((6, 4)))
    assert grpo.baselines.shape == (6, 4)
    with pytest.raises(InputError, match="needs the reference cache"):
        E.make_step_estimator("basis")


def test_basis_previous_calibration_state_round_trips():
    rng = np.random.default_rng(1)
    ids = [f"p{i}" for i in range(8)]
    ref = (rng.random((8, 16)) < 0.5).astype(float)
    step = E.make_step_estimator(
        "basis", {"calibration": "previous"}, prompt_ids=ids, ref_rewards=ref
    )
    assert step.previous_index == len(step.table.betas) - 1  # beta = inf first
    first = step(ids, np.ones((8, 1)))
    assert first.beta == math.inf
    step.previous_index = 3
    assert step(ids, np.zeros((8, 1))).beta_index == 3


# ---------------------------------------------------------------- plug-ins


PLUGIN = '''
import numpy as np
from dataclasses import dataclass, field
from basis_bench.estimators import register_estimator


@dataclass(frozen=True)
class ConstantOptions:
    value: float = field(default=0.5, metadata={"help": "The constant baseline."})


@register_estimator("plugin_constant", options=ConstantOptions)
def constant(batch, options):
    """A third-party constant baseline."""
    return batch.rewards * 0 + options.value
'''


def _install_plugin(site: Path, name: str, module: str, source: str) -> None:
    """A minimal installed distribution: its module and a .dist-info with entry_points.txt."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[basis_bench.estimators]\n{name} = {module}\n")


def _data(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for policy, m in {
        "reference": (rng.random((20, 8)) < 0.5).astype(float),
        "late": (rng.random((20, 12)) < 0.5).astype(float),
    }.items():
        p, s = m.shape
        df = pl.DataFrame(
            {
                "prompt_id": np.repeat([f"q{i:03d}" for i in range(p)], s),
                "policy": policy,
                "sample_idx": np.tile(np.arange(s, dtype=np.int32), p),
                "reward": m.ravel(),
            }
        )
        write_parquet_atomic(df, root / f"{policy}.parquet")
    return root


def _evaluate(site: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``basis-bench evaluate`` in a fresh interpreter that sees ``site`` on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-c", "from basis_bench.cli import main; main()", "evaluate",
        "--rollouts", str(_data(tmp_path / "d")), "--oracle-n", "4", "--ref-n", "8",
        "--batch-size", "8", "--repeats", "3", "--group-size", "4", "--no-estimates",
        "--out", str(tmp_path / "o"), *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_installed_plugin_appears_in_all_and_takes_its_options(tmp_path):
    site = tmp_path / "site"
    _install_plugin(site, "bb_plugin_const", "bb_plugin_const", PLUGIN)
    done = _evaluate(
        site, tmp_path, "--estimators", "all", "--option", "plugin_constant.value=0.25"
    )
    assert done.returncode == 0, done.stderr
    summary = pl.read_csv(tmp_path / "o" / "summary.csv")
    assert "plugin_constant" in summary["estimator"].to_list()
    assert summary["estimator"].to_list()[:2] == ["vanilla", "reinforce_pp"]
    est = pl.read_csv(tmp_path / "o" / "summary.csv").filter(
        pl.col("estimator") == "plugin_constant"
    )
    assert est["extreme_rate"].item() == 0.0  # 0.25 is never a 0/1 baseline


def test_broken_plugin_is_a_named_warning_not_a_traceback(tmp_path):
    site = tmp_path / "site"
    _install_plugin(site, "bb_plugin_broken", "bb_plugin_broken", "import not_a_module_anywhere\n")
    done = _evaluate(site, tmp_path, "--estimators", "all")
    assert done.returncode == 0, done.stderr
    assert "warning: estimator plug-in 'bb_plugin_broken'" in " ".join(done.stderr.split())
    assert "ModuleNotFoundError" in done.stderr and "Traceback" not in done.stderr
    assert "basis" in pl.read_csv(tmp_path / "o" / "summary.csv")["estimator"].to_list()

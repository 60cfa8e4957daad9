"""No log the package writes holds a non-finite number (issue 45 item 4): JSON has none (Python
writes ``Infinity``, which strict readers and TensorBoard refuse), so beta = inf is the string
"inf" in JSON files, left out with a ``beta_infinite`` flag where a value must be a number
(trackers, TRL's logs); and TRL's G = 1 ``frac_reward_zero_std`` is replaced."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import evaluate_args, import_extra, run_main

from basis_bench.estimators import StepOutput
from basis_bench.evaluation.record import RunRecord
from basis_bench.guards.outputs import OUTPUT_MARKER, json_text, read_metadata
from basis_bench.train.loop import jsonl_line
from basis_bench.train.tracking import scalars

ROOT = Path(__file__).resolve().parents[1]


def strict(text: str) -> Any:
    """JSON as a strict reader takes it: NaN, Infinity and -Infinity refused."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-finite number {constant} in {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def test_json_text_spells_out_what_json_has_no_number_for() -> None:
    data = {"b": [math.inf, -np.inf, np.float32(0.5), math.nan], "t": (1, np.float64(math.inf))}
    assert strict(json_text(data)) == {"b": ["inf", "-inf", 0.5, None], "t": [1, "inf"]}
    line = jsonl_line({"step": 3, "beta": math.inf, "eval_accuracy": math.nan})
    assert strict(line) == {"step": 3, "beta": "inf", "eval_accuracy": None}


def test_an_evaluate_run_writes_strict_json(sim_dataset, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "res"
    run = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out, "--estimators", "basis"))
    assert run.code == 0, run.message
    record = strict((out / "run.json").read_text())
    assert record["betas"][-1] == "inf"  # the grid's last beta: no tilt
    assert all(isinstance(b, float) for b in record["betas"][:-1])
    assert RunRecord.read(out / "run.json").run_id == record["run_id"]
    for path in [out / OUTPUT_MARKER, *out.glob("*.parquet")]:
        text = path.read_text() if path.suffix == ".json" else json.dumps(read_metadata(path))
        strict(text)


def test_tracker_scalars_are_finite_and_flag_an_infinite_beta() -> None:
    base = {"step": 1, "mean_reward": 0.5, "seconds": {"sample": 1.0}}
    infinite = scalars({**base, "beta": math.inf})
    assert "train/beta" not in infinite and infinite["train/beta_infinite"] == 1.0
    finite = scalars({**base, "beta": 0.35})
    assert finite["train/beta"] == 0.35 and finite["train/beta_infinite"] == 0.0
    assert "train/beta_infinite" not in scalars({**base, "beta": None})  # no beta to flag
    assert all(math.isfinite(v) for v in infinite.values())


# --------------------------------------------------------------------------- TRL


def _trl():
    try:
        return importlib.import_module("basis_bench.integrations.trl_trainer")
    except Exception as exc:
        pytest.skip(f"trl does not import here: {type(exc).__name__}: {exc}")


def test_basis_metrics_for_trl_are_finite_and_replace_the_zero_std_share() -> None:
    torch = import_extra("hf", "torch")
    from basis_bench.integrations.trl_advantages import step_metrics

    advantages = torch.tensor([0.0, 0.5, -0.25, 0.0])
    baselines = np.array([1.0, 0.5, 0.25, 0.0])
    infinite = step_metrics(StepOutput(baselines=baselines, beta=math.inf), advantages)
    assert infinite == {
        "basis/baseline_mean": 0.4375,
        "basis/frac_zero_advantage": 0.5,
        "basis/beta_infinite": 1.0,
    }
    finite = step_metrics(StepOutput(baselines=baselines, beta=2.5), advantages)
    assert finite["basis/beta"] == 2.5 and finite["basis/beta_infinite"] == 0.0
    assert "basis/beta" not in step_metrics(StepOutput(baselines=baselines), advantages)


def test_the_trl_plug_in_is_bounded_to_the_trl_it_overrides() -> None:
    """The installed (pinned) TRL lies in the extra's range, which the plug-in states too, and
    its GRPOTrainer has the private methods the plug-in overrides, as it overrides them."""
    trl = _trl()
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = next(r for r in extras["optional-dependencies"]["trl"] if r.startswith("trl"))
    assert SpecifierSet(spec[3:]) == SpecifierSet(trl.TRL_RANGE)
    assert SpecifierSet(trl.TRL_RANGE).contains(version("trl"))
    trl.check_seams()  # the installed GRPOTrainer: no error

    class Moved(trl.GRPOTrainer):  # a TRL that renamed an argument of one seam
        def _calculate_rewards(self, inputs, prompts, completions):  # type: ignore[override]
            raise NotImplementedError

    from basis_bench.errors import InputError

    with pytest.raises(InputError, match=r"_calculate_rewards is not the one.*trl>=1.16,<1.17"):
        trl.check_seams(Moved)
    for name in trl.SEAMS:  # the plug-in overrides each with TRL's own parameters
        ours = inspect.signature(getattr(trl.BasisGRPOTrainer, name)).parameters
        assert tuple(ours) == trl.SEAMS[name]

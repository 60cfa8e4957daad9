"""The Python API of the benchmark, for notebooks: the commands as functions returning frames.

``evaluate`` and ``sensitivity`` take the settings of ``basis-bench evaluate`` and
``sensitivity`` as keyword arguments (the fields of
:class:`~basis_bench.evaluation.config.EvaluateConfig` and
:class:`~basis_bench.evaluation.config.SensitivityConfig`), run the same code as the
commands, and write files only when ``out`` is given. Errors name the arguments
(``batch_size``), not the flags (:func:`~basis_bench.settings.naming`)::

    import basis_bench
    result = basis_bench.evaluate(estimators=["basis", "grpo"], repeats=100)
    result.summary  # a polars DataFrame: summary.csv's rows
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
from basis_bench.evaluation.run import EvaluateResult
from basis_bench.rollouts.simulation import SimulationConfig
from basis_bench.settings import naming, renamed_keys

Progress = Callable[[str, int, int], None]
_LISTS = ("checkpoints", "estimators", "parameters")  # a comma-separated string or a sequence


def _config(cls: type, command: str, settings: dict[str, Any]) -> Any:
    """``cls`` made from keyword ``settings`` (an old name of a setting with a notice); an
    unknown name is an InputError listing them."""
    settings = renamed_keys(cls, settings)
    known = [f.name for f in fields(cls)]
    unknown = [k for k in settings if k not in known]
    if unknown:
        raise InputError(
            f"{command}() has no setting {', '.join(map(repr, unknown))}; "
            f"its settings: {', '.join(known)}"
        )
    values = dict(settings)
    for name in _LISTS:
        if isinstance(values.get(name), str):
            values[name] = tuple(x.strip() for x in values[name].split(",") if x.strip())
        elif values.get(name) is not None:
            values[name] = tuple(values[name])
    if values.get("rollouts") is not None:
        values["rollouts"] = str(values["rollouts"])
    return cls(**values)


def evaluate(
    rollouts: str | os.PathLike[str] | None = None,
    estimators: str | Sequence[str] = "all",
    *,
    out: str | os.PathLike[str] | None = None,
    write_estimates: bool = False,
    progress: Progress | None = None,
    **settings: Any,
) -> EvaluateResult:
    """``basis-bench evaluate`` as a function: its tables as polars frames in one result.

    ``rollouts``: a dataset folder (default: the shipped SmolLM2 dataset); ``estimators``:
    registered names or ``"all"``; ``settings``: any other field of ``EvaluateConfig``
    (``batch_size=64, repeats=1000, group_size=8, basis_options={"eps": 1e-6},
    estimator_options={"apo": {"beta": 1.0}}, trajectory=False, ...``). Files are written
    to ``out`` only when it is given (the same files as the command); ``write_estimates``
    keeps the per-estimate rows (``result.estimates``; large: repeats x prompts x
    estimators).
    """
    from basis_bench.estimators import load_plugins
    from basis_bench.evaluation.run import evaluate as run_evaluate

    load_plugins()
    names = () if estimators == "all" else estimators
    with naming("field"):
        cfg = _config(
            EvaluateConfig,
            "evaluate",
            {"rollouts": rollouts, "estimators": names, "write_estimates": write_estimates}
            | settings,
        )
        return run_evaluate(cfg, out, progress)


def sensitivity(
    rollouts: str | os.PathLike[str] | None = None,
    estimators: str | Sequence[str] = ("basis",),
    *,
    out: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    **settings: Any,
) -> pl.DataFrame:
    """``basis-bench sensitivity`` as a function: sensitivity.csv's rows (one per checkpoint,
    parameter, value and estimator). ``settings``: any other field of ``SensitivityConfig``
    (``parameters=["eps", "ref_n"], repeats=200, ...``); files only when ``out`` is given."""
    from basis_bench.estimators import load_plugins
    from basis_bench.evaluation.sensitivity import sensitivity as run_sensitivity

    load_plugins()
    with naming("field"):
        cfg = _config(
            SensitivityConfig,
            "sensitivity",
            {"rollouts": rollouts, "estimators": estimators} | settings,
        )
        return run_sensitivity(cfg, out, progress)


def load_rollouts(
    rollouts: str | os.PathLike[str] | None = None, policies: Sequence[str] | None = None
) -> pl.DataFrame:
    """A dataset's rollouts (default: the shipped one), validated, one row per sample, sorted
    by (policy, prompt_id, sample_idx); ``policies`` reads only those."""
    from basis_bench.rollouts import store

    return store.load_rollouts(rollouts or store.default_dataset(), policies)


def simulate(out: str | os.PathLike[str], *, force: bool = False, **settings: Any) -> Path:
    """Write a simulated dataset to ``out`` (``basis-bench simulate``) and return its path,
    for ``evaluate(rollouts=...)``. ``settings``: fields of ``SimulationConfig``
    (``n_prompts=600, setting="tilt", stages={"early": 0.5}, seed=0, ...``)."""
    from basis_bench.rollouts.simulate import simulate as run_simulation

    with naming("field"):
        return run_simulation(
            _config(SimulationConfig, "simulate", settings), Path(out), force=force
        )


__all__ = ["EvaluateResult", "evaluate", "load_rollouts", "sensitivity", "simulate"]

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
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def path_argument(value: Any, name: str) -> str | None:
    """A path argument as the command line takes it: None (the default) or a non-empty
    ``str``/``os.PathLike``. ``""`` was the current folder (the CLI refuses ``--out ''``
    with the same line), and a frame passed as the dataset became a file name."""
    if value is None:
        return None
    if isinstance(value, bytes) or not isinstance(value, str | os.PathLike):
        raise InputError(
            f"{name} must be a path (a str or os.PathLike); got {type(value).__name__}"
        )
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{name} is empty; give a path (. for the current folder)")
    return text


def names_argument(value: Any, name: str) -> tuple[str, ...]:
    """Names as the command line takes them: one comma-separated string, or a sequence of
    names (a list, tuple or numpy array of strings); each a non-empty string. A string is
    never iterated letter by letter (``policies="late"`` read l, a, t, e); a numpy array
    raised numpy's "ambiguous truth value"."""
    if isinstance(value, str):
        return _some(tuple(x.strip() for x in value.split(",") if x.strip()), name)
    if hasattr(value, "tolist") and not isinstance(value, pl.Series | pl.DataFrame):
        value = value.tolist()  # a numpy array of names
    if isinstance(value, pl.Series):
        value = value.to_list()
    if isinstance(value, Mapping | set | frozenset | bytes) or not isinstance(value, Iterable):
        raise InputError(
            f"{name} must be a comma-separated string or a list of names; got "
            f"{type(value).__name__}"
        )
    items = list(value)
    bad = [x for x in items if not isinstance(x, str) or not x.strip()]
    if bad:
        raise InputError(f"{name} must hold names (non-empty strings); got {bad[0]!r}")
    return _some(tuple(x.strip() for x in items), name)


def _some(names: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``names``, refused when there are none: ``estimators=""`` ran every estimator and
    ``policies=[]`` returned an empty frame (an unset variable's, as an empty path is)."""
    if not names:
        raise InputError(f"{name} is empty; give names, or leave it unset for the default")
    return names


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
        if values.get(name) is not None:
            values[name] = names_argument(values[name], name)
    if values.get("estimators") == ("all",):  # every registered one, as on the command line
        values["estimators"] = ()
    if "rollouts" in values:
        values["rollouts"] = path_argument(values["rollouts"], "rollouts")
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
    out = path_argument(out, "out")
    with naming("field"):
        cfg = _config(
            EvaluateConfig,
            "evaluate",
            {"rollouts": rollouts, "estimators": estimators, "write_estimates": write_estimates}
            | settings,
        )
        result = run_evaluate(cfg, out, progress)
    for text in result.run.warnings:  # the oracle's noise rivals the MSE (run.json has it too)
        warnings.warn(text, UserWarning, stacklevel=2)
    return result


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
    out = path_argument(out, "out")
    with naming("field"):
        cfg = _config(
            SensitivityConfig,
            "sensitivity",
            {"rollouts": rollouts, "estimators": estimators} | settings,
        )
        return run_sensitivity(cfg, out, progress)


def load_rollouts(
    rollouts: str | os.PathLike[str] | None = None, policies: str | Sequence[str] | None = None
) -> pl.DataFrame:
    """A dataset's rollouts (default: the shipped one), validated, one row per sample, sorted
    by (policy, prompt_id, sample_idx); ``policies`` (names, or one comma-separated string)
    reads only those, each of which the dataset must hold."""
    from basis_bench.rollouts import store

    root = path_argument(rollouts, "rollouts") or store.default_dataset()
    if policies is None:
        return store.load_rollouts(root)
    wanted = names_argument(policies, "policies")
    df = store.load_rollouts(root, wanted)
    missing = [p for p in wanted if p not in set(df["policy"].unique().to_list())]
    if missing:  # was an empty frame, silently
        held = sorted({p for f in store.rollout_files(root) for p in store.file_policies(f)})
        raise InputError(
            f"policies {', '.join(map(repr, missing))} not in {root}; its policies: "
            f"{', '.join(held) or 'none'}"
        )
    return df


def simulate(out: str | os.PathLike[str], *, force: bool = False, **settings: Any) -> Path:
    """Write a simulated dataset to ``out`` (``basis-bench simulate``) and return its path,
    for ``evaluate(rollouts=...)``. ``settings``: fields of ``SimulationConfig``
    (``n_prompts=600, setting="tilt", stages={"early": 0.5}, seed=0, ...``)."""
    from basis_bench.rollouts.simulate import simulate as run_simulation

    where = path_argument(out, "out")
    if where is None:
        raise InputError("out is None; give the folder to write the simulated dataset to")
    with naming("field"):
        return run_simulation(
            _config(SimulationConfig, "simulate", settings), Path(where), force=force
        )


__all__ = ["EvaluateResult", "evaluate", "load_rollouts", "sensitivity", "simulate"]

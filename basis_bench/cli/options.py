"""Every option shared by the benchmark commands, declared once.

Help, flag and default of an option come from its config field
(:mod:`basis_bench.evaluation.config`, read by :func:`~basis_bench.settings.cli_option`); the
BASIS options' help text comes from :class:`~basis_bench.estimators.BasisOptions`' field
metadata, so none is written twice. Commands write ``name: SomeOpt = DEFAULTS.name``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from basis_bench.errors import InputError
from basis_bench.estimators.options import BasisOptions
from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
from basis_bench.settings import cli_option, setting_help

EVALUATE = EvaluateConfig()
SENSITIVITY = SensitivityConfig()
RESULTS_DIR = Path("results/value-estimation")


def _basis(name: str, suffix: str = " Default: the estimator's own.") -> str:
    return setting_help(BasisOptions, name) + suffix


RolloutsOpt = Annotated[Path | None, cli_option(EvaluateConfig, "rollouts")]
CheckpointOpt = Annotated[list[str] | None, cli_option(EvaluateConfig, "checkpoints")]
ReferenceOpt = Annotated[str | None, cli_option(EvaluateConfig, "reference")]
BatchOpt = Annotated[int, cli_option(EvaluateConfig, "batch_size")]
OracleOpt = Annotated[int, cli_option(EvaluateConfig, "oracle_n")]
RefNOpt = Annotated[int, cli_option(EvaluateConfig, "ref_n")]
SeedOpt = Annotated[int, cli_option(EvaluateConfig, "seed")]
GridOpt = Annotated[int, cli_option(EvaluateConfig, "grid_size")]
CalibrationOpt = Annotated[str | None, typer.Option("--calibration", help=_basis("calibration"))]
CriterionOpt = Annotated[str | None, typer.Option("--criterion", help=_basis("criterion"))]
LossOpt = Annotated[str | None, typer.Option("--loss", help=_basis("loss"))]
EpsOpt = Annotated[float | None, typer.Option("--eps", help=_basis("eps"))]
FixedBetaOpt = Annotated[float | None, typer.Option("--fixed-beta", help=_basis("fixed_beta", ""))]
EstimatorOptionOpt = Annotated[list[str] | None, cli_option(EvaluateConfig, "estimator_options")]
ResultsOutOpt = Annotated[
    Path,
    typer.Option(
        "--out", help="Directory for estimates.parquet, summary.csv and the other tables."
    ),
]


def comma_list(text: str) -> tuple[str, ...]:
    """The non-blank items of a comma-separated list, stripped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def split_names(names: str) -> tuple[str, ...]:
    """Comma-separated estimator names; ``all`` (or nothing) is the empty tuple."""
    items = comma_list(names)
    return () if items in ((), ("all",)) else items


def basis_options(
    calibration: str | None = None,
    criterion: str | None = None,
    loss: str | None = None,
    eps: float | None = None,
    fixed_beta: float | None = None,
) -> dict[str, Any]:
    """The BASIS options the user set (unset ones keep each estimator's defaults), checked."""
    opts: dict[str, Any] = {
        k: v
        for k, v in {
            "calibration": calibration,
            "criterion": criterion,
            "loss": loss,
            "eps": eps,
            "fixed_beta": fixed_beta,
        }.items()
        if v is not None
    }
    if calibration == "fixed" and fixed_beta is None:
        raise InputError(
            "--calibration fixed needs --fixed-beta, a positive beta of the grid (or inf)"
        )
    if fixed_beta is not None and calibration != "fixed":
        raise InputError("--fixed-beta only applies with --calibration fixed")
    BasisOptions(**opts)  # one clear error for a bad value, before any data is read
    return opts


def estimator_options(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``ESTIMATOR.KEY=VALUE`` items as ``{estimator: {key: value}}``; values parse as TOML
    (numbers, true/false, [low, high]) and fall back to a bare string."""
    out: dict[str, dict[str, Any]] = {}
    for text in items or ():
        key, sep, raw = text.partition("=")
        name, dot, option = key.strip().partition(".")
        if not sep or not dot or not name or not option:
            raise InputError(f"--option expects ESTIMATOR.KEY=VALUE, got {text!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        if option in out.get(name, {}):  # the later value would silently win
            raise InputError(f"--option {name}.{option} is given twice; give it once")
        out.setdefault(name, {})[option] = value
    return out

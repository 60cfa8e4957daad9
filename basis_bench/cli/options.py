"""How the benchmark commands read the settings whose command-line form is not their type.

Help, flag and default of every option come from its config field
(:mod:`basis_bench.evaluation.config`, made into options by
:func:`~basis_bench.cli.from_config.options_from`); this module holds what the command line
adds: comma-separated names, ``--option ESTIMATOR.KEY=VALUE`` items and the BASIS options
(:class:`~basis_bench.estimators.BasisOptions`' own settings, unset by default).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from basis_bench.cli.from_config import Cli, Group, repeated
from basis_bench.errors import InputError
from basis_bench.estimators.options import BasisOptions

RESULTS_DIR = Path("results/value-estimation")


def comma_list(text: str) -> tuple[str, ...]:
    """The non-blank items of a comma-separated list, stripped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def estimator_names(names: str) -> tuple[str, ...]:
    """``--estimators``: comma-separated names, at least one; ``all`` is the empty tuple.
    Nothing (``--estimators "$UNSET"``) is refused: it ran every estimator, or
    sensitivity's default, in silence."""
    items = comma_list(names)
    if not items:
        raise InputError("--estimators is empty; name estimators (a,b), or all")
    return () if items == ("all",) else items


def basis_options(given: dict[str, Any]) -> dict[str, Any]:
    """The BASIS options the user set (unset ones keep each estimator's defaults), checked
    by :class:`BasisOptions` before any data is read (fixed_beta with calibration fixed)."""
    BasisOptions(**given)
    return given


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


def _path_text(path: Path | None) -> str | None:
    return None if path is None else str(path)


ROLLOUTS = Cli(Path | None, _path_text)
"""``--rollouts DIR``, a path on the command line and text in the config (and run.json)."""
OPTIONS = repeated(estimator_options)
"""``--option ESTIMATOR.KEY=VALUE``, repeated."""


def basis_group(*names: str) -> Group:
    """The BASIS options ``names`` as flags of their own (``--calibration``, ...), unset by
    default, made into the config's ``basis_options``."""
    return Group(BasisOptions, names, basis_options, " Default: the estimator's own.")

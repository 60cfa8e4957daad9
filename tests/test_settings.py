"""The one range checker and declared settings: every bound, NaN, bools, infinities, choices."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from basis_bench.errors import InputError
from basis_bench.settings import (
    check_scalar,
    check_settings,
    setting,
    setting_default,
    setting_flag,
    setting_help,
)


@pytest.mark.parametrize(
    ("value", "kwargs"),
    [
        (math.nan, {}),
        (math.inf, {"min_val": 0}),
        (-math.inf, {}),
        (True, {}),
        ("1", {}),
        (-0.1, {"min_val": 0}),
        (0.0, {"min_val": 0, "include_boundaries": "right"}),
        (1.0, {"max_val": 1, "include_boundaries": "left"}),
        (1.5, {"min_val": 0, "max_val": 1}),
    ],
)
def test_check_scalar_refuses(value: object, kwargs: dict[str, object]) -> None:
    with pytest.raises(InputError, match="x must"):
        check_scalar(value, "x", float, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "kwargs"),
    [
        (0.0, {"min_val": 0}),
        (1, {"min_val": 0, "max_val": 1}),
        (math.inf, {"min_val": 0, "allow_inf": True}),
        (0.5, {"min_val": 0, "max_val": 1, "include_boundaries": "neither"}),
    ],
)
def test_check_scalar_accepts(value: float, kwargs: dict[str, object]) -> None:
    assert check_scalar(value, "x", float, **kwargs) == value  # type: ignore[arg-type]


def test_check_scalar_integers_refuse_floats_and_bools() -> None:
    for bad in (1.0, True, None):
        with pytest.raises(InputError, match="n must be an integer"):
            check_scalar(bad, "n", int, min_val=1)
    with pytest.raises(InputError, match=r"n must be >= 1; got 0"):
        check_scalar(0, "n", int, min_val=1)


@dataclass(frozen=True)
class _Config:
    n: int = setting(4, help="How many.", min_val=1)
    rate: float = setting(0.5, help="A share.", min_val=0, max_val=1, flag="--share")
    mode: str = setting("a", help="Which.", choices=("a", "b"))
    names: tuple[str, ...] = setting(default_factory=tuple, help="Names.")
    cap: float | None = setting(None, help="Optional cap.", min_val=0, optional=True)

    def __post_init__(self) -> None:
        check_settings(self)


def test_declared_settings_are_checked_where_made() -> None:
    assert _Config(n=2, rate=1, mode="b", cap=3.0).n == 2
    for bad, match in (
        ({"n": 0}, "n must be >= 1"),
        ({"n": 2.0}, "n must be an integer"),
        ({"rate": math.nan}, "rate must be a number, not NaN"),
        ({"rate": 1.01}, r"rate must be in \[0, 1\]"),
        ({"mode": "c"}, "mode must be one of a, b"),
        ({"cap": -1.0}, "cap must be >= 0"),
    ):
        with pytest.raises(InputError, match=match):
            _Config(**bad)  # type: ignore[arg-type]


def test_help_flag_and_default_are_read_from_the_field() -> None:
    assert setting_help(_Config, "rate") == "A share."
    assert setting_flag(_Config, "rate") == "--share"
    assert setting_flag(_Config, "n") == "--n"
    assert setting_default(_Config, "names") == ()
    with pytest.raises(KeyError):
        setting_help(_Config, "missing")


def test_numpy_scalars_are_numbers() -> None:
    import numpy as np

    assert check_scalar(np.int64(3), "n", int, min_val=1) == 3
    assert check_scalar(np.float32(0.5), "x", float, max_val=1) == np.float32(0.5)
    with pytest.raises(InputError, match="n must be an integer"):
        check_scalar(np.float64(3.0), "n", int)

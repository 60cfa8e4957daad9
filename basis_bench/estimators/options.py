"""Typed options of the estimators: one frozen dataclass per estimator family.

Each registered estimator names its options class (``register_estimator(name,
options=SomeOptions)``) and receives exactly one instance of it per call, never another
family's options. A field's help text lives in ``field(metadata={"help": ...})`` (the CLI
reads it with :func:`~basis_bench.settings.setting_help`); ``__post_init__`` refuses a value
the estimator cannot use (a NaN, a negative eps, an unknown variant; ranges through
:func:`~basis_bench.settings.check_scalar`), so a bad option fails where it is given, not
deep in a kernel.

Configs carry ``{estimator: {key: value}}``; :func:`options_from_mapping` turns one such
mapping into the dataclass, and an unknown key is an InputError that names the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from basis_bench.errors import InputError
from basis_bench.settings import Boundaries, check_scalar

CALIBRATIONS = ("current", "previous", "fixed")
CRITERIA = ("initial", "refined")
LOSSES = ("squared", "log")
VARIANTS = ("unb", "vop", "rvg")
RATIO_VARS = ("model", "robust")
DEFAULT_THRESHOLD = 4.0  # keep a ratio's departure from 1 only beyond ~2 standard errors
DEFAULT_EPS = 1e-6
DEFAULT_MIN_ACTIVE = 0.5
DEFAULT_PRIOR = 0.5
DEFAULT_GRID_SIZE = 32
# Neighbours of 1024 log-spaced betas over [0.05, 50] differ by 0.7%, far below what a
# calibration can tell apart; a larger grid only costs memory (10^8 was an out-of-memory kill).
MAX_GRID_SIZE = 1024
APO_BETA = 0.5  # A*-PO's beta_1 for the offline value (TRL's A2POConfig default too)
SPO_DECAY = 0.875  # SPO's lower clip of the forgetting factor rho
JS_EPS = 1e-6  # the epsilon in the official JSPO code's lambda denominator

T = TypeVar("T")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _number(cls: str, name: str, value: Any, *, low: float | None = None,
            high: float | None = None, inf_ok: bool = False, low_open: bool = False) -> float:  # fmt: skip
    """``value`` as a float in [low, high] (or (low, high]); NaN, bools and strings refused
    (:func:`~basis_bench.settings.check_scalar`)."""
    bounds: Boundaries = "right" if low_open else "both"
    checked = check_scalar(
        value, f"{cls}.{name}", float, min_val=low, max_val=high, include_boundaries=bounds,
        allow_inf=inf_ok,
    )  # fmt: skip
    return float(checked)


def _choice(cls: str, name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InputError(f"unknown {cls}.{name} {value!r}; choose one of {', '.join(allowed)}")
    return str(value)


def _flag(cls: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{cls}.{name} must be true or false; got {value!r}")
    return value


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalise a field of a frozen dataclass


@dataclass(frozen=True)
class NoOptions:
    """Estimators with no options of their own (vanilla, REINFORCE++, GRPO, RLOO, ...)."""


@dataclass(frozen=True)
class BasisOptions:
    """Options of BASIS and the estimators built on its tilt table (offline, VOP, RVG)."""

    calibration: str = field(
        default="current",
        metadata=_help(
            "How BASIS picks beta: current (on this batch), previous (on the previous batch), "
            "fixed (fixed_beta)."
        ),
    )
    fixed_beta: float | None = field(
        default=None,
        metadata=_help(
            "Beta for calibration fixed: a value of the beta grid (as fixed_beta.csv lists it) or inf."
        ),
    )
    variant: str = field(
        default="unb",
        metadata=_help("Refinement: unb (unbiased BLUE), vop (shrinkage), rvg (ratio average)."),
    )
    criterion: str = field(
        default="initial",
        metadata=_help(
            "In-batch loss BASIS minimises over beta: initial (of the offline V^) or refined (of V~)."
        ),
    )
    loss: str = field(default="squared", metadata=_help("Calibration loss: squared or log."))
    eps: float = field(
        default=DEFAULT_EPS,
        metadata=_help("Active-set threshold of BASIS's refinement: sources with s^2 > eps."),
    )
    min_active: float = field(
        default=DEFAULT_MIN_ACTIVE,
        metadata=_help(
            "Candidate betas at which fewer than this share of the batch is active are skipped."
        ),
    )
    shrink: bool = field(
        default=True,
        metadata=_help(
            "Shrink the calibration ratio towards 1 by its estimated variance (false: the "
            "paper's estimator, basis_paper)."
        ),
    )
    ratio_var: str = field(
        default="robust",
        metadata=_help(
            "Variance of the ratio that shrink uses: model (1/S2, the tilt model's own) or "
            "robust (the larger of that and the leave-one-out sandwich estimate)."
        ),
    )
    threshold: float = field(
        default=DEFAULT_THRESHOLD,
        metadata=_help(
            "Shrinkage threshold c: the ratio keeps (1 - c Var R / (R - 1)^2)_+ of its "
            "departure from 1 (1: plain positive-part James-Stein)."
        ),
    )
    clip: tuple[float, float] | None = field(
        default=None, metadata=_help("Clip the refined values to [low, high] (off by default).")
    )
    refine: bool = field(
        default=True,
        metadata=_help("Refine the offline value (false: the offline V^ at the calibrated beta)."),
    )

    def __post_init__(self) -> None:
        c = "basis"
        _choice(c, "calibration", self.calibration, CALIBRATIONS)
        _choice(c, "variant", self.variant, VARIANTS)
        _choice(c, "criterion", self.criterion, CRITERIA)
        _choice(c, "loss", self.loss, LOSSES)
        _choice(c, "ratio_var", self.ratio_var, RATIO_VARS)
        _set(self, "eps", _number(c, "eps", self.eps, low=0))
        _set(self, "min_active", _number(c, "min_active", self.min_active, low=0, high=1))
        _flag(c, "shrink", self.shrink)
        _set(self, "threshold", _number(c, "threshold", self.threshold, low=0))
        _flag(c, "refine", self.refine)
        if self.fixed_beta is not None:
            beta = _number(c, "fixed_beta", self.fixed_beta, low=0, low_open=True, inf_ok=True)
            _set(self, "fixed_beta", beta)
        if self.calibration == "fixed" and self.fixed_beta is None:
            raise InputError("calibration fixed needs fixed_beta, a positive beta (inf allowed)")
        if self.calibration != "fixed" and self.fixed_beta is not None:
            raise InputError("fixed_beta only applies with calibration fixed")
        if self.clip is not None:
            if isinstance(self.clip, str | bytes) or len(self.clip) != 2:
                raise InputError(f"basis.clip must be a pair [low, high]; got {self.clip!r}")
            lo, hi = (_number(c, "clip", x) for x in self.clip)
            if lo > hi:
                raise InputError(f"basis.clip needs low <= high; got [{lo}, {hi}]")
            _set(self, "clip", (lo, hi))


@dataclass(frozen=True)
class TableOptions:
    """How the reference cache becomes the (K, P) tilt table shared by cache estimators."""

    prior: float = field(
        default=DEFAULT_PRIOR,
        metadata=_help(
            "Smoothing a of the binary reference rate (k + a)/(n + 2a); 0.5 is Jeffreys."
        ),
    )
    grid_size: int = field(
        default=DEFAULT_GRID_SIZE,
        metadata=_help(
            "Finite candidate betas (log-spaced in [0.05, 50], at most 1024); beta = inf is "
            "always added."
        ),
    )

    def __post_init__(self) -> None:
        _set(self, "prior", _number("table", "prior", self.prior, low=0))
        check_scalar(self.grid_size, "table.grid_size", int, min_val=1)
        check_scalar(self.grid_size, "table.grid_size", int, max_val=MAX_GRID_SIZE)


@dataclass(frozen=True)
class JamesSteinOptions:
    """Options of the James-Stein shrinkage of RLOO (Zeng et al. 2025)."""

    eps: float = field(
        default=JS_EPS, metadata=_help("Epsilon in the shrinkage weight's denominator.")
    )

    def __post_init__(self) -> None:
        _set(self, "eps", _number("james_stein", "eps", self.eps, low=0))


@dataclass(frozen=True)
class ApoOptions:
    """Options of A*-PO's offline soft value (Brantley et al. 2025)."""

    beta: float = field(
        default=APO_BETA,
        metadata=_help(
            "KL coefficient of the soft value beta log E_ref[e^{r/beta}] (inf allowed)."
        ),
    )

    def __post_init__(self) -> None:
        _set(self, "beta", _number("apo", "beta", self.beta, low=0, low_open=True, inf_ok=True))


@dataclass(frozen=True)
class SpoOptions:
    """Options of SPO's per-prompt Beta tracker (Xu & Ding 2025)."""

    decay: float = field(
        default=SPO_DECAY, metadata=_help("Forgetting factor per sighting of a prompt, in (0, 1].")
    )
    prior: float = field(
        default=DEFAULT_PRIOR, metadata=_help("Smoothing a of the cache rate (k + a)/(n + 2a).")
    )
    weight: float | None = field(
        default=None, metadata=_help("Prior count N0; default 1/(1 - decay).")
    )

    def __post_init__(self) -> None:
        _set(self, "decay", _number("spo", "decay", self.decay, low=0, high=1, low_open=True))
        _set(self, "prior", _number("spo", "prior", self.prior, low=0))
        if self.weight is not None:
            _set(self, "weight", _number("spo", "weight", self.weight, low=0, low_open=True))
        elif self.decay == 1:
            raise InputError("spo.decay = 1 never forgets; give the prior weight explicitly")


def field_names(cls: type) -> tuple[str, ...]:
    """The option names of an options dataclass, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


def options_from_mapping(
    cls: type[T], values: Mapping[str, Any], what: str, base: T | None = None
) -> T:
    """``cls`` from ``{key: value}`` (over ``base``'s values when given), validated.

    An unknown key is an InputError naming ``what`` and the valid keys.
    """
    names = field_names(cls)
    unknown = sorted(set(values) - set(names))
    if unknown:
        valid = ", ".join(names) if names else "(none: it takes no options)"
        raise InputError(f"unknown option(s) {', '.join(unknown)} for {what}; valid: {valid}")
    if base is None:
        return cls(**dict(values))
    return dataclasses.replace(base, **dict(values))  # type: ignore[type-var]


def as_dict(options: Any) -> dict[str, Any]:
    """The options as a plain ``{key: value}`` mapping (for run.json and configs)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}

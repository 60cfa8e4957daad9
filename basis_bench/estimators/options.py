"""Typed options of the estimators: one frozen dataclass per estimator family.

Each registered estimator names its options class (``register_estimator(name,
options=SomeOptions)``) and receives exactly one instance of it per call, never another
family's options. Every field is a :func:`~basis_bench.settings.setting`, like every other config's: its help
(the CLI reads it), range and choices in one declaration; ``__post_init__`` refuses a value
the estimator cannot use (a NaN, a negative eps, an unknown variant:
:func:`~basis_bench.settings.check_settings`), so a bad option fails where it is given, not
deep in a kernel.

Configs carry ``{estimator: {key: value}}``; :func:`options_from_mapping` turns one such
mapping into the dataclass, and an unknown key is an InputError that names the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from basis_bench.errors import InputError
from basis_bench.settings import Boundaries, check_scalar, check_settings, setting

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


# Settings that estimators' options share with each other and with the commands' configs,
# and the batch shape a command gives its estimators (n, G, R), declared once: each holder's
# field calls the factory.
DEFAULT_REF_N = 64  # the paper's n
MAX_SAMPLES = 2**31 - 1  # a sample index is Int32


def ref_n_setting(*, fitted: bool = False, was: Sequence[str] = ()) -> Any:
    """n, the reference samples per prompt of the offline cache: what simulate writes,
    training samples, evaluate and sensitivity read (``fitted``: unset until the data sets
    it; ``was``: the holder's old names of it)."""
    text = (
        "Reference samples per prompt in the offline cache (n) of BASIS and the other "
        "estimators that use one."
    )
    if not fitted:
        return setting(DEFAULT_REF_N, min_val=1, max_val=MAX_SAMPLES, was=was, help=text)
    return setting(
        None,
        optional=True,
        min_val=1,
        max_val=MAX_SAMPLES,
        was=was,
        help=f"{text} Unset: {DEFAULT_REF_N}, or every sample the reference has where it has "
        "fewer.",
    )


def group_size_setting() -> Any:
    """G, the rollouts per prompt of group estimators: training's and evaluate's."""
    return setting(
        8,
        min_val=1,
        help="Rollouts per prompt (G) for group estimators such as GRPO and RLOO (2 at least "
        "when one of them runs); single-rollout ones take 1.",
    )


def rollouts_per_step_setting(*, replay: bool = False) -> Any:
    """R, the rollouts a step: training's (16), and the step replay's equal budget
    (``replay``: evaluate's, unset by default: a per-visit budget)."""
    text = "Rollouts a step, R: an estimator that takes G rollouts per prompt visits R/G prompts."
    if not replay:
        return setting(16, min_val=1, help=text)
    return setting(
        None,
        min_val=1,
        optional=True,
        help=f"Step replay: {text[0].lower()}{text[1:]} Every estimator spends the same R (the "
        "paper's equal budget: 64 x 8 or 512 x 1). Unset: every estimator visits --batch-size "
        "prompts a step (per visit).",
    )


def eps_setting(note: str = "") -> Any:
    """BASIS's active-set threshold: :class:`BasisOptions`' ``eps`` and the one sensitivity
    holds while another knob varies (``note``: the holder's word on it)."""
    return setting(
        DEFAULT_EPS,
        min_val=0,
        help=f"Active-set threshold of BASIS's refinement: sources with s^2 > eps.{note}",
    )


def prior_setting() -> Any:
    """The smoothing of the reference cache's rate: the tilt table's and SPO's ``prior``."""
    return setting(
        DEFAULT_PRIOR,
        min_val=0,
        help="Smoothing a of the binary reference rate (k + a)/(n + 2a); 0.5 is Jeffreys.",
    )


def grid_size_setting() -> Any:
    """The tilt table's candidate betas: :class:`TableOptions`', evaluate's, sensitivity's."""
    return setting(
        DEFAULT_GRID_SIZE,
        min_val=1,
        max_val=MAX_GRID_SIZE,
        help="Finite candidate betas (log-spaced in [0.05, 50], at most 1024); beta = inf is "
        "always added.",
    )


def checked_options(options: Any, family: str) -> None:
    """Check every option against its declared range or choices (the message names
    ``family.option``) and store numbers as floats where the field is a float."""
    check_settings(options, lambda name: f"{family}.{name}")
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if "float" in str(f.type) and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(options, f.name, float(value))  # a frozen dataclass


def number_list(
    value: Any,
    label: str,
    wanted: str,
    *,
    length: int | None = None,
    min_val: float | None = None,
    max_val: float | None = None,
    include_boundaries: Boundaries = "both",
) -> tuple[float, ...]:
    """``value``, a list of numbers (``length`` of them, else at least one), as floats, each
    within the bounds (:func:`~basis_bench.settings.check_scalar`'s); else an InputError
    saying that ``label`` must be ``wanted``."""
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise InputError(f"{label} must be {wanted}; got {value!r}")
    items = list(value)
    if length is not None and len(items) != length:
        raise InputError(f"{label} must be {wanted}; got {value!r}")
    if not items:
        raise InputError(f"{label} must not be empty")
    bounds: dict[str, Any] = {"min_val": min_val, "max_val": max_val}
    bounds["include_boundaries"] = include_boundaries
    return tuple(float(check_scalar(v, label, float, **bounds)) for v in items)


@dataclass(frozen=True)
class NoOptions:
    """Estimators with no options of their own (vanilla, REINFORCE++, GRPO, RLOO, ...)."""


@dataclass(frozen=True)
class BasisOptions:
    """Options of BASIS and the estimators built on its tilt table (offline, VOP, RVG)."""

    calibration: str = setting(
        "current",
        choices=CALIBRATIONS,
        help="How BASIS picks beta: current (on this batch), previous (on the previous batch), "
        "fixed (fixed_beta).",
    )
    fixed_beta: float | None = setting(
        None,
        min_val=0,
        include_boundaries="right",
        allow_inf=True,
        optional=True,
        help="Beta for calibration fixed: a value of the beta grid (as fixed_beta.csv lists it) "
        "or inf.",
    )
    variant: str = setting(
        "unb",
        choices=VARIANTS,
        help="Refinement: unb (unbiased BLUE), vop (shrinkage), rvg (ratio average).",
    )
    criterion: str = setting(
        "initial",
        choices=CRITERIA,
        help="In-batch loss BASIS minimises over beta: initial (of the offline V^) or refined "
        "(of V~).",
    )
    loss: str = setting("squared", choices=LOSSES, help="Calibration loss: squared or log.")
    eps: float = eps_setting()
    min_active: float = setting(
        DEFAULT_MIN_ACTIVE,
        min_val=0,
        max_val=1,
        help="Candidate betas at which fewer than this share of the batch is active are skipped.",
    )
    shrink: bool = setting(
        True,
        help="Shrink the calibration ratio towards 1 by its estimated variance (false: the "
        "paper's estimator, basis_paper).",
    )
    ratio_var: str = setting(
        "robust",
        choices=RATIO_VARS,
        help="Variance of the ratio that shrink uses: model (1/S2, the tilt model's own) or "
        "robust (the larger of that and the leave-one-out sandwich estimate).",
    )
    threshold: float = setting(
        DEFAULT_THRESHOLD,
        min_val=0,
        help="Shrinkage threshold c: the ratio keeps (1 - c Var R / (R - 1)^2)_+ of its "
        "departure from 1 (1: plain positive-part James-Stein).",
    )
    clip: tuple[float, float] | None = setting(
        None, help="Clip the refined values to [low, high] (off by default)."
    )
    refine: bool = setting(
        True, help="Refine the offline value (false: the offline V^ at the calibrated beta)."
    )

    def __post_init__(self) -> None:
        checked_options(self, "basis")
        if self.calibration == "fixed" and self.fixed_beta is None:
            raise InputError("calibration fixed needs fixed_beta, a positive beta (inf allowed)")
        if self.calibration != "fixed" and self.fixed_beta is not None:
            raise InputError("fixed_beta only applies with calibration fixed")
        if self.clip is not None:
            lo, hi = number_list(self.clip, "basis.clip", "a pair [low, high]", length=2)
            if lo > hi:
                raise InputError(f"basis.clip needs low <= high; got [{lo}, {hi}]")
            object.__setattr__(self, "clip", (lo, hi))


@dataclass(frozen=True)
class TableOptions:
    """How the reference cache becomes the (K, P) tilt table shared by cache estimators."""

    prior: float = prior_setting()
    grid_size: int = grid_size_setting()

    def __post_init__(self) -> None:
        checked_options(self, "table")


@dataclass(frozen=True)
class JamesSteinOptions:
    """Options of the James-Stein shrinkage of RLOO (Zeng et al. 2025)."""

    eps: float = setting(JS_EPS, min_val=0, help="Epsilon in the shrinkage weight's denominator.")

    def __post_init__(self) -> None:
        checked_options(self, "james_stein")


@dataclass(frozen=True)
class ApoOptions:
    """Options of A*-PO's offline soft value (Brantley et al. 2025)."""

    beta: float = setting(
        APO_BETA,
        min_val=0,
        include_boundaries="right",
        allow_inf=True,
        help="KL coefficient of the soft value beta log E_ref[e^{r/beta}] (inf allowed).",
    )

    def __post_init__(self) -> None:
        checked_options(self, "apo")


@dataclass(frozen=True)
class SpoOptions:
    """Options of SPO's per-prompt Beta tracker (Xu & Ding 2025)."""

    decay: float = setting(
        SPO_DECAY,
        min_val=0,
        max_val=1,
        include_boundaries="right",
        help="Forgetting factor per sighting of a prompt, in (0, 1].",
    )
    prior: float = prior_setting()
    weight: float | None = setting(
        None,
        min_val=0,
        include_boundaries="right",
        optional=True,
        help="Prior count N0; default 1/(1 - decay).",
    )

    def __post_init__(self) -> None:
        checked_options(self, "spo")
        if self.weight is None and self.decay == 1:
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

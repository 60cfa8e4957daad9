"""The simulator's settings: :class:`SimulationConfig` and the named generative presets.

Light to import (the CLI reads its options here); the model itself, and what ``tau``,
``kappa`` and ``phi`` mean, is in :mod:`basis_bench.rollouts.simulate`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from basis_bench import settings
from basis_bench.errors import InputError
from basis_bench.estimators.options import MAX_SAMPLES, ref_n_setting

REFERENCE_POLICY = "reference"
# The store's policy-name rule (store.check_policy_name), not imported: this module is light.
_STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

# Log-odds shift per training stage: the tilt 1/beta (beta = 3.3, 1.25, 0.67).
DEFAULT_STAGES: dict[str, float] = {"early": 0.3, "middle": 0.8, "late": 1.5}
# (weight, a, b) of the reference-value Beta mixture: hard, medium, easy prompts.
DEFAULT_MIXTURE: tuple[tuple[float, float, float], ...] = (
    (0.35, 0.7, 3.0),
    (0.30, 2.0, 2.0),
    (0.35, 3.0, 0.7),
)


@dataclass(frozen=True)
class Setting:
    """How checkpoints depart from the reference (see the module docstring)."""

    description: str
    tau: float = 0.0  # prompt-level log-odds noise, independent per stage
    kappa: float = 0.0  # log-odds slope change at the late stage (scaled by stage progress)
    phi: float = 0.0  # share of prompts whose drift has the opposite sign
    misspecified: bool = False


SETTINGS: dict[str, Setting] = {
    "tilt": Setting("BASIS's tilt model holds up to small prompt-level noise", tau=0.1),
    "noisy": Setting(
        "misspecified: prompt-level log-odds noise as large as the shift",
        tau=1.0,
        misspecified=True,
    ),
    "sharpen": Setting(
        "misspecified: learning rescales the log-odds (easy easier, hard harder)",
        tau=0.1,
        kappa=0.6,
        misspecified=True,
    ),
    "forget": Setting(
        "misspecified: a quarter of the prompts get worse while the rest improve",
        tau=0.1,
        phi=0.25,
        misspecified=True,
    ),
}


@dataclass(frozen=True)
class SimulationConfig:
    """Everything that determines a simulated dataset; stored in its metadata."""

    n_prompts: int = settings.setting(600, flag="--prompts", help="Number of prompts.", min_val=2)
    ref_n: int = ref_n_setting(was=("reference_n",))
    checkpoint_n: int = settings.setting(
        320,
        help="Samples per prompt for each checkpoint: the oracle (--oracle-n of evaluate) "
        "plus the pool.",
        min_val=1,
        max_val=MAX_SAMPLES,
    )
    setting: str = settings.setting(
        "tilt",
        help="Generative setting: tilt (BASIS's model holds up to small noise), noisy, sharpen "
        "or forget (misspecified; see basis_bench/rollouts/simulate.py).",
        choices=tuple(SETTINGS),
    )
    stages: dict[str, float] = settings.setting(
        default_factory=lambda: dict(DEFAULT_STAGES),
        flag="--stage",
        help="Checkpoint as NAME=LOGODDS_SHIFT; repeat. Default: "
        + " ".join(f"{k}={v}" for k, v in DEFAULT_STAGES.items())
        + ".",
    )
    mixture: tuple[tuple[float, float, float], ...] = settings.setting(
        DEFAULT_MIXTURE,
        help="The reference values' Beta mixture: (weight, a, b) per component, all positive.",
    )
    seed: int = settings.setting(
        0,
        help="Random seed: the same seed writes the same files.",
        min_val=0,
        max_val=settings.MAX_SEED,
    )

    def __post_init__(self) -> None:
        """An InputError for any impossible size, name or mixture."""
        label = functools.partial(settings.setting_label, SimulationConfig)
        settings.check_settings(self, label)
        # the notebook API passes these as given: stages="early" was an AttributeError, a
        # traceback; a mixture of numbers, not of (weight, a, b) triples, a TypeError
        if not isinstance(self.stages, Mapping) or not all(isinstance(k, str) for k in self.stages):
            raise InputError(
                f"{label('stages')} must map checkpoint names to log-odds shifts "
                f"({{'early': 0.5}}); got {type(self.stages).__name__}"
            )
        triples = isinstance(self.mixture, Sequence) and all(
            isinstance(c, Sequence) and not isinstance(c, str) and len(c) == 3 for c in self.mixture
        )
        if not triples or not self.mixture:
            raise InputError(
                f"{label('mixture')} must be (weight, a, b) triples, e.g. ((1.0, 2.0, 2.0),)"
            )
        if not self.stages:
            raise InputError("give at least one checkpoint stage")
        if REFERENCE_POLICY in self.stages:
            raise InputError(f"a checkpoint may not be called {REFERENCE_POLICY!r}")
        for name in self.stages:  # it names a file: '../../x' was written outside --out
            if not _STAGE_NAME.fullmatch(name):
                raise InputError(
                    f"--stage {name!r}: use 1-200 letters, digits, '.', '_' and '-' for a "
                    "checkpoint's name (it names a file)"
                )
        for name, shift in self.stages.items():
            settings.check_scalar(shift, f"the log-odds shift of stage {name!r}", float)
        for component in self.mixture:
            for value in component:
                settings.check_scalar(
                    value, "a mixture weight or Beta parameter", float, min_val=0,
                    include_boundaries="neither",
                )  # fmt: skip

    def generative_setting(self) -> Setting:
        """How the checkpoints depart from the reference (:data:`SETTINGS`)."""
        return SETTINGS[self.setting]


def parse_stages(spec: Sequence[str]) -> dict[str, float]:
    """``["early=0.3", "late=1.5"]`` -> {"early": 0.3, "late": 1.5}."""
    stages: dict[str, float] = {}
    for item in spec:
        name, _, value = item.partition("=")
        try:
            shift = float(value)
        except ValueError:
            shift = float("nan")
        if not name.strip() or not math.isfinite(shift):
            raise InputError(f"stage {item!r} must look like NAME=LOGODDS_SHIFT, e.g. late=1.5")
        if name.strip() in stages:  # the later shift silently won
            raise InputError(f"--stage {name.strip()!r} is given twice; give each checkpoint once")
        stages[name.strip()] = shift
    return stages

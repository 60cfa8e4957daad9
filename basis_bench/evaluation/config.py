"""The settings of the benchmark commands, light to import (the CLI reads its options here).

Each field carries its help, CLI flag and range (:func:`~basis_bench.settings.setting`):
``basis-bench evaluate``/``sensitivity`` read help and flag from the field and the default
from the dataclass, and a config refuses a value out of range where it is made, naming
the setting as the user gave it: the command-line flag, or the argument of the Python API
(:mod:`basis_bench.api`, under :func:`~basis_bench.settings.naming`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators.options import (
    DEFAULT_REF_N,
    eps_setting,
    grid_size_setting,
    group_size_setting,
    ref_n_setting,
    rollouts_per_step_setting,
)
from basis_bench.settings import (
    MAX_SEED,
    check_settings,
    renamed,
    setting,
    setting_given,
    setting_label,
)


def _feature_kinds() -> tuple[str, ...]:
    from basis_bench.rollouts.features import FEATURE_KINDS

    return FEATURE_KINDS


def _rollouts() -> Any:
    return setting(
        None,
        help="Rollouts directory in the store schema (docs/schema.md). Default: the real "
        "SmolLM2 dataset shipped in basis_bench/data/default (see its CARD.md).",
    )


def _checkpoints() -> Any:
    return setting(
        (),
        flag="--checkpoint",
        help="Checkpoint policy to evaluate; repeat for several. Default: every policy except "
        "the reference.",
    )


def _reference() -> Any:
    return setting(
        None,
        help="Reference policy whose first --ref-n samples form BASIS's cache. Default: the "
        "'reference_policy' in the files' metadata, else the policy named 'reference'.",
    )


DEFAULT_BATCH = 64  # the paper's B
DEFAULT_ORACLE_N = 256  # the paper's oracle samples per prompt
POOL_SAMPLES = 16  # what the default dataset keeps for the pool beside its 256


def _batch_size(fitted: bool = False) -> Any:
    """B; ``fitted``: unset until :meth:`EvaluateConfig.fit` sets it from the data."""
    text = "Prompts per batch draw (B; leave-one-out needs 2 at least)."
    if not fitted:
        return setting(DEFAULT_BATCH, help=text, min_val=2)
    return setting(
        None,
        min_val=2,
        optional=True,
        help=f"{text} Default: {DEFAULT_BATCH}, or every prompt of a checkpoint with fewer; the "
        "step replay's per-visit prompts a step default to the training run's rate "
        "(training.json's prompts_per_step / train_prompts of the prompts). run.json has the B "
        "used.",
    )


def _oracle_n(fitted: bool = False) -> Any:
    """The oracle's N; ``fitted``: unset until :meth:`EvaluateConfig.fit` sets it."""
    text = (
        "A checkpoint's first N samples per prompt (by sample_idx) form the held-out oracle "
        "value (2 at least: its noise estimate needs a variance)."
    )
    if not fitted:
        return setting(DEFAULT_ORACLE_N, help=text, min_val=2)
    return setting(
        None,
        min_val=2,
        optional=True,
        help=f"{text} Default: {DEFAULT_ORACLE_N}, or all but a pool of {POOL_SAMPLES} where a "
        f"checkpoint has fewer than {DEFAULT_ORACLE_N + POOL_SAMPLES} samples of a prompt "
        "(run.json has the N used).",
    )


def _seed() -> Any:
    return setting(
        0, help="Random seed: the same seed writes the same files.", min_val=0, max_val=MAX_SEED
    )


def _basis_options() -> Any:
    return setting(
        default_factory=dict,
        help="BASIS options given to every BASIS-type estimator ({key: value}; the CLI sets "
        "them with --calibration, --criterion, --loss, --eps, --fixed-beta).",
    )


def _estimator_options() -> Any:
    return setting(
        default_factory=dict,
        flag="--option",
        help="One estimator's option as ESTIMATOR.KEY=VALUE (e.g. apo.beta=1.0, "
        "james_stein.eps=1e-4, basis_vop.shrink=true); repeat. Overrides the BASIS options "
        "above.",
    )


def _check_flags(config: Any) -> None:
    """Refuse a value out of range, naming the setting as the user gave it (its command-line
    flag, or its argument name in the Python API: :func:`~basis_bench.settings.naming`)."""
    cls = type(config)
    check_settings(config, lambda name: setting_label(cls, name))


@dataclass(frozen=True)
class EvaluateConfig:
    """Options of ``basis-bench evaluate``."""

    rollouts: str | None = _rollouts()
    checkpoints: tuple[str, ...] = _checkpoints()
    reference: str | None = _reference()
    estimators: tuple[str, ...] = setting(
        (),
        help="Comma-separated registered estimator names (plug-ins included), or 'all'.",
    )  # empty = every registered estimator
    batch_size: int | None = _batch_size(fitted=True)
    repeats: int = setting(1000, help="Batch draws (repeats) per checkpoint.", min_val=1)
    group_size: int = group_size_setting()
    oracle_n: int | None = _oracle_n(fitted=True)
    ref_n: int = ref_n_setting(fitted=True)
    seed: int = _seed()
    grid_size: int = grid_size_setting()
    basis_options: dict[str, Any] = _basis_options()
    estimator_options: dict[str, dict[str, Any]] = _estimator_options()
    write_estimates: bool = setting(
        True,
        flag="--estimates/--no-estimates",
        help="Write the per-estimate rows (estimates.parquet); the tables are written either way.",
    )
    trajectory: bool = setting(
        True,
        flag="--trajectory/--no-trajectory",
        help="Also replay every estimator over the checkpoints in training order, state "
        "carried across steps (trajectory.csv).",
    )
    trajectory_epochs: int = setting(
        1, help="Epochs over the prompts per checkpoint in the trajectory replay.", min_val=1
    )
    trajectory_blend: bool = setting(
        False,
        flag="--trajectory-blend/--no-trajectory-blend",
        help="In the trajectory replay, move from each checkpoint to the next over its "
        "epochs (each rollout from the next checkpoint with probability epoch/epochs) "
        "instead of jumping; the oracle is the same mixture. Needs --trajectory-epochs >= 2.",
    )
    trajectory_schedule: str = setting(
        "auto",
        choices=("auto", "steps", "epochs"),
        help="How the trajectory replay schedules visits. steps: as the training run did, each "
        "checkpoint at the step it was saved at (the dataset's training.json), each prompt's "
        "value moving in log-odds between them, oracle and pool cross-fitted, draws without "
        "replacement (docs/method.md). epochs: --trajectory-epochs visits of every prompt per "
        "checkpoint from a pool after the first --oracle-n samples, with replacement (the "
        "replay before issue 31). auto: steps when training.json gives every checkpoint a step and no epoch option (--trajectory-epochs, --trajectory-blend) is set.",
    )
    rollouts_per_step: int | None = rollouts_per_step_setting(replay=True)
    folds: int = setting(
        2,
        min_val=2,
        help="Step replay: folds of each checkpoint's samples; a repeat draws from one fold and "
        "is scored against the mean of the others, the fold rotating across repeats.",
    )
    standing_steps: int = setting(
        0,
        min_val=0,
        help="Step replay: steps the last checkpoint stands after its own (a standing policy; "
        "what a dataset with one checkpoint replays).",
    )
    gradient_budgets: str = setting(
        "16,32,64,128,256",
        help="Gradient benchmark (datasets with score sketches, oracle --store-scores): the "
        "rollouts a step R at which every estimator's policy gradient is measured, one step "
        "replay each; comma-separated (docs/method.md, 'Gradient quality').",
    )
    features: str = setting(
        "auto",
        choices=_feature_kinds,
        help="Prompt features phi(x) for basis_context in the trajectory replay: stored (the "
        "'features' column of prompts.parquet, e.g. a model's hidden states), plain (answer "
        "sign and digits, operators, MATH level and subject), text (hashed word n-grams), "
        "none (the fitted lag alone), auto (stored when the column exists, else plain).",
    )

    def __post_init__(self) -> None:
        _check_flags(self)
        _ = self.budgets
        if not self.trajectory:  # their values went unused, silently
            names = (*EPOCH_ONLY, *STEP_ONLY, "features", "trajectory_schedule")
            _refuse_unused(self, names, "the trajectory replay", ("trajectory", False))
        elif self.trajectory_schedule != "auto":
            self.check_schedule(self.trajectory_schedule)

    @property
    def budgets(self) -> list[int]:
        """:attr:`gradient_budgets` as distinct rollouts-per-step values, in increasing order."""
        try:
            values = sorted({int(v) for v in self.gradient_budgets.split(",") if v.strip()})
        except ValueError:
            values = [0]
        if not values or values[0] < 1:
            raise InputError(
                f"{named('gradient_budgets')} must be positive integers separated by commas, "
                f"e.g. 16,64,256; got {self.gradient_budgets!r}"
            )
        return values

    def fit(self, prompts: int, samples: int, reference: int) -> EvaluateConfig:
        """The config with the data-derived defaults set, for data whose smallest checkpoint
        has ``prompts`` prompts and ``samples`` samples of its thinnest prompt, and whose
        reference has at most ``reference`` samples a prompt: B = 64 or every prompt, the
        oracle 256 samples or all but a pool of 16 (the shipped default data's split,
        256 + 16; 112 + 16 on the dense trajectory's 128), the cache 64 samples or all."""
        batch = self.batch_size or max(2, min(DEFAULT_BATCH, prompts))
        oracle = self.oracle_n or max(2, min(DEFAULT_ORACLE_N, samples - POOL_SAMPLES))
        ref_n = self.ref_n or max(1, min(DEFAULT_REF_N, reference))
        return replace(self, batch_size=batch, oracle_n=oracle, ref_n=ref_n)

    @property
    def cache_n(self) -> int:
        """The cache's samples per prompt (n), once :meth:`fit` has set them."""
        return _fitted(self.ref_n, "ref_n")

    @property
    def batch(self) -> int:
        """B, once :meth:`fit` has set it."""
        return _fitted(self.batch_size, "batch_size")

    @property
    def oracle(self) -> int:
        """The oracle's samples per prompt, once :meth:`fit` has set them."""
        return _fitted(self.oracle_n, "oracle_n")

    def epoch_options_set(self) -> bool:
        """Whether an option of the epoch schedule only is set (``auto`` then means epochs)."""
        return bool(_changed(self, EPOCH_ONLY))

    def check_schedule(self, schedule: str) -> None:
        """Refuse options that ``schedule`` (what ``auto`` resolved to) would not use."""
        if schedule == "epochs":
            _refuse_unused(self, STEP_ONLY, "the step schedule", ("trajectory_schedule", "epochs"))
        else:
            _refuse_unused(self, EPOCH_ONLY, "the epoch schedule", ("trajectory_schedule", "steps"))


def _fitted(value: int | None, name: str) -> int:
    if value is None:
        raise RuntimeError(f"EvaluateConfig.{name} is left to the data: call fit() first")
    return value


def _owner(name: str) -> type:
    """The config that declares setting ``name`` (evaluate's, else sensitivity's)."""
    return EvaluateConfig if name in {f.name for f in fields(EvaluateConfig)} else SensitivityConfig


def named(name: str) -> str:
    """How an error names the benchmark's setting ``name``: ``--batch-size`` on the command
    line, ``batch_size`` in the Python API (:func:`~basis_bench.settings.setting_label`)."""
    return setting_label(_owner(name), name)


def given(name: str, value: Any) -> str:
    """How the user gives ``value`` to setting ``name`` (``--no-trajectory`` or
    ``trajectory=False``), for an error's advice."""
    return setting_given(_owner(name), name, value)


EPOCH_ONLY = ("trajectory_epochs", "trajectory_blend")
STEP_ONLY = ("rollouts_per_step", "folds", "standing_steps")


def _changed(config: EvaluateConfig, names: tuple[str, ...]) -> list[str]:
    """The settings of ``names`` whose values differ from their defaults (as errors name them)."""
    defaults = {f.name: f.default for f in fields(config)}
    return [
        setting_label(EvaluateConfig, name)
        for name in names
        if getattr(config, name) != defaults[name]
    ]


def _refuse_unused(
    config: EvaluateConfig, names: tuple[str, ...], where: str, turned_off: tuple[str, Any]
) -> None:
    """Options set for a part of the run that is off (by ``turned_off``: a setting and its
    value) went unused, silently: refuse them."""
    unused = _changed(config, names)
    off = setting_given(EvaluateConfig, *turned_off)
    if unused:
        verb, them = ("apply", "them") if len(unused) > 1 else ("applies", "it")
        raise InputError(
            f"{', '.join(unused)} {verb} only to {where}, which {off} turns off (the value "
            f"would go unused); drop {them} or {off}"
        )


DEFAULT_VALUES: dict[str, tuple[float, ...]] = {
    "eps": (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
    "ref_n": (8, 16, 32, 64),
    "batch_size": (16, 32, 64, 128, 256),
    "grid_size": (8, 16, 32, 64),
}


@dataclass(frozen=True)
class SensitivityConfig:
    """Options of ``basis-bench sensitivity``; the defaults are Fig. 5's."""

    rollouts: str | None = _rollouts()
    checkpoints: tuple[str, ...] = _checkpoints()
    reference: str | None = _reference()
    estimators: tuple[str, ...] = setting(
        ("basis",), help="Comma-separated single-rollout estimators to sweep."
    )
    parameters: tuple[str, ...] = setting(
        tuple(DEFAULT_VALUES),
        help=f"Knobs to vary one at a time: any of {','.join(DEFAULT_VALUES)}.",
    )
    batch_size: int = _batch_size()
    repeats: int = setting(200, help="Batch draws per setting and checkpoint.", min_val=1)
    oracle_n: int = _oracle_n()
    ref_n: int = ref_n_setting(fitted=True)
    eps: float = eps_setting(" Its value while another knob varies.")
    grid_size: int = grid_size_setting()
    seed: int = _seed()
    basis_options: dict[str, Any] = _basis_options()
    estimator_options: dict[str, dict[str, Any]] = _estimator_options()

    def __post_init__(self) -> None:
        if "n" in self.parameters:  # the knob's name before it was the setting's
            renamed("--parameters n", "--parameters ref_n")
            knobs = tuple("ref_n" if p == "n" else p for p in self.parameters)
            object.__setattr__(self, "parameters", knobs)  # a frozen dataclass
        _check_flags(self)

"""Training settings: :class:`TrainConfig`, TOML files with ``extends``, ``--set`` overrides.

:func:`make_config` is the one way in: it coerces every value to its field's type and
:meth:`TrainConfig.check` refuses settings that are wrong on their own (an unknown choice,
a count below 1, a float that is not finite or out of its range). What depends on the
estimator (its group size, its options) is checked when the run is set up.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.rollouts.prompts import DEFAULT_INSTRUCTION

ADVANTAGE_NORMS = ("none", "group_std", "batch_std", "batch_whiten")
BACKENDS = ("hf", "vllm")
AUTOCASTS = ("none", "bfloat16", "float16")


@dataclass
class TrainConfig:
    """Every setting of a run. TOML files set these keys (flat); ``--set key=value`` overrides.

    0 or "" means "not set" where TOML has no null: ``train_limit``/``eval_limit`` 0 = all
    prompts, ``eval_max_new_tokens`` 0 = ``max_new_tokens``, ``vllm_max_model_len`` 0 = the
    model's, ``system_prompt`` "" = the chat template's own system message.
    """

    # run
    run_dir: str = "runs/train"
    seed: int = 0
    steps: int = 20
    # policy (the reference is the same checkpoint, frozen)
    model: str = "smollm2-135m"
    device: str = "auto"
    cpu_threads: int = 0  # torch threads (0: torch's default)
    dtype: str = "float32"  # parameter dtype; keep float32 master weights for small updates
    autocast: str = "none"  # none | bfloat16 | float16: forward-pass precision
    gradient_checkpointing: bool = False
    backend: str = "hf"  # sampling backend: hf | vllm
    sample_batch_size: int = 64  # hf: sequences per generate call
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_len: int = 0
    # data
    train_prompts: str = "arithmetic:n=128,digits=1,steps=1,ops=+-,seed=0"  # of 200 distinct
    train_limit: int = 0
    eval_prompts: str = "arithmetic:n=64,digits=1,steps=1,ops=+-,seed=1"
    eval_limit: int = 0
    instruction: str = DEFAULT_INSTRUCTION
    system_prompt: str = ""
    answer_format: str = "any"  # any | boxed | number (see basis_bench.rollouts.rewards)
    verify_timeout: float = 5.0
    reward_workers: int = 0  # processes grading responses (0: in this process)
    # rollouts
    rollouts_per_step: int = 16
    group_size: int = 8  # G for group estimators; single-rollout ones always sample 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    # reference cache (only for estimators that use it)
    ref_samples: int = 64
    cache_dir: str = "runs/cache"
    # advantage estimation
    estimator: str = "basis"
    estimator_options: dict[str, Any] = field(default_factory=dict)
    advantage_norm: str = "none"  # none | group_std | batch_std | batch_whiten
    # loss
    loss: str = "gpg"  # a registered policy loss: gpg | grpo | gspo (basis_bench.train.losses)
    loss_agg: str = "token_mean"  # token_mean | seq_mean (gspo is always per sequence)
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 16
    # optimiser
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # evaluation and checkpoints
    eval_every: int = 5
    eval_max_new_tokens: int = 0
    checkpoint_every: int = 10

    def check(self) -> None:
        """Settings that are wrong on their own (the estimator's needs are checked in setup)."""
        from basis_bench.rollouts.rewards import ANSWER_FORMATS
        from basis_bench.train.losses import AGGREGATIONS, POLICY_LOSSES

        choices: dict[str, Sequence[str]] = {
            "loss": tuple(POLICY_LOSSES),
            "loss_agg": AGGREGATIONS,
            "advantage_norm": ADVANTAGE_NORMS,
            "backend": BACKENDS,
            "autocast": AUTOCASTS,
            "answer_format": ANSWER_FORMATS,
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise InputError(
                    f"{key} must be one of {tuple(allowed)}, got {getattr(self, key)!r}"
                )
        for key in POSITIVE_INTS:
            if getattr(self, key) < 1:
                raise InputError(f"{key} must be at least 1, got {getattr(self, key)}")
        for key in NONNEGATIVE_INTS:
            if getattr(self, key) < 0:
                raise InputError(f"{key} must be >= 0, got {getattr(self, key)}")
        for key, (low, high, text) in FLOAT_RANGES.items():
            value = getattr(self, key)
            if not (math.isfinite(value) and low(value) and high(value)):
                raise InputError(f"{key} must be a finite number {text}, got {value!r}")


POSITIVE_INTS = (
    "steps",
    "rollouts_per_step",
    "group_size",
    "max_new_tokens",
    "ref_samples",
    "epochs",
    "minibatches",
    "micro_batch_size",
    "sample_batch_size",
)
NONNEGATIVE_INTS = (
    "train_limit",
    "eval_limit",
    "eval_every",
    "checkpoint_every",
    "eval_max_new_tokens",
    "vllm_max_model_len",
    "reward_workers",
    "cpu_threads",
)


def _positive(x: float) -> bool:
    return x > 0


def _nonnegative(x: float) -> bool:
    return x >= 0


def _any(x: float) -> bool:
    return True


def _at_most_one(x: float) -> bool:
    return x <= 1


def _below_one(x: float) -> bool:
    return x < 1


# Every float field: (lower test, upper test, the range in words). A test checks that no
# float field is missing, so a new one cannot skip validation.
FLOAT_RANGES: dict[
    str, tuple[typing.Callable[[float], bool], typing.Callable[[float], bool], str]
] = {
    "vllm_gpu_memory_utilization": (_positive, _at_most_one, "in (0, 1]"),
    "verify_timeout": (_positive, _any, "> 0"),
    "temperature": (_positive, _any, "> 0"),
    "top_p": (_positive, _at_most_one, "in (0, 1]"),
    "clip_low": (_nonnegative, _below_one, "in [0, 1)"),
    "clip_high": (_nonnegative, _any, ">= 0"),
    "kl_coef": (_nonnegative, _any, ">= 0"),
    "lr": (_positive, _any, "> 0"),
    "weight_decay": (_nonnegative, _any, ">= 0"),
    "max_grad_norm": (_positive, _any, "> 0"),
}


def _coerce(key: str, value: Any) -> Any:
    """``value`` as the type of config field ``key`` (ints widen to floats); else InputError."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    if key not in fields:
        raise InputError(f"unknown config key {key!r}; known keys: {', '.join(fields)}")
    kind = typing.get_type_hints(TrainConfig)[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    expected = dict if typing.get_origin(kind) is dict else kind
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InputError(f"config key {key!r} must be {expected.__name__}, got {value!r}")
    return value


def read_config_file(path: str | os.PathLike[str], _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Keys of a TOML config; ``extends = "base.toml"`` (relative to the file) is read first.
    A file that extends itself, directly or through others, is an :class:`InputError`."""
    path = Path(path)
    if not path.is_file():
        where = f" (extended by {_chain[-1]})" if _chain else ""
        raise InputError(f"config file {str(path)!r} does not exist{where}")
    if path.resolve() in _chain:
        loop = " -> ".join(str(p) for p in (*_chain, path.resolve()))
        raise InputError(f"config files extend each other in a loop: {loop}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte offset {err.start})") from err
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: not valid TOML ({err})") from err
    base = data.pop("extends", None)
    if base is not None and not isinstance(base, str):
        raise InputError(f"{path}: extends must be a file name, got {base!r}")
    merged = read_config_file(path.parent / base, (*_chain, path.resolve())) if base else {}
    return {**merged, **data}


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (``lr=3e-6``, ``loss="grpo"`` or bare ``loss=grpo``).

    ``estimator_options.NAME=value`` sets one estimator option.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--set expects key=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word: a string
    return key.strip(), value


def make_config(
    values: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> TrainConfig:
    """A checked :class:`TrainConfig` from file values plus ``key=value`` overrides."""
    settings = dict(values or {})
    options = dict(_coerce("estimator_options", settings.get("estimator_options", {})))
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("estimator_options."):
            options[key.partition(".")[2]] = value
        else:
            settings[key] = value
            if key == "estimator_options":
                options = dict(_coerce(key, value))
    settings["estimator_options"] = options
    config = TrainConfig(**{k: _coerce(k, v) for k, v in settings.items()})
    config.check()
    return config


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The settings as plain data (config.json, trainer state)."""
    return dataclasses.asdict(config)

"""Training settings: :class:`TrainConfig`, TOML files with ``extends``, ``--set`` overrides.

:func:`make_config` is the one way in: it coerces every value to its field's type, and the
config refuses, where it is made, settings that are wrong on their own (an unknown choice,
a count below 1, a float that is not finite or out of its range: each field declares its
range with :func:`~basis_bench.settings.setting`). What depends on the estimator (its group
size, its options) is checked when the run is set up.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators.normalise import ADVANTAGE_NORMS
from basis_bench.estimators.options import (
    group_size_setting,
    ref_n_setting,
    rollouts_per_step_setting,
)
from basis_bench.guards.folders import regular_file
from basis_bench.rollouts.generation import Generation
from basis_bench.rollouts.grading import Grading
from basis_bench.rollouts.prompt_source import PromptSource
from basis_bench.rollouts.sampling.base import MIN_TEMPERATURE
from basis_bench.rollouts.templates import DEFAULT_INSTRUCTION
from basis_bench.settings import (
    MAX_SEED,
    check_settings,
    current_name,
    flat,
    flat_keys,
    made,
    renamed_keys,
    section,
    setting,
)

AUTOCASTS = ("none", "bfloat16", "float16")
# Settings that only observe a run (the value probe, the trackers), never change its rollouts
# or weights: a run may be resumed, extended or compared with its arm's other seeds under
# other values of these.
OBSERVATIONAL_KEYS = frozenset({"probe_every", "probe_prompts", "probe_samples", "report_to"})


def _policy_losses() -> tuple[str, ...]:
    """The registered policy losses, read when a config is checked (plug-ins register late)."""
    from basis_bench.train.losses import POLICY_LOSSES

    return POLICY_LOSSES.names()


def _loss_help() -> str:
    names = _policy_losses()
    listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    return f"A registered policy loss: {listed} (basis_bench.train.losses)."


def _aggregations() -> tuple[str, ...]:
    from basis_bench.train.losses import AGGREGATIONS

    return tuple(AGGREGATIONS)


def _reporters() -> tuple[str, ...]:
    from basis_bench.train.tracking import REPORTERS

    return REPORTERS


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run. TOML files set these keys (flat); ``--set key=value`` overrides.

    Its sections (``generation``, ``grading``, ``train``: the training prompts) are given by
    their settings' keys, flat like the rest (:func:`~basis_bench.settings.section`).

    0 or "" means "not set" where TOML has no null: ``train_limit``/``heldout_limit`` 0 = all
    prompts, ``heldout_max_new_tokens`` 0 = ``max_new_tokens``, ``kv_cache_gib`` 0 = the
    engine's default KV cache, ``vllm_max_model_len`` 0 = the model's, ``system_prompt``
    "" = the chat template's own system message.
    """

    # run
    run_dir: str = setting(
        "runs/train", help="Directory of the run: config, log, rollouts, checkpoints."
    )
    seed: int = setting(
        0,
        help="Random seed of prompts, sampling and the model's initial RNG.",
        min_val=0,
        max_val=MAX_SEED,
    )
    steps: int = setting(20, help="Training steps (one batch of rollouts each).", min_val=1)
    # the policy and its sampling (the reference is the same checkpoint, frozen): the
    # section's keys, three by training's own names
    generation: Generation = section(
        Generation,
        defaults={
            "model": "smollm2-135m",
            "dtype": "float32",
            "instruction": DEFAULT_INSTRUCTION,
            "max_new_tokens": 64,
            "gpu_memory_utilization": 0.3,
        },
        keys={
            "batch_size": "sample_batch_size",
            "max_model_len": "vllm_max_model_len",
            "gpu_memory_utilization": "vllm_gpu_memory_utilization",
        },
        omit=("tensor_parallel_size",),
    )
    cpu_threads: int = setting(0, help="torch threads (0: torch's default).", min_val=0)
    autocast: str = setting(
        "none", help="Forward-pass precision: none, bfloat16 or float16.", choices=AUTOCASTS
    )
    gradient_checkpointing: bool = setting(
        False, help="Recompute activations in the backward pass (less memory, more time)."
    )
    # the training prompts, the section the oracle reads its prompts by (flat keys
    # train_prompts, train_limit); the default draws 128 of 200 distinct sums and differences
    train: PromptSource = section(
        PromptSource,
        defaults={"prompts": "arithmetic:n=128,digits=1,steps=1,ops=+-,seed=0"},
        keys={"prompts": "train_prompts", "limit": "train_limit"},
        omit=("levels",),
    )
    heldout_prompts: str = setting(
        "arithmetic:n=64,digits=1,steps=1,ops=+-,seed=1",
        was=("eval_prompts",),
        help="Held-out prompts for the greedy evaluation (prompts shared with the training "
        "set are dropped).",
    )
    heldout_limit: int = setting(
        0,
        help="Keep the first N held-out prompts that are not training prompts (0: all).",
        min_val=0,
        was=("eval_limit",),
    )
    # grading
    grading: Grading = section(Grading)
    # rollouts
    rollouts_per_step: int = rollouts_per_step_setting()
    group_size: int = group_size_setting()
    # reference cache (only for estimators that use it)
    ref_n: int = ref_n_setting(was=("ref_samples",))
    cache_dir: str = setting(
        "runs/cache", help="Directory of reference caches, reused across runs."
    )
    # advantage estimation
    estimator: str = setting("basis", help="A registered estimator: the baseline of the loss.")
    estimator_options: dict[str, Any] = setting(
        default_factory=dict,
        help="The estimator's options ({key: value}; --set estimator_options.NAME=value sets one).",
    )
    advantage_norm: str = setting(
        "none",
        help="Advantage normalisation: none, group_std, batch_std or batch_whiten.",
        choices=ADVANTAGE_NORMS,
    )
    # loss
    loss: str = setting(
        "gpg",
        help=_loss_help,
        choices=_policy_losses,
    )
    loss_agg: str = setting(
        "token_mean",
        help="How the loss averages tokens: token_mean or seq_mean (gspo is always per sequence).",
        choices=_aggregations,
    )
    clip_low: float = setting(
        0.2,
        help="Lower clip range of the ratio (1 - clip_low).",
        min_val=0,
        max_val=1,
        include_boundaries="left",
    )
    clip_high: float = setting(
        0.2, help="Upper clip range of the ratio (1 + clip_high).", min_val=0
    )
    kl_coef: float = setting(
        0.0, help="Weight of the KL term to the reference (0: none).", min_val=0
    )
    epochs: int = setting(1, help="Passes over a step's rollouts.", min_val=1)
    minibatches: int = setting(1, help="Optimizer updates per epoch.", min_val=1)
    micro_batch_size: int = setting(
        16, help="Sequences per forward/backward pass (gradient accumulation).", min_val=1
    )
    # optimiser
    lr: float = setting(1e-5, help="AdamW learning rate.", min_val=0, include_boundaries="neither")
    weight_decay: float = setting(0.0, help="AdamW weight decay.", min_val=0)
    max_grad_norm: float = setting(
        1.0, help="Gradient norm clip.", min_val=0, include_boundaries="neither"
    )
    # held-out accuracy and checkpoints
    heldout_every: int = setting(
        5,
        was=("eval_every",),
        help="Held-out accuracy (greedy) every N steps, and after the last (0: never).",
        min_val=0,
    )
    heldout_max_new_tokens: int = setting(
        0,
        was=("eval_max_new_tokens",),
        help="Tokens per held-out response (0: max_new_tokens).",
        min_val=0,
    )
    checkpoint_every: int = setting(
        10, help="Checkpoint every N steps, and after the last (0: never).", min_val=0
    )
    # value probe (observational: OBSERVATIONAL_KEYS)
    probe_every: int = setting(
        0,
        help="Value probe every N steps, at step 0 and after the last (0: never): the "
        "estimator's baselines against Monte Carlo values on a fixed set of training prompts "
        "(basis_bench.train.probe); it changes nothing of training.",
        min_val=0,
    )
    probe_prompts: int = setting(
        8, help="Training prompts in the probe set (drawn once by a fixed seed).", min_val=1
    )
    probe_samples: int = setting(
        16,
        help="Responses per probe prompt, K: the estimator's own G' give its baselines, the "
        "other K - G' (at least 2) the Monte Carlo value.",
        min_val=3,
    )
    report_to: tuple[str, ...] = setting(
        ("none",),
        help="Experiment trackers that get every log record (TRL's name): a list of "
        "tensorboard, wandb, trackio, or none (basis_bench.train.tracking).",
        choices=_reporters,
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.generation.temperature < MIN_TEMPERATURE:  # 0 is greedy: no distribution
            raise InputError(
                f"temperature must be at least {MIN_TEMPERATURE:g} in training: the loss "
                f"scores the samples at that temperature; got {self.generation.temperature:g}"
            )
        for name in ("run_dir", "cache_dir"):  # "" was the current folder, claimed as a run
            if not getattr(self, name).strip():
                raise InputError(f"{name} is empty; give a folder (. for the current one)")


def check_probe(config: TrainConfig, group: int, n_train: int) -> None:
    """The probe's settings against the run's G' and training set (before models load)."""
    if not config.probe_every:
        return
    if config.probe_samples - group < 2:
        raise InputError(
            f"probe_samples = {config.probe_samples} leaves {config.probe_samples - group} "
            f"Monte Carlo samples after the estimator's {group} per prompt; the probe needs at "
            f"least 2: set probe_samples >= {group + 2}"
        )
    if config.probe_prompts > n_train:
        raise InputError(
            f"probe_prompts = {config.probe_prompts} exceeds the {n_train} training prompts"
        )


def _coerce(key: str, value: Any) -> Any:
    """``value`` as the type of config key ``key`` (ints widen to floats); else InputError."""
    keys = flat_keys(TrainConfig)
    if key not in keys:
        raise InputError(f"unknown config key {key!r}; known keys: {', '.join(keys)}")
    kind = typing.get_type_hints(keys[key].owner)[keys[key].field]
    if typing.get_origin(kind) is tuple:  # a list of names; one string may list them, a,b
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            raise InputError(f"config key {key!r} must be a list of names, got {value!r}")
        return tuple(i.strip() for i in items if i.strip())
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
    if not regular_file(path).is_file():
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
    """A checked :class:`TrainConfig` from file values plus ``key=value`` overrides (a
    setting's old name is taken for its current one, with a notice)."""
    settings = renamed_keys(TrainConfig, values or {})
    options = dict(_coerce("estimator_options", settings.get("estimator_options", {})))
    given: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        key = current_name(TrainConfig, key)
        if key in given:  # the later value would silently win
            raise InputError(f"--set {key} is given twice; give it once")
        given.add(key)
        if key.startswith("estimator_options."):
            options[key.partition(".")[2]] = value
        else:
            settings[key] = value
            if key == "estimator_options":
                options = dict(_coerce(key, value))
    settings["estimator_options"] = options
    return made(TrainConfig, {k: _coerce(k, v) for k, v in settings.items()})


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The settings as plain data by their keys, the sections' flat (config.json, trainer
    state)."""
    return flat(config)

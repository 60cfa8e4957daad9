"""A reward function given by import path (``--reward module:function``), called as TRL calls
one: ``f(prompts, completions, **columns) -> list[float]``.

TRL's signature: ``prompts`` and ``completions`` are one entry per completion (each prompt
repeated once per sample); for a chat prompt the prompt is its list of messages and the
completion ``[{"role": "assistant", "content": text}]``, for a plain-text prompt both are
text. Every other column of the prompt's row comes as a keyword argument, a list with one
entry per completion (``answer``, ``solution``, a verl row's ``reward_model`` ...), with
``completion_ids`` (the sampled token ids) and TRL's ``trainer_state`` (None here),
``log_extra`` and ``log_metric`` (ignored here). A reward must be a finite number: the
cache has no place for TRL's None (unscorable).

``module`` is a dotted module importable from the current folder, or a ``.py`` file's path.

Layer: below :mod:`.rewards` (which checks a spec) and :mod:`.scoring` (which calls it on a run).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from basis_bench.errors import InputError

MATH_VERIFY = "math-verify"
"""The default grading (:mod:`basis_bench.rollouts.rewards`), by its name in ``--reward``."""
STATUS = "reward_function"
"""The ``verify_status`` of a rollout a reward function scored."""

RewardFn = Callable[..., Sequence[Any]]


def _import(module: str, spec: str) -> Any:
    """The module ``module`` (a dotted name importable here or from the current folder, or a
    ``.py`` file's path)."""
    if module.endswith(".py"):
        path = Path(module)
        if not path.is_file():
            raise InputError(f"reward function {spec}: no file {module}")
        loader = importlib.util.spec_from_file_location(path.stem, path)
        if loader is None or loader.loader is None:
            raise InputError(f"reward function {spec}: {module} cannot be imported")
        found = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(found)
        return found
    if os.getcwd() not in sys.path:  # the console script's path does not hold the user's folder
        sys.path.append(os.getcwd())
    return importlib.import_module(module)


@functools.lru_cache(maxsize=8)
def load_reward_function(spec: str) -> RewardFn:
    """The callable ``module:function`` names (imported once per process)."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise InputError(
            f"reward function {spec!r}: give {MATH_VERIFY} or module:function "
            "(e.g. my_rewards:accuracy)"
        )
    try:
        found = _import(module, spec)
    except InputError:
        raise
    except Exception as err:  # the user's module failed to import: its own error, one line
        raise InputError(
            f"reward function {spec}: importing {module} failed ({type(err).__name__}: {err})"
        ) from err
    fn = getattr(found, name, None)
    if not callable(fn):
        raise InputError(f"reward function {spec}: {module} has no function {name!r}")
    return fn


def check_reward_function(spec: str) -> None:
    """Refuse, before any model loads, a ``--reward`` that names no importable function."""
    if spec != MATH_VERIFY:
        load_reward_function(spec)


def _ignore(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` and ``log_metric``: nothing is logged here."""


def call_reward_function(
    spec: str,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Any] | None,
    columns: Mapping[str, Sequence[Any]],
) -> np.ndarray:
    """The rewards (float64, one per completion) of ``spec``'s function, checked: one finite
    number per completion, else an :class:`InputError` that says which."""
    fn = load_reward_function(spec)
    kwargs: dict[str, Any] = {
        k: list(v) for k, v in columns.items() if k not in ("prompts", "completions")
    }
    if completion_ids is not None:
        kwargs["completion_ids"] = [list(map(int, ids)) for ids in completion_ids]
    kwargs.update(trainer_state=None, log_extra=_ignore, log_metric=_ignore)
    try:
        out = fn(prompts=list(prompts), completions=list(completions), **kwargs)
    except Exception as err:
        raise InputError(f"reward function {spec} raised {type(err).__name__}: {err}") from err
    try:
        values = list(out)
    except TypeError:
        raise InputError(
            f"reward function {spec} returned {type(out).__name__}, not a list of numbers"
        ) from None
    if len(values) != len(prompts):
        raise InputError(
            f"reward function {spec} returned {len(values)} rewards for {len(prompts)} completions"
        )
    rewards = np.empty(len(values))
    for i, value in enumerate(values):
        ok = isinstance(value, int | float | np.number)  # a bool counts, as in TRL
        if not ok or not math.isfinite(float(value)):
            raise InputError(
                f"reward function {spec} returned {value!r} for completion {i}; the reference cache "
                "needs a finite number for every rollout"
            )
        rewards[i] = float(value)
    return rewards

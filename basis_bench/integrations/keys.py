"""BASIS inside trainers: the pieces the verl, OpenRLHF and TRL adapters share.

The adapters key the reference cache by prompt content, never by a trainer's per-step ids:
the key of a prompt is a hash of its text (for a chat prompt, the last user message), so the
cache built from a rollouts directory and a training batch meet on the same key however the
batch is ordered, sharded or re-sampled. The trainers themselves are imported only by
:mod:`basis_bench.integrations.verl_plugin` and inside the functions of
:mod:`basis_bench.integrations.openrlhf` and :mod:`basis_bench.integrations.trl`; this
module needs none of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import (
    BasisOptions,
    StepEstimator,
    StepOutput,
    get,
    make_step_estimator,
)
from basis_bench.estimators.basis import BASIS_NAME
from basis_bench.estimators.options import DEFAULT_PRIOR, field_names
from basis_bench.integrations.prompt_check import CachedPrompts
from basis_bench.rollouts.features import prompt_features
from basis_bench.rollouts.store import load_prompts, load_rollouts, reward_matrix
from basis_bench.rollouts.trainer_prompts import (
    PROMPT_COLUMN,
    TrainerPrompt,
    prompt_key,
    prompt_text,
)
from basis_bench.settings import check_scalar

DEFAULT_PROMPT_FORMAT = "{problem}"
# A format string over the prompts table's columns, or a function of a row (a dict of them)
# for a trainer that renders further (OpenRLHF's input template or chat template).
PromptFormat = str | Callable[[Mapping[str, Any]], str]
RENDERED = "_rendered"  # keyed_prompts' column of each prompt's rendering


def keyed_prompts(rollouts: str | os.PathLike[str], prompt_format: PromptFormat) -> pl.DataFrame:
    """The rollouts directory's prompts table with a ``key`` column, :func:`prompt_key` of each
    prompt rendered with ``prompt_format``, and the rendering (``RENDERED``)."""
    prompts = load_prompts(rollouts)
    if prompts is None:
        raise InputError(
            f"{rollouts}: no prompts.parquet; the adapters key the cache by prompt text"
        )
    rows = prompts.iter_rows(named=True)
    if callable(prompt_format):
        texts = [prompt_format(row) for row in rows]
    else:
        try:
            texts = [prompt_format.format(**row) for row in rows]
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
            raise InputError(
                f"prompt_format {prompt_format!r} does not render the prompts table "
                f"(columns: {', '.join(prompts.columns)}): {exc}"
            ) from None
    return prompts.with_columns(
        pl.Series("key", [prompt_key(t) for t in texts]), pl.Series(RENDERED, texts)
    )


def keyed_features(
    rollouts: str | os.PathLike[str], keys: Sequence[str], prompt_format: PromptFormat, kind: str
) -> np.ndarray | None:
    """Features (P, d) of the prompts with ``keys``, in that order (:func:`prompt_features`'s
    ``kind``; ``auto``: the stored column, e.g. the reference model's prompt hidden states
    from ``oracle --store-features hidden``, else plain); prompts sharing a key share its first row."""
    prompts = (
        keyed_prompts(rollouts, prompt_format)
        .drop(RENDERED)
        .unique("key", keep="first", maintain_order=True)
    )
    return prompt_features(prompts.with_columns(pl.col("key").alias("prompt_id")), keys, kind)


def keyed_reference_cache(
    rollouts: str | os.PathLike[str],
    reference: str = "reference",
    ref_n: int | None = None,
    prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT,
) -> tuple[list[str], np.ndarray]:
    """Prompt keys and the (P, n) reference rewards of a rollouts directory.

    Each prompt of ``prompts.parquet`` is rendered with ``prompt_format`` (fields: the
    prompts table's columns, e.g. ``{problem}``) into the text the trainer's batch will carry
    and keyed by :func:`prompt_key`. Prompts whose texts coincide share a key and pool their
    samples. ``ref_n`` keeps each prompt's first n samples by sample_idx. NaN pads rows.
    """
    keys = keyed_prompts(rollouts, prompt_format).select("prompt_id", "key")
    df = load_rollouts(rollouts, policies=[reference])
    if df.height == 0:
        raise InputError(f"{rollouts}: no rollouts of the reference policy {reference!r}")
    if ref_n is not None:
        check_scalar(ref_n, "ref_n", int, min_val=1)
        df = df.filter(pl.col("sample_idx").rank("ordinal").over("prompt_id") <= ref_n)
    df = df.join(keys, on="prompt_id", how="inner")
    if df.height == 0:
        raise InputError(f"{rollouts}: no reference rollout belongs to a prompt of prompts.parquet")
    # Re-index samples within each key so prompts with the same text stack their samples.
    df = df.with_columns(
        pl.col("key").alias("prompt_id"),
        (pl.col("prompt_id").rank("dense") * 1_000_000 + pl.col("sample_idx"))
        .cast(pl.Int64)
        .alias("sample_idx"),
    )
    ids = sorted(df["prompt_id"].unique().to_list())
    return ids, reward_matrix(df, reference, ids)


def cached_prompts(rollouts: str | os.PathLike[str], prompt_format: PromptFormat) -> CachedPrompts:
    """The prompts of a rollouts directory as the plug-ins check training data against them:
    each key's text and, where the cache holds a trainer's own prompts
    (``oracle --prompts trainer:PATH``), the conversations sampled under each key."""
    prompts = keyed_prompts(rollouts, prompt_format)
    by_key = dict(zip(prompts["key"], prompts[RENDERED], strict=True))
    if PROMPT_COLUMN not in prompts.columns:
        return CachedPrompts(str(rollouts), by_key)
    talks: dict[str, set[str]] = {}
    for key, raw in zip(prompts["key"], prompts[PROMPT_COLUMN], strict=True):
        if raw is not None:
            talks.setdefault(key, set()).add(TrainerPrompt(raw).shown())
    return CachedPrompts(str(rollouts), by_key, {k: frozenset(v) for k, v in talks.items()})


class CacheStep(StepEstimator):
    """A step estimator on a cache keyed by prompt content that knows the cached prompts
    (``cached``), so a plug-in can check its training data against them when it starts."""

    def __init__(self, step: StepEstimator, cached: CachedPrompts) -> None:
        super().__init__(
            step.estimator, step.options, step.kernel, step.table, step.reward_range, step.lead
        )
        self.cached = cached


def one_rollout_step(step: StepEstimator, prompt_keys: Sequence[str], rewards: Any) -> StepOutput:
    """One step of a single-rollout estimator on a trainer's batch: rewards (B,), one
    completion per prompt key, -> baselines (B,) (the step estimator takes (B, 1))."""
    out = step(list(prompt_keys), rewards[:, None])
    return replace(out, baselines=out.baselines[:, 0])


def basis_from_rollouts(
    rollouts: str | os.PathLike[str],
    reference: str = "reference",
    ref_n: int | None = None,
    prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT,
    estimator: str = "basis",
    **basis_options: Any,
) -> StepEstimator:
    """The step estimator ``estimator`` (BASIS, or another registered single-rollout one such
    as ``basis_memory`` or ``spo_tracker``, whose state is carried across steps) on the cache
    keyed by :func:`prompt_key` (see keyed_reference_cache), a :class:`CacheStep` that knows
    the cached prompts. ``basis_options``: the estimator's
    options, the tilt table's ``prior`` and ``betas``, and for one that conditions on the
    prompt (``basis_context``) the ``features`` kind (default ``auto``, see keyed_features)."""
    ids, ref = keyed_reference_cache(rollouts, reference, ref_n, prompt_format)
    if get(estimator).group:
        raise InputError(f"{estimator!r} is a group estimator; the plug-ins take one rollout")
    prior = basis_options.pop("prior", DEFAULT_PRIOR)
    betas = basis_options.pop("betas", None)
    kind = basis_options.pop("features", "auto")
    features = (
        keyed_features(rollouts, ids, prompt_format, kind) if get(estimator).uses_features else None
    )
    step = make_step_estimator(
        estimator,
        basis_options,
        prompt_ids=ids,
        ref_rewards=ref,
        betas=betas,
        prior=prior,
        features=features,
    )
    return CacheStep(step, cached_prompts(rollouts, prompt_format))


CACHE_OPTIONS = ("rollouts", "reference", "ref_n", "prompt_format", "estimator")
# Every field of BasisOptions, plus the tilt table's prior: the list is written once, there.
BASIS_OPTIONS = (*field_names(BasisOptions), "prior")


def plugin_settings(block: Mapping[str, Any], spelling: str) -> dict[str, Any]:
    """Keyword arguments of :func:`basis_from_rollouts` from a trainer's ``basis`` options,
    checked against the estimator's fields; ``spelling`` writes an option the trainer's way
    in the errors (``"+basis.{}=VALUE"`` for verl)."""
    if not block.get("rollouts"):
        raise InputError(
            f"the basis estimator needs its reference cache: add {spelling.format('rollouts')} "
            "(a rollouts directory in basis-bench's schema, with prompts.parquet)"
        )
    estimator = block.get("estimator", BASIS_NAME)
    known = {*CACHE_OPTIONS, *BASIS_OPTIONS}
    if estimator != BASIS_NAME:  # another estimator: its own options
        known = {*CACHE_OPTIONS, *field_names(get(estimator).options_class)}
        if get(estimator).uses_features:
            known.add("features")
    unknown = sorted(set(block) - known)
    if unknown:
        raise InputError(f"unknown basis option(s) {unknown}; known: {sorted(known)}")
    return dict(block)


__all__ = [
    "DEFAULT_PROMPT_FORMAT",
    "CacheStep",
    "PromptFormat",
    "basis_from_rollouts",
    "cached_prompts",
    "keyed_features",
    "keyed_prompts",
    "keyed_reference_cache",
    "one_rollout_step",
    "plugin_settings",
    "prompt_key",
    "prompt_text",
]

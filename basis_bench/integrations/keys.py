"""BASIS inside trainers: the pieces the verl and TRL adapters share.

Both adapters key the reference cache by prompt content, never by a trainer's per-step ids:
the key of a prompt is a hash of its text (for a chat prompt, the last user message), so the
cache built from a rollouts directory and a training batch meet on the same key however the
batch is ordered, sharded or re-sampled. The trainers themselves are imported lazily by
:mod:`basis_bench.integrations.verl` and :mod:`basis_bench.integrations.trl`; this module
needs neither.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Basis, BasisOutput
from basis_bench.rollouts.store import load_prompts, load_rollouts, reward_matrix
from basis_bench.settings import check_scalar

DEFAULT_PROMPT_FORMAT = "{problem}"


def prompt_text(prompt: Any) -> str:
    """The text a prompt is keyed by: a plain string, or a chat's last user message.

    Chat prompts are sequences of {"role", "content"} messages (lists or numpy object
    arrays, as verl and TRL pass them); content given as parts keeps its text parts.
    """
    if isinstance(prompt, str):
        return prompt.strip()
    messages = list(prompt) if isinstance(prompt, Sequence | np.ndarray) else None
    if not messages or not all(isinstance(m, Mapping) for m in messages):
        raise InputError(
            f"a prompt must be a string or a list of chat messages; got {type(prompt).__name__}"
        )
    users = [m for m in messages if m.get("role") == "user"]
    content = (users or messages)[-1].get("content", "")
    if not isinstance(content, str):
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return content.strip()


def prompt_key(prompt: Any) -> str:
    """Stable content key of a prompt: sha256 of :func:`prompt_text` (first 32 hex digits)."""
    return hashlib.sha256(prompt_text(prompt).encode("utf-8")).hexdigest()[:32]


def reference_cache(
    rollouts: str | os.PathLike[str],
    reference: str = "reference",
    ref_n: int | None = None,
    prompt_format: str = DEFAULT_PROMPT_FORMAT,
) -> tuple[list[str], np.ndarray]:
    """Prompt keys and the (P, n) reference rewards of a rollouts directory.

    Each prompt of ``prompts.parquet`` is rendered with ``prompt_format`` (fields: the
    prompts table's columns, e.g. ``{problem}``) into the text the trainer's batch will carry
    and keyed by :func:`prompt_key`. Prompts whose texts coincide share a key and pool their
    samples. ``ref_n`` keeps each prompt's first n samples by sample_idx. NaN pads rows.
    """
    prompts = load_prompts(rollouts)
    if prompts is None:
        raise InputError(
            f"{rollouts}: no prompts.parquet; the adapters key the cache by prompt text"
        )
    try:
        texts = [prompt_format.format(**row) for row in prompts.iter_rows(named=True)]
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(
            f"prompt_format {prompt_format!r} does not render the prompts table "
            f"(columns: {', '.join(prompts.columns)}): {exc}"
        ) from None
    keys = pl.DataFrame({"prompt_id": prompts["prompt_id"], "key": [prompt_key(t) for t in texts]})
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


class StepBasis:
    """Any registered single-rollout estimator, stateful or not, called as :class:`Basis` is:
    ``est(prompt_keys, rewards (B,))`` -> :class:`BasisOutput`; its state (the SPO tracker's,
    ``basis_memory``'s) is carried across calls and saved with ``state_dict``."""

    def __init__(self, step: Any) -> None:
        self.step = step  # estimators.StepEstimator

    def __call__(self, prompt_ids: Sequence[str], rewards: Any) -> BasisOutput:
        out = self.step(list(prompt_ids), rewards[:, None])
        beta = math.nan if out.beta is None else float(out.beta)
        index = -1 if out.beta_index is None else int(out.beta_index)
        return BasisOutput(out.baselines[:, 0], beta, index)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.step.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step.load_state_dict(state)


def basis_from_rollouts(
    rollouts: str | os.PathLike[str],
    reference: str = "reference",
    ref_n: int | None = None,
    prompt_format: str = DEFAULT_PROMPT_FORMAT,
    estimator: str = "basis",
    **basis_options: Any,
) -> Basis | StepBasis:
    """A :class:`~basis_bench.estimators.Basis` keyed by :func:`prompt_key` (see
    reference_cache); with ``estimator`` another registered single-rollout estimator
    (``basis_memory``, ``spo_tracker``) on the same cache, as a :class:`StepBasis`."""
    ids, ref = reference_cache(rollouts, reference, ref_n, prompt_format)
    if estimator == "basis":
        return Basis(ids, ref, **basis_options)
    from basis_bench.estimators import get, make_step_estimator

    if get(estimator).group:
        raise InputError(f"{estimator!r} is a group estimator; the plug-ins take one rollout")
    return StepBasis(make_step_estimator(estimator, basis_options, prompt_ids=ids, ref_rewards=ref))


__all__ = [
    "DEFAULT_PROMPT_FORMAT",
    "StepBasis",
    "basis_from_rollouts",
    "prompt_key",
    "prompt_text",
    "reference_cache",
]

"""The training prompts against the reference cache, checked when a plug-in starts.

A training prompt the cache does not hold would stop training at its first batch, after the
model has loaded and generated, naming only a hash. So the TRL and verl plug-ins check every
prompt of the training data when they start: its key (:func:`~basis_bench.rollouts.trainer_prompts.prompt_key`)
must be cached and, where the cache was built from a trainer's own dataset
(``oracle --prompts trainer:PATH``), its whole conversation (system prompt included) must be
one the cache was sampled on. A mismatch is refused with the training prompt's text beside the
nearest cached one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from basis_bench.errors import InputError
from basis_bench.rollouts.trainer_prompts import TrainerPrompt

SHOWN_CHARS = 400


def plain_prompt(prompt: Any) -> Any:
    """A prompt as plain Python (verl hands numpy arrays of message dicts): a text, or a list
    of ``{"role", "content"}`` dicts."""
    if isinstance(prompt, str):
        return prompt
    return [{"role": m.get("role"), "content": m.get("content")} for m in prompt]


def conversation(prompt: Any) -> str:
    """What a trainer gives the model, before the chat template: the text, or each message as
    ``[role] content``."""
    return TrainerPrompt.of(plain_prompt(prompt)).shown()


@dataclass(frozen=True)
class CachedPrompts:
    """The prompts a reference cache holds, by key: each key's rendered text (what the
    trainer's prompt must key to) and, for a cache built from a trainer's dataset, the
    conversations it was sampled on (else None: only keys can be checked)."""

    where: str
    texts: Mapping[str, str]
    conversations: Mapping[str, frozenset[str]] | None = field(default=None)

    def check(self, prompts: Iterable[Any], what: str) -> int:
        """The number of prompts checked; an :class:`InputError` showing the first training
        prompt that the cache does not hold beside the nearest cached one."""
        from basis_bench.rollouts.trainer_prompts import prompt_key, prompt_text

        missing, first, total = 0, None, 0
        for prompt in prompts:
            total += 1
            key = prompt_key(prompt)
            if key not in self.texts:
                held = False
            elif self.conversations is None or key not in self.conversations:
                held = True
            else:
                held = conversation(prompt) in self.conversations[key]
            if not held:
                missing += 1
                first = first if first is not None else prompt
        if first is None:
            return total
        if self.conversations is not None:
            mine = conversation(first)
            cached = [c for cs in self.conversations.values() for c in cs]
        else:
            mine, cached = prompt_text(first), list(self.texts.values())
        raise InputError(_mismatch(missing, total, what, self.where, mine, cached))


def _mismatch(missing: int, total: int, what: str, where: str, mine: str, cached: list[str]) -> str:
    near = difflib.get_close_matches(mine, cached, n=1, cutoff=0.0)
    nearest = near[0] if near else ""
    at = next(
        (i for i, (a, b) in enumerate(zip(mine, nearest, strict=False)) if a != b),
        min(len(mine), len(nearest)),
    )
    return (
        f"{missing} of the {total} prompts of {what} are not in the reference cache {where}; "
        f"the first beside the nearest cached prompt (they differ from character {at}):\n"
        f"  training: {mine[:SHOWN_CHARS]!r}\n"
        f"  cached:   {nearest[:SHOWN_CHARS]!r}\n"
        "build the cache from the training data itself (basis-bench oracle --prompts "
        "trainer:PATH, docs/integrations.md) or pass the prompt_format that renders it"
    )


def check_parquet_prompts(
    cached: CachedPrompts, files: str | Sequence[str], column: str = "prompt"
) -> int:
    """:meth:`CachedPrompts.check` on the ``column`` of each Parquet file of ``files`` (verl's
    ``data.train_files`` and ``data.prompt_key``); the number of prompts checked."""
    import polars as pl

    checked = 0
    for path in [files] if isinstance(files, str) else list(files):
        try:
            prompts = pl.read_parquet(path, columns=[column])[column].to_list()
        except Exception as err:  # a missing file, another format, no such column
            raise InputError(
                f"{path}: could not read its {column!r} column to check it against the "
                f"reference cache ({type(err).__name__}: {err})"
            ) from err
        checked += cached.check(prompts, str(path))
    return checked

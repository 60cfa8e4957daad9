"""The sampler interface shared by every backend.

A backend implements only :meth:`Sampler._generate`: token ids in, sampled token ids
out. Everything else (prompt building, tokenisation, cutting at the stop token,
decoding, token counts, finish reasons) is here, so the ``hf`` and ``vllm`` backends
differ in the generate call alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.prompts import PromptTemplate, build_prompt

Progress = Callable[[int], None]
"""Called with the number of sequences just finished."""


@dataclass(frozen=True)
class SamplingConfig:
    """``n`` samples per prompt at ``temperature`` with nucleus ``top_p``, at most
    ``max_new_tokens`` each. No top-k, no repetition penalty: samples come from the
    policy's own (temperature-scaled) distribution. ``temperature=0`` is greedy and
    needs ``n=1``.
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.n < 1:
            raise InputError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature == 0 and self.n > 1:
            raise InputError(
                "temperature 0 is greedy decoding: every sample would be the same; use n=1"
            )
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Samples:
    """Sampled responses, prompt-major: row ``p * n + k`` is sample k of prompt p."""

    responses: list[str]
    n_tokens: np.ndarray
    """Generated tokens per response, the stop token included (int32)."""
    finish_reasons: list[str]
    """``stop`` (ended with a stop token) or ``length`` (hit max_new_tokens)."""


class Sampler(ABC):
    """Samples responses from one policy. Subclasses implement :meth:`_generate`."""

    backend: str

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], template: PromptTemplate) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = np.asarray(list(stop_ids), dtype=np.int64)
        self.template = template

    def prompt_token_ids(self, problems: Sequence[str]) -> list[list[int]]:
        """Token ids of each problem's prompt (chat template + instruction)."""
        texts = [build_prompt(self.tokenizer, p, self.template) for p in problems]
        # A chat template writes its own special tokens; plain prompts get the tokenizer's.
        plain = getattr(self.tokenizer, "chat_template", None) is None
        return list(self.tokenizer(texts, add_special_tokens=plain)["input_ids"])

    def sample(
        self,
        problems: Sequence[str],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None = None,
    ) -> Samples:
        """``config.n`` responses to each problem, reproducible for a given ``seed``
        (on the same backend, device and batch size).
        """
        rows = self._generate(self.prompt_token_ids(problems), config, seed, on_progress)
        expected = len(problems) * config.n
        if len(rows) != expected:
            raise RuntimeError(
                f"{self.backend} backend returned {len(rows)} sequences, expected {expected}"
            )
        cut = [self._cut_at_stop(np.asarray(r, dtype=np.int64)) for r in rows]
        lengths = np.fromiter((len(r) for r in cut), dtype=np.int32, count=len(cut))
        ended = np.fromiter(
            (len(r) > 0 and bool(np.isin(r[-1], self.stop_ids)) for r in cut),
            dtype=bool,
            count=len(cut),
        )
        finished = ended | (lengths < config.max_new_tokens)
        return Samples(
            responses=list(self.tokenizer.batch_decode(cut, skip_special_tokens=True)),
            n_tokens=lengths,
            finish_reasons=np.where(finished, "stop", "length").tolist(),
        )

    def _cut_at_stop(self, row: np.ndarray) -> np.ndarray:
        """The row up to and including its first stop token (padding after it dropped)."""
        hits = np.flatnonzero(np.isin(row, self.stop_ids))
        return row[: hits[0] + 1] if hits.size else row

    @abstractmethod
    def _generate(
        self,
        prompt_ids: list[list[int]],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None,
    ) -> Sequence[Sequence[int]]:
        """``config.n`` generated token-id rows per prompt, prompt-major (rows may run on
        with padding after a stop token)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Backend settings recorded in the dataset's metadata."""

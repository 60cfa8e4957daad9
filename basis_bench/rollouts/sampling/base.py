"""The sampler interface shared by every backend.

A backend implements :meth:`Sampler._generate` (token ids in, sampled token ids out) and
says how it starts (:meth:`Sampler.start`, from its own :attr:`Sampler.Settings`) and what
it can do (:class:`Capabilities`). Everything else (prompt building, tokenisation, cutting
at the stop token, decoding, token counts, finish reasons) is here, so the ``hf`` and
``vllm`` backends differ in the generate call alone. Backends are found by name in
:mod:`basis_bench.rollouts.sampling.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.templates import PromptTemplate, model_prompt
from basis_bench.settings import check_scalar

if TYPE_CHECKING:
    from basis_bench.rollouts.models import Checkpoint

Progress = Callable[[int, int], None]
"""Called as sampling advances with (sequences just finished, tokens just generated).
The ``hf`` backend calls it after every decode step, so tokens/s can be shown before
the first sequence finishes; a backend may also call it once per batch."""


class EngineFailed(InputError):
    """A backend that imports and serves the device could not start its engine here (vLLM's
    ``LLM`` raised): ``--backend auto`` falls back to hf from it, a named backend refuses."""


MIN_TEMPERATURE = 1e-5  # vLLM's own floor: below it, sampling is greedy there


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

    def __post_init__(self) -> None:  # made from a Generation's settings, checked there too
        check_scalar(self.n, "n", int, min_val=1)
        check_scalar(self.temperature, "temperature", float, min_val=0)
        check_scalar(self.top_p, "top_p", float, min_val=0, max_val=1, include_boundaries="right")
        check_scalar(self.max_new_tokens, "max_new_tokens", int, min_val=1)
        if 0 < self.temperature < MIN_TEMPERATURE:  # 1e-320: logits / T overflowed to inf
            raise InputError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}; got "
                f"{self.temperature:g}, which overflows the scaled logits"
            )
        if self.temperature == 0 and self.n > 1:
            raise InputError(
                "temperature 0 is greedy decoding: every sample would be the same; use n=1"
            )

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


@dataclass(frozen=True)
class TokenSamples:
    """Sampled responses as token ids, prompt-major like :class:`Samples`."""

    prompt_ids: list[list[int]]
    """Token ids of each problem's prompt (one per problem, not per sample)."""
    response_ids: list[np.ndarray]
    """Each response up to and including its first stop token."""
    finish_reasons: list[str]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do: the oracle and training ask these, never the backend's name."""

    devices: tuple[str, ...]
    """Device kinds it runs on (``cpu``, ``cuda``); whether this installation serves one is
    :meth:`Sampler.check_device`."""
    per_prompt_seeds: bool
    """A prompt's samples depend on the seed and the prompt alone, not on the other prompts
    of the call or on how they are batched (up to float rounding)."""
    hidden_states: bool
    """It gives the prompts' hidden states itself (``--store-features hidden``); otherwise
    transformers computes them before it starts."""
    weight_sync: bool
    """Training: it runs a copy of the model of its own, started from the reference
    checkpoint and given the policy's weights after every update (:meth:`Sampler.load_weights`);
    otherwise it samples the trained model itself (:meth:`Sampler.of_policy`)."""
    cpu_workers: bool
    """On the CPU the oracle runs one single-thread sampling process of it per free core;
    otherwise one process."""


class Sampler(ABC):
    """Samples responses from one policy. Subclasses implement :meth:`_generate`; a backend
    found by name (the registry's) also declares its name, :class:`Capabilities` and
    :attr:`Settings`, and implements :meth:`start`."""

    backend: ClassVar[str]
    """The name ``--backend`` and ``backend = ...`` give it."""
    capabilities: ClassVar[Capabilities]
    Settings: ClassVar[type[Any]]
    """The frozen dataclass of this backend's own settings (batch size, engine memory, ...)."""
    summary: ClassVar[str] = ""
    """A few words for ``--backend``'s help, which lists every registered backend with them."""
    preferred: ClassVar[bool] = False
    """Whether ``auto`` takes it wherever it serves the device (:meth:`check_device`), before
    the fallback (the registry's ``_choose``)."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], template: PromptTemplate) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = np.asarray(list(stop_ids), dtype=np.int64)
        self.template = template

    @classmethod
    def start(
        cls, ckpt: Checkpoint, template: PromptTemplate, device: str, dtype: str, settings: Any
    ) -> Sampler:
        """The sampler of checkpoint ``ckpt`` on ``device`` (``auto``: a GPU if visible) with
        weights in ``dtype`` (``auto``: the device's usual one) and ``settings``, an instance
        of :attr:`Settings`. Every registered backend has it."""
        raise NotImplementedError(f"{cls.__name__} cannot start from a checkpoint")

    @classmethod
    def settings_from(cls, options: Mapping[str, Any]) -> Any:
        """This backend's :attr:`Settings` from a command's or a config's options, matched by
        name (``batch_size``, ``kv_cache_gib``, ...); a field ``options`` lacks keeps its
        default."""
        names = {f.name for f in fields(cls.Settings)}
        return cls.Settings(**{k: v for k, v in options.items() if k in names})

    @classmethod
    def check_device(cls, device: str, in_config: bool = False) -> None:
        """Refuse, before any model loads, a ``device`` this installation of the backend
        cannot run on (an :class:`InputError`; the message quotes training's settings when
        ``in_config``, else the oracle's flags). Every device kind in
        :attr:`Capabilities.devices` passes here; the device itself is checked as it loads."""
        kind = device.partition(":")[0]
        if device != "auto" and kind not in cls.capabilities.devices:
            name = "device" if in_config else "--device"
            raise InputError(
                f"{name} {device}: the {cls.backend} backend runs on "
                f"{' or '.join(cls.capabilities.devices)}"
            )

    @classmethod
    def check_training(cls, device: str) -> None:
        """Refuse, before any model loads, a training run this backend cannot sample for:
        it neither takes weights (:attr:`Capabilities.weight_sync`) nor samples the trained
        model (:meth:`of_policy`), or it cannot serve ``device`` (the resolved one)."""
        live = cls.of_policy.__func__ is not Sampler.of_policy.__func__  # type: ignore[attr-defined]
        if not (cls.capabilities.weight_sync or live):
            raise InputError(
                f'the {cls.backend} backend cannot sample a model being trained; use backend = "hf"'
            )
        cls.check_device(device, in_config=True)

    @classmethod
    def of_policy(
        cls, model: Any, tokenizer: Any, template: PromptTemplate, settings: Any, name: str
    ) -> Sampler:
        """A sampler of the transformers ``model`` being trained (a backend without
        :attr:`Capabilities.weight_sync`)."""
        raise InputError(f"the {cls.backend} backend cannot sample a model being trained")

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Replace the weights it samples from by ``(name, tensor)`` pairs in the checkpoint's
        (Hugging Face) names, e.g. a policy's ``state_dict()`` (a backend with
        :attr:`Capabilities.weight_sync`)."""
        raise InputError(f"the {self.backend} backend cannot take a policy's weights")

    def prompt_token_ids(self, problems: Sequence[Any]) -> list[list[int]]:
        """Token ids of each problem's prompt (chat template + instruction), or of a trainer's
        own prompt rendered as the trainer does (:func:`~basis_bench.rollouts.templates.model_prompt`)."""
        rendered = [model_prompt(self.tokenizer, p, self.template) for p in problems]
        ids: list[list[int]] = [[] for _ in rendered]
        # A chat template writes its own special tokens; plain prompts get the tokenizer's.
        for special in (False, True):
            rows = [i for i, (_, s) in enumerate(rendered) if s == special]
            if rows:
                texts = [rendered[i][0] for i in rows]
                for i, row in zip(
                    rows,
                    self.tokenizer(texts, add_special_tokens=special)["input_ids"],
                    strict=True,
                ):
                    ids[i] = list(row)
        return ids

    def sample_tokens(
        self,
        problems: Sequence[str],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None = None,
    ) -> TokenSamples:
        """``config.n`` responses to each problem as token ids, reproducible for a given
        ``seed`` (on the same backend, device, batch size and thread count). A training loop scores
        these ids; re-tokenising decoded text would not give back the same tokens.
        """
        prompt_ids = self.prompt_token_ids(problems)
        rows = self._generate(prompt_ids, config, seed, on_progress)
        expected = len(problems) * config.n
        if len(rows) != expected:
            raise RuntimeError(
                f"{self.backend} backend returned {len(rows)} sequences, expected {expected}"
            )
        cut = [self._cut_at_stop(np.asarray(r, dtype=np.int64)) for r in rows]
        finish = [
            "stop"
            if (len(r) > 0 and bool(np.isin(r[-1], self.stop_ids)))
            or len(r) < config.max_new_tokens
            else "length"
            for r in cut
        ]
        return TokenSamples(prompt_ids, cut, finish)

    def sample(
        self,
        problems: Sequence[str],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None = None,
    ) -> Samples:
        """``config.n`` responses to each problem, decoded, reproducible for a given ``seed``
        (on the same backend, device, batch size and thread count).
        """
        return self.decode(self.sample_tokens(problems, config, seed, on_progress))

    def decode(self, tokens: TokenSamples) -> Samples:
        """Sampled token ids as text, with their token counts and finish reasons."""
        return Samples(
            responses=list(
                self.tokenizer.batch_decode(tokens.response_ids, skip_special_tokens=True)
            ),
            n_tokens=np.fromiter(
                (len(r) for r in tokens.response_ids),
                dtype=np.int32,
                count=len(tokens.response_ids),
            ),
            finish_reasons=tokens.finish_reasons,
        )

    def score_sketches(
        self, tokens: TokenSamples, config: SamplingConfig, k: int, seed: int
    ) -> np.ndarray:
        """(N, K) sketches (projection of ``k`` pairs, ``seed``) of each sampled response's
        output-layer score under the distribution that sampled it
        (:mod:`basis_bench.rollouts.score_sketch`), rows as in ``tokens``
        (``oracle --store-scores``)."""
        raise InputError(
            f"the {self.backend} backend cannot sketch scores (--store-scores); use --backend hf"
        )

    def prompt_hidden_states(self, problems: Sequence[str]) -> np.ndarray:
        """(P, d) float32: the model's final hidden state at the last token of each problem's
        prompt (chat template + instruction, as sampled): the state the first response
        token is drawn from, the only position that has attended to the whole prompt."""
        return self._hidden_states(self.prompt_token_ids(problems))

    def _hidden_states(self, prompt_ids: list[list[int]]) -> np.ndarray:
        raise InputError(
            f"the {self.backend} backend cannot give the model's hidden states; compute "
            "them with transformers (sampling.hf.transformers_hidden_states)"
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

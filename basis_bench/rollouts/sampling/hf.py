"""The ``hf`` backend: transformers models on CPU or GPU.

Two engines draw from the same distribution:

- ``continuous`` (default): continuous batching over the model's KV cache
  (:mod:`basis_bench.rollouts.sampling.continuous`); a sequence leaves the batch when it
  finishes and a waiting one takes its place, so the cost follows the tokens generated.
- ``generate``: transformers ``generate`` over left-padded prompts, each call padded
  until its longest sequence ends. Kept as the reference the tests and the benchmark
  compare against.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.models import (
    Checkpoint,
    cache_argument,
    hf_format_directory,
    load_model,
    load_tokenizer,
    resolve_device,
    stop_token_ids,
)
from basis_bench.rollouts.sampling.base import (
    Capabilities,
    Progress,
    Sampler,
    SamplingConfig,
    TokenSamples,
)
from basis_bench.rollouts.sampling.continuous import DecodeStats, decode
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE, PromptTemplate

ENGINES = ("continuous", "generate")


@dataclass(frozen=True)
class HFSettings:
    """The ``hf`` backend's settings: sequences decoded together, and the engine."""

    batch_size: int = 64
    engine: str = "continuous"


def plan_calls(n_prompts: int, n: int, batch_size: int) -> list[tuple[range, int]]:
    """Split ``n_prompts x n`` sequences into generate calls of at most ``batch_size``.

    Each call is (prompts, samples per prompt). With ``n >= batch_size`` a call
    holds one prompt and up to ``batch_size`` of its samples; otherwise it holds
    ``batch_size // n`` prompts (left-padded together) with all ``n`` samples each.
    Calls come prompt-major, so their outputs concatenate in sample order.
    """
    if n >= batch_size:
        return [
            (range(p, p + 1), min(batch_size, n - k))
            for p in range(n_prompts)
            for k in range(0, n, batch_size)
        ]
    per_call = batch_size // n
    return [(range(s, min(s + per_call, n_prompts)), n) for s in range(0, n_prompts, per_call)]


HIDDEN_STATE_TOKENS = 512
"""Most tokens (padding included) per forward pass of :func:`last_token_hidden_states`.
Measured on the CPU (SmolLM2-135M, one thread, 67 prompts of 46-224 tokens): 9.9 s at 512,
12.6 s at 2048, 19.4 s at 8192, 19.3 s one prompt at a time; not measured on a GPU."""


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` in batches of similar length (sorted, so little padding), each
    at most ``max_tokens`` once padded to its longest (a longer prompt alone)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def last_token_hidden_states(
    model: Any, prompt_ids: Sequence[Sequence[int]], max_tokens: int = HIDDEN_STATE_TOKENS
) -> np.ndarray:
    """(P, d) float32: the final layer's hidden state (after the model's last norm) at the
    last token of each prompt: the state sampling starts from. Prompts of similar length go
    through the model together (:func:`length_batches`), left-padded, masked, with positions
    counted from each prompt's first token, so a state is the one-prompt pass's up to float
    rounding."""
    import torch

    params = inspect.signature(model.forward).parameters
    last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    states: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for batch in length_batches([len(p) for p in prompt_ids], max_tokens):
            width = max(len(prompt_ids[i]) for i in batch)
            tokens = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                tokens[row, width - len(prompt_ids[i]) :] = torch.tensor(list(prompt_ids[i]))
                mask[row, width - len(prompt_ids[i]) :] = 1
            out = model(
                input_ids=tokens.to(model.device),
                attention_mask=mask.to(model.device),
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(model.device),
                output_hidden_states=True,
                **last_logits,
            )
            last = out.hidden_states[-1][:, -1].float().cpu().numpy()
            states.update(zip(batch, last, strict=True))
    if not states:
        return np.zeros((0, model.config.hidden_size), np.float32)
    return np.stack([states[i] for i in range(len(prompt_ids))])


def transformers_hidden_states(
    ckpt: Checkpoint,
    template: PromptTemplate,
    problems: Sequence[str],
    device: str = "auto",
    dtype: str = "auto",
) -> np.ndarray:
    """:meth:`HFSampler.prompt_hidden_states` of ``ckpt`` loaded with transformers for this
    call alone, then freed (GPU memory included), so that an engine started next (vLLM,
    which claims its share of the GPU's memory at start) finds the memory free again.
    Loaded from :func:`~basis_bench.rollouts.models.hf_format_directory`, the folder vLLM
    reads, with the checkpoint's own tokenizer, as the vllm backend does."""
    import torch

    folder = Checkpoint(ckpt.name, hf_format_directory(ckpt))
    sampler = HFSampler(
        load_model(folder, resolve_device(device), dtype), load_tokenizer(ckpt), template
    )
    try:
        return sampler.prompt_hidden_states(problems)
    finally:
        del sampler
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class HFSampler(Sampler):
    """Batched sampling with transformers.

    ``engine="continuous"``: ``batch_size`` sequences decode together; each prompt runs
    through the model once and its KV is shared by its samples; sample k of prompt p
    draws its randomness from its own stream (seed, p, k), so it does not depend on
    the batch size or on the other prompts beyond float rounding (see
    :func:`~basis_bench.rollouts.sampling.continuous.decode`).

    ``engine="generate"``: ``batch_size`` sequences per ``generate`` call, prompts
    left-padded together, the n samples of a prompt drawn from one shared prompt KV
    cache (see :meth:`_generate_call`), ``torch.manual_seed(seed)`` once per call of
    :meth:`sample`.

    :attr:`last_stats` holds what the last continuous decode computed.
    """

    backend = "hf"
    summary = "transformers; CPU or GPU"

    @classmethod
    def check_device(cls, device: str, in_config: bool = False) -> None:
        """As every backend's, and torch and transformers must import: without the [hf]
        extra a command stops here, in the one line that names it, before the oracle's
        worker processes start (each died on the import, a traceback in the parent)."""
        super().check_device(device, in_config)
        import torch  # noqa: F401
        import transformers  # noqa: F401

    capabilities = Capabilities(
        devices=("cpu", "cuda"),
        per_prompt_seeds=True,  # the continuous engine's streams (seed, p, k); not "generate"'s
        hidden_states=True,
        weight_sync=False,  # training samples the live policy
        cpu_workers=True,
    )
    Settings = HFSettings

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        batch_size: int = 64,
        name: str = "model",
        engine: str = "continuous",
    ) -> None:
        if batch_size < 1:
            raise InputError(f"--batch-size must be at least 1, got {batch_size}")
        if engine not in ENGINES:
            raise InputError(f"hf engine must be one of {ENGINES}, got {engine!r}")
        super().__init__(
            tokenizer, stop_token_ids(tokenizer, model.config, model.generation_config), template
        )
        self.model = model
        self._cache_name = cache_argument(model)
        params = inspect.signature(model.forward).parameters
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.batch_size = batch_size
        self.name = name
        self.engine = engine
        self.last_stats = DecodeStats()

    @classmethod
    def load(
        cls,
        ckpt: Checkpoint,
        device: str = "auto",
        template: PromptTemplate = DEFAULT_TEMPLATE,
        batch_size: int = 64,
        dtype: str = "auto",
        engine: str = "continuous",
    ) -> HFSampler:
        model = load_model(ckpt, resolve_device(device), dtype)
        return cls(model, load_tokenizer(ckpt), template, batch_size, ckpt.name, engine)

    @classmethod
    def start(
        cls, ckpt: Checkpoint, template: PromptTemplate, device: str, dtype: str, settings: Any
    ) -> HFSampler:
        return cls.load(ckpt, device, template, settings.batch_size, dtype, settings.engine)

    @classmethod
    def of_policy(
        cls, model: Any, tokenizer: Any, template: PromptTemplate, settings: Any, name: str
    ) -> HFSampler:
        return cls(model, tokenizer, template, settings.batch_size, name, settings.engine)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": str(self.model.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "batch_size": self.batch_size,
            "engine": self.engine,
        }

    def _hidden_states(self, prompt_ids: list[list[int]]) -> np.ndarray:
        return last_token_hidden_states(self.model, prompt_ids)

    def score_sketches(
        self, tokens: TokenSamples, config: SamplingConfig, k: int, seed: int
    ) -> np.ndarray:
        from basis_bench.rollouts.score_sketch import projection_of, score_sketches

        of = np.repeat(np.arange(len(tokens.prompt_ids)), config.n)
        return score_sketches(
            self.model,
            tokens.prompt_ids,
            tokens.response_ids,
            of,
            config.temperature,
            projection_of(self.model, k, seed),
        )

    def _generate(
        self,
        prompt_ids: list[list[int]],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None,
    ) -> Sequence[Sequence[int]]:
        if self.engine == "continuous":
            self.last_stats = DecodeStats()
            return decode(
                self.model,
                prompt_ids,
                config.n,
                slots=self.batch_size,
                max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                stop_ids=self.stop_ids.tolist(),
                seed=seed,
                cache_arg=self._cache_name,
                last_logits_only=bool(self._last_logits_only),
                on_step=on_progress,
                stats=self.last_stats,
            )
        import torch

        torch.manual_seed(seed)
        rows: list[Sequence[int]] = []
        for prompts, reps in plan_calls(len(prompt_ids), config.n, self.batch_size):
            batch = [prompt_ids[i] for i in prompts]
            out = self._generate_call(batch, reps, config)
            rows.extend(out)
            if on_progress is not None:
                on_progress(len(out), sum(len(self._cut_at_stop(np.asarray(r))) for r in out))
        return rows

    def _generate_call(
        self, batch: list[list[int]], reps: int, config: SamplingConfig
    ) -> list[list[int]]:
        """One ``generate`` over left-padded prompts, ``reps`` samples each.

        Prefix sharing: each prompt (all but its last token) runs through the model
        once and its KV cache is repeated ``reps`` times before sampling starts. The
        samples are those of ``num_return_sequences=reps`` (same RNG draws, equal up to
        float rounding) without recomputing the prompt for every sample.
        """
        import torch
        from transformers import DynamicCache

        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        input_ids, attention = input_ids.to(self.model.device), attention.to(self.model.device)
        sampling: dict[str, Any] = (
            {
                "do_sample": True,
                "temperature": config.temperature,
                "top_p": config.top_p,
                "top_k": 0,
                "min_p": None,
            }
            if config.temperature > 0
            else {"do_sample": False, "temperature": None, "top_p": None}
        )
        shared: dict[str, Any] = {}
        with torch.inference_mode():
            if width > 1:
                cache = DynamicCache()
                self.model(
                    input_ids=input_ids[:, :-1],
                    attention_mask=attention[:, :-1],
                    position_ids=(attention[:, :-1].cumsum(-1) - 1).clamp(min=0),
                    use_cache=True,
                    **{self._cache_name: cache},
                    **self._last_logits_only,
                )
                cache.batch_repeat_interleave(reps)
                shared = {self._cache_name: cache}
            out = self.model.generate(
                input_ids=input_ids.repeat_interleave(reps, dim=0),
                attention_mask=attention.repeat_interleave(reps, dim=0),
                max_new_tokens=config.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.stop_ids.tolist(),
                repetition_penalty=1.0,
                **shared,
                **sampling,
            )
        return out[:, width:].cpu().tolist()

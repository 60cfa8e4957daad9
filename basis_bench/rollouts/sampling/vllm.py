"""The ``vllm`` backend: ``vllm.LLM`` on one or more GPUs, imported lazily.

Prompts go in as token ids built by the shared code, and the engine runs with
``skip_tokenizer_init=True``: vLLM only samples tokens, so tokenisation, stop-token
handling and decoding are byte-for-byte those of the ``hf`` backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.models import Checkpoint, load_tokenizer, stop_token_ids
from basis_bench.rollouts.prompts import DEFAULT_TEMPLATE, PromptTemplate
from basis_bench.rollouts.sampling.base import Progress, Sampler, SamplingConfig


class VLLMSampler(Sampler):
    """``LLM(model, tensor_parallel_size=...)`` + one ``SamplingParams(n, seed, temperature,
    top_p, max_tokens)`` per prompt. Per-prompt seeds come from the call's seed, so a
    prompt's samples do not depend on how the engine batches requests.
    """

    backend = "vllm"

    def __init__(
        self,
        ckpt: Checkpoint,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as err:
            raise InputError(
                "--backend vllm needs vllm, which does not import here "
                f"({err}); install basis-bench[vllm] on a GPU machine, or use --backend hf"
            ) from err
        from transformers import AutoConfig, GenerationConfig

        tokenizer = load_tokenizer(ckpt)
        configs: list[Any] = [AutoConfig.from_pretrained(str(ckpt.directory), **ckpt.hf_kwargs())]
        if ckpt.gguf_file is None and (ckpt.directory / "generation_config.json").is_file():
            configs.append(GenerationConfig.from_pretrained(str(ckpt.directory)))
        super().__init__(tokenizer, stop_token_ids(tokenizer, *configs), template)
        self.tensor_parallel_size = tensor_parallel_size
        self.dtype = dtype
        self.llm = LLM(
            model=str(ckpt.path),
            skip_tokenizer_init=True,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
        }

    def _generate(
        self,
        prompt_ids: list[list[int]],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None,
    ) -> Sequence[Sequence[int]]:
        from vllm import SamplingParams

        seeds = np.random.SeedSequence(seed).generate_state(len(prompt_ids))
        params = [
            SamplingParams(
                n=config.n,
                seed=int(s),
                temperature=config.temperature,
                top_p=config.top_p,
                max_tokens=config.max_new_tokens,
                stop_token_ids=self.stop_ids.tolist(),
                detokenize=False,
            )
            for s in seeds
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False
        )
        rows = [
            list(c.token_ids) for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)
        ]
        if on_progress is not None:
            on_progress(len(rows), sum(len(r) for r in rows))
        return rows

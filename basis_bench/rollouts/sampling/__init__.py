"""Sampling responses from a policy, behind one interface with two backends.

- ``hf``: transformers with continuous batching over the KV cache (or plain ``generate``,
  ``engine="generate"``); CPU or GPU.
- ``vllm``: ``vllm.LLM`` with ``SamplingParams(n, seed, ...)``; GPUs, tensor parallel.

Both share every step except the generate call (see :mod:`basis_bench.rollouts.sampling.base`).
"""

from __future__ import annotations

from basis_bench.errors import InputError
from basis_bench.rollouts.models import Checkpoint
from basis_bench.rollouts.prompts import DEFAULT_TEMPLATE, PromptTemplate
from basis_bench.rollouts.sampling.base import (
    Progress,
    Sampler,
    Samples,
    SamplingConfig,
    TokenSamples,
)

BACKENDS = ("hf", "vllm")

__all__ = [
    "BACKENDS",
    "Progress",
    "Sampler",
    "Samples",
    "SamplingConfig",
    "TokenSamples",
    "make_sampler",
]


def make_sampler(
    backend: str,
    ckpt: Checkpoint,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    device: str = "auto",
    batch_size: int = 64,
    tensor_parallel_size: int = 1,
    dtype: str = "auto",
) -> Sampler:
    """Load ``ckpt`` on the named backend. ``batch_size`` and ``device`` apply to ``hf``;
    ``tensor_parallel_size`` to ``vllm`` (which always runs on the visible GPUs)."""
    if backend == "hf":
        from basis_bench.rollouts.sampling.hf import HFSampler

        return HFSampler.load(ckpt, device, template, batch_size, dtype)
    if backend == "vllm":
        if device == "cpu":
            raise InputError("--backend vllm runs on GPUs; use --backend hf for --device cpu")
        if tensor_parallel_size < 1:
            raise InputError(
                f"--tensor-parallel-size must be at least 1, got {tensor_parallel_size}"
            )
        from basis_bench.rollouts.sampling.vllm import VLLMSampler

        return VLLMSampler(ckpt, template, tensor_parallel_size, dtype)
    raise InputError(f"--backend must be one of {BACKENDS}, got {backend!r}")

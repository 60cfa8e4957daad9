"""The sampling backends by name: ``--backend`` and training's ``backend`` are looked up
here, and ``auto`` is resolved here; everything else asks the chosen class's
:class:`~basis_bench.rollouts.sampling.base.Capabilities`.

A backend is a :class:`~basis_bench.rollouts.sampling.base.Sampler` subclass in a module
of its own, registered once with :func:`register_sampler` (docs/development.md shows one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from basis_bench.errors import InputError
from basis_bench.rollouts.sampling.base import Sampler
from basis_bench.rollouts.sampling.hf import HFSampler
from basis_bench.rollouts.sampling.vllm import VLLMSampler

AUTO = "auto"
"""The backend name that picks one: the first preferred backend that serves the device,
else :data:`FALLBACK`."""
FALLBACK = "hf"

SAMPLERS: dict[str, type[Sampler]] = {}
PREFERRED: list[str] = []
"""Backends ``auto`` tries, in registration order, before :data:`FALLBACK`."""


def register_sampler(sampler: type[Sampler], *, preferred: bool = False) -> type[Sampler]:
    """Register ``sampler`` under its ``backend`` name; ``preferred``: ``auto`` chooses it
    wherever it serves the device (its :meth:`~Sampler.check_device` passes)."""
    missing = [
        name for name in ("backend", "capabilities", "Settings") if not hasattr(sampler, name)
    ]
    if sampler.start.__func__ is Sampler.start.__func__:  # type: ignore[attr-defined]
        missing.append("start")
    if missing:
        raise TypeError(f"{sampler.__name__} does not define {', '.join(missing)}")
    if sampler.backend in (AUTO, *SAMPLERS):
        raise ValueError(f"the sampling backend name {sampler.backend!r} is taken")
    SAMPLERS[sampler.backend] = sampler
    if preferred:
        PREFERRED.append(sampler.backend)
    return sampler


def backend_names() -> tuple[str, ...]:
    """What ``--backend`` and ``backend = ...`` accept: ``auto`` and every registered name."""
    return (AUTO, *SAMPLERS)


def sampler_class(name: str, device: str = "auto") -> type[Sampler]:
    """The backend called ``name``; ``auto``: the first preferred backend that serves
    ``device`` (``auto``: a GPU if visible, else the CPU), else :data:`FALLBACK`."""
    if name == AUTO:
        return _choose(device)
    try:
        return SAMPLERS[name]
    except KeyError:
        raise InputError(
            f"--backend must be one of {', '.join(backend_names())}, got {name!r}"
        ) from None


def _choose(device: str) -> type[Sampler]:
    if PREFERRED and device == "auto":
        from basis_bench.rollouts.models import resolve_device

        device = resolve_device(device)
    for name in PREFERRED:
        try:
            SAMPLERS[name].check_device(device)
        except InputError:  # not installed here, or built for another device
            continue
        return SAMPLERS[name]
    return SAMPLERS[FALLBACK]


@contextmanager
def temporary() -> Iterator[dict[str, type[Sampler]]]:
    """Registrations made inside the block are removed when it ends (for tests)."""
    saved, preferred = dict(SAMPLERS), list(PREFERRED)
    try:
        yield SAMPLERS
    finally:
        SAMPLERS.clear()
        SAMPLERS.update(saved)
        PREFERRED[:] = preferred


register_sampler(HFSampler)
register_sampler(VLLMSampler, preferred=True)

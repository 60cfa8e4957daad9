"""The sampling backends by name: ``--backend`` and training's ``backend`` are looked up
here, and ``auto`` is resolved here, falling back to hf in one warning line where a
preferred backend cannot run or its engine does not start; everything else asks the chosen
class's :class:`~basis_bench.rollouts.sampling.base.Capabilities`.

A backend is a :class:`~basis_bench.rollouts.sampling.base.Sampler` subclass in a module
of its own, registered once with :func:`register_sampler` (docs/development.md shows one).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from basis_bench.errors import InputError, OneLineWarning, first_line
from basis_bench.rollouts.sampling.base import EngineFailed, Sampler
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
        return _choose(device)[0]
    try:
        return SAMPLERS[name]
    except KeyError:
        raise InputError(
            f"--backend must be one of {', '.join(backend_names())}, got {name!r}"
        ) from None


class BackendFallback(OneLineWarning):
    """``auto`` samples with :data:`FALLBACK`, not a preferred backend: the CLI shows it as one
    ``warning:`` line."""


def auto_note(device: str = "auto") -> str | None:
    """Where ``auto`` takes :data:`FALLBACK` on ``device`` for want of a preferred backend
    that serves it (vllm does not import here, or serves another device): the one line that
    says so, for a command to show once sampling starts (not before a refusal, which stays
    one line); else None."""
    chosen, skipped = _choose(device)
    if chosen is not SAMPLERS[FALLBACK] or not skipped:
        return None
    return f"backend auto samples with {FALLBACK}: {'; '.join(skipped)}"


def start_sampler(
    backend: type[Sampler], fallback: bool, start: Callable[[type[Sampler]], Sampler]
) -> Sampler:
    """``start(backend)``; where ``fallback`` (``auto`` chose ``backend``) and its engine does
    not start (:class:`EngineFailed`), one :class:`BackendFallback` warning and
    ``start`` of :data:`FALLBACK` instead. The sampler's ``backend`` says which one runs."""
    try:
        return start(backend)
    except EngineFailed as err:
        if not fallback or backend is SAMPLERS[FALLBACK]:
            raise
        message = first_line(err)
    gc.collect()  # the failed engine's memory, before the fallback loads its model
    warnings.warn(BackendFallback(f"backend auto samples with {FALLBACK}: {message}"), stacklevel=2)
    return start(SAMPLERS[FALLBACK])


def _choose(device: str) -> tuple[type[Sampler], list[str]]:
    """The backend ``auto`` takes on ``device``, and why it passed over each preferred one."""
    if PREFERRED and device == "auto":
        from basis_bench.rollouts.models import resolve_device

        device = resolve_device(device)
    skipped = []
    for name in PREFERRED:
        try:
            SAMPLERS[name].check_device(device)
        except InputError as err:  # not installed here, or built for another device
            skipped.append(first_line(err))
            continue
        return SAMPLERS[name], skipped
    return SAMPLERS[FALLBACK], skipped


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

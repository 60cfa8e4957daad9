"""The sampling backends by name: ``--backend`` and training's ``backend`` are looked up
here, and ``auto`` is resolved here, falling back to hf in one warning line where a
preferred backend cannot run or its engine does not start; everything else asks the chosen
class's :class:`~basis_bench.rollouts.sampling.base.Capabilities`.

A backend is a :class:`~basis_bench.rollouts.sampling.base.Sampler` subclass in a module
of its own, registered once with :func:`register_sampler` in :data:`SAMPLERS`, a
:class:`~basis_bench.registry.Registry` (docs/development.md shows one); a third-party
package registers through the entry point group ``basis_bench.samplers``, which the
oracle's spawned workers load too.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

from basis_bench.errors import InputError, OneLineWarning, first_line
from basis_bench.registry import Registry
from basis_bench.rollouts.sampling.base import EngineFailed, Sampler
from basis_bench.rollouts.sampling.hf import HFSampler
from basis_bench.rollouts.sampling.vllm import VLLMSampler

AUTO = "auto"
"""The backend name that picks one: the first preferred backend that serves the device,
else :data:`FALLBACK`."""
FALLBACK = "hf"

SAMPLERS: Registry[type[Sampler]] = Registry("sampling backend", "basis_bench.samplers")


def register_sampler(sampler: type[Sampler]) -> type[Sampler]:
    """Register ``sampler`` under its ``backend`` name (``auto`` tries it, in registration
    order, where it declares ``preferred``)."""
    missing = [
        name for name in ("backend", "capabilities", "Settings") if not hasattr(sampler, name)
    ]
    if sampler.start.__func__ is Sampler.start.__func__:  # type: ignore[attr-defined]
        missing.append("start")
    if missing:
        raise TypeError(f"{sampler.__name__} does not define {', '.join(missing)}")
    if sampler.backend == AUTO:
        raise ValueError(f"the sampling backend name {AUTO!r} is taken: it picks a backend")
    return SAMPLERS.add(sampler.backend, sampler)


def backend_names() -> tuple[str, ...]:
    """What ``--backend`` and ``backend = ...`` accept: ``auto`` and every registered name."""
    return (AUTO, *SAMPLERS.names())


def sampler_class(name: str, device: str = "auto") -> type[Sampler]:
    """The backend called ``name``; ``auto``: the first preferred backend that serves
    ``device`` (``auto``: a GPU if visible, else the CPU), else :data:`FALLBACK`."""
    if name == AUTO:
        return _choose(device)[0]
    return SAMPLERS.get(name)


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
    preferred = [s for s in SAMPLERS.available().values() if s.preferred]
    if preferred and device == "auto":
        from basis_bench.rollouts.models import resolve_device

        device = resolve_device(device)
    skipped = []
    for sampler in preferred:
        try:
            sampler.check_device(device)
        except InputError as err:  # not installed here, or built for another device
            skipped.append(first_line(err))
            continue
        return sampler, skipped
    return SAMPLERS[FALLBACK], skipped


register_sampler(HFSampler)
register_sampler(VLLMSampler)

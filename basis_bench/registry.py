"""One idiom for every extension point: a :class:`Registry` maps names to what they name.

The package has four: estimators (:data:`basis_bench.estimators.ESTIMATORS`), sampling
backends (:data:`basis_bench.rollouts.sampling.SAMPLERS`), policy losses
(:data:`basis_bench.train.losses.POLICY_LOSSES`) and import formats
(:data:`basis_bench.rollouts.importers.IMPORTERS`). Each registry

- holds the package's own entries, registered when its module is imported;
- refuses a name registered twice (``ValueError``: a programming error);
- answers an unknown name with one line that lists the registered ones (``InputError``);
- takes third-party entries through an entry point group, ``basis_bench.<registry>``: each
  entry point names a module whose import registers its entries, loaded once per process
  the first time a name is missing or the whole list is asked for (:meth:`Registry.load_plugins`);
- can hold an entry as ``"module:attribute"``, imported on first use (:meth:`Registry.lazy`),
  so listing the names (a command's help) imports nothing;
- undoes the registrations made inside ``with registry.temporary():`` (for tests).

docs/development.md walks through adding an entry to each, and a figure.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Generic, TypeVar, cast

from basis_bench.errors import InputError

T = TypeVar("T")


class PluginWarning(UserWarning):
    """A third-party package's entry point could not be loaded; it is skipped."""


@dataclass(frozen=True)
class _Lazy:
    """An entry registered as ``module:attribute``, imported on first use."""

    target: str

    def load(self) -> object:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    """Names -> ``T`` for one extension point, in registration order.

    ``kind`` names an entry in messages (``unknown policy loss 'x'; registered: gpg, ...``);
    ``group`` is the entry point group third-party packages register through.
    """

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        self._entries: dict[str, T | _Lazy] = {}
        self._plugins_loaded = False

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name`` (refused if the name is taken); returns it."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def lazy(self, name: str, target: str) -> None:
        """Register ``name`` as ``"module:attribute"``, imported when first looked up."""
        self.add(name, cast(T, _Lazy(target)))

    def get(self, name: str) -> T:
        """The entry called ``name`` (plug-ins are loaded if it is not registered yet); an
        unknown name is one line listing the registered ones."""
        if name not in self._entries:
            self.load_plugins()
        if name not in self._entries:
            raise InputError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self._entries)}"
            )
        return self[name]

    def names(self) -> tuple[str, ...]:
        """Every registered name, plug-ins included, in registration order."""
        self.load_plugins()
        return tuple(self._entries)

    def available(self) -> dict[str, T]:
        """Every entry, plug-ins included, in registration order (lazy ones imported)."""
        return {name: self[name] for name in self.names()}

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, _Lazy):
            entry = self._entries[name] = cast(T, entry.load())
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> tuple[str, ...]:
        """The names registered so far (no plug-ins loaded), so ``dict(registry)`` works."""
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs registered so far, lazy ones imported."""
        return [(name, self[name]) for name in self.keys()]

    def values(self) -> list[T]:
        """The entries registered so far, lazy ones imported."""
        return [self[name] for name in self.keys()]

    def load_plugins(self, force: bool = False) -> list[str]:
        """Import the modules of the entry point group (once per process unless ``force``);
        each import registers its entries. A module that fails to import is named in one
        :class:`PluginWarning` and skipped. Returns the entry points loaded now."""
        if self._plugins_loaded and not force:
            return []
        self._plugins_loaded = True
        loaded = []
        for ep in metadata.entry_points(group=self.group):
            try:
                ep.load()
            except Exception as exc:
                warnings.warn(
                    f"{self.kind} plug-in {ep.name!r} ({ep.value}) failed to load and is "
                    f"skipped: {type(exc).__name__}: {exc}",
                    PluginWarning,
                    stacklevel=2,
                )
                continue
            loaded.append(ep.name)
        return loaded

    @contextmanager
    def temporary(self) -> Iterator[Registry[T]]:
        """Registrations made inside the block are removed when it ends (for tests)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

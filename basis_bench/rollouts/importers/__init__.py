"""Importers: rollouts researchers already have, turned into a rollouts dataset.

Five source formats, one module each, registered in :data:`IMPORTERS` (docs/schema.md has
an example of each): ``counts``, ``eval-jsonl``, ``acc-history``, ``long`` and ``lm-eval``
(lm-evaluation-harness's samples files). :mod:`.options` says how to read the sources,
:mod:`.reading` reads them and reports every malformed row, :func:`import_sources` reads and
checks one import (nothing written) and :func:`write_import` (:mod:`.publishing`)
publishes it into a dataset.

Only :class:`ImportOptions` loads with the package; the other names load their module on
first use, and :data:`IMPORTERS` loads a format's module when it is first used, so the CLI
reads the options and lists the formats at startup cheaply.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from basis_bench.rollouts.importers.options import ImportOptions

if TYPE_CHECKING:
    from basis_bench.rollouts.importers.counts import expand_counts, policy_seed
    from basis_bench.rollouts.importers.formats import IMPORTERS, import_sources
    from basis_bench.rollouts.importers.publishing import (
        WriteReport,
        existing_policies,
        write_import,
    )
    from basis_bench.rollouts.importers.reading import Imported, read_table

_MODULE_OF = {
    "expand_counts": "counts",
    "policy_seed": "counts",
    "IMPORTERS": "formats",
    "import_sources": "formats",
    "WriteReport": "publishing",
    "existing_policies": "publishing",
    "write_import": "publishing",
    "Imported": "reading",
    "read_table": "reading",
}
__all__ = [
    "IMPORTERS",
    "ImportOptions",
    "Imported",
    "WriteReport",
    "existing_policies",
    "expand_counts",
    "import_sources",
    "policy_seed",
    "read_table",
    "write_import",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)

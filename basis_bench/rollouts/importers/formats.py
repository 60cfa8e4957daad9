"""The source formats by name, :data:`IMPORTERS`, and :func:`import_sources`, which reads and
checks one.

A format is a reader ``read(paths, policy, options) -> Imported`` in a module of its own
(docs/development.md, "Adding an import format"). :data:`IMPORTERS` is a
:class:`~basis_bench.registry.Registry`; the package's formats are registered as
``module:function``, imported on first use, so ``basis-bench import --help`` lists them
without loading them; a separate package registers through the entry point group
``basis_bench.importers``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from basis_bench.errors import InputError
from basis_bench.registry import Registry
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import Imported
from basis_bench.rollouts.store import check_policy_name, conform_rollouts

Importer = Callable[[Sequence[Path], str, ImportOptions], Imported]
IMPORTERS: Registry[Importer] = Registry("import format", "basis_bench.importers")
IMPORTERS.lazy("counts", "basis_bench.rollouts.importers.counts:import_counts")
IMPORTERS.lazy("eval-jsonl", "basis_bench.rollouts.importers.eval_jsonl:import_eval_jsonl")
IMPORTERS.lazy("acc-history", "basis_bench.rollouts.importers.acc_history:import_acc_history")
IMPORTERS.lazy("long", "basis_bench.rollouts.importers.long:import_long")
IMPORTERS.lazy("lm-eval", "basis_bench.rollouts.importers.lm_eval:import_lm_eval")


def import_sources(
    fmt: str, paths: Sequence[str | os.PathLike[str]], policy: str, opt: ImportOptions | None = None
) -> Imported:
    """Read and check ``paths`` in format ``fmt``; nothing is written."""
    read = IMPORTERS.get(fmt)
    if not paths:
        raise InputError("give at least one source file")
    check_policy_name(policy)
    given = [os.path.realpath(p) for p in paths]
    twice = next((p for i, p in enumerate(paths) if given[i] in given[:i]), None)
    if twice is not None:  # eval-jsonl would add its samples twice, as if a second seed
        raise InputError(f"source {str(twice)!r} is given twice; give each source once")
    result = read([Path(p) for p in paths], policy, opt or ImportOptions())
    if result.rollouts.height == 0:
        raise InputError(
            f"{', '.join(str(p) for p in paths)}: no rollouts to import (the sources hold no rows)"
        )
    result.rollouts = conform_rollouts(result.rollouts, what=f"{fmt} import", categorical=True)
    return result

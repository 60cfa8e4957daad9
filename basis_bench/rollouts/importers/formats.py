"""The source formats by name, and :func:`import_sources`, which reads and checks one."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from basis_bench.errors import InputError
from basis_bench.rollouts.importers.acc_history import import_acc_history
from basis_bench.rollouts.importers.counts import import_counts
from basis_bench.rollouts.importers.eval_jsonl import import_eval_jsonl
from basis_bench.rollouts.importers.lm_eval import import_lm_eval
from basis_bench.rollouts.importers.long import import_long
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import Imported
from basis_bench.rollouts.store import check_policy_name, conform_rollouts

IMPORTERS = {  # format name -> reader
    "counts": import_counts,
    "eval-jsonl": import_eval_jsonl,
    "acc-history": import_acc_history,
    "long": import_long,
    "lm-eval": import_lm_eval,
}


def import_sources(
    fmt: str, paths: Sequence[str | os.PathLike[str]], policy: str, opt: ImportOptions | None = None
) -> Imported:
    """Read and check ``paths`` in format ``fmt``; nothing is written."""
    if fmt not in IMPORTERS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(IMPORTERS)}")
    if not paths:
        raise InputError("give at least one source file")
    check_policy_name(policy)
    given = [os.path.realpath(p) for p in paths]
    twice = next((p for i, p in enumerate(paths) if given[i] in given[:i]), None)
    if twice is not None:  # eval-jsonl would add its samples twice, as if a second seed
        raise InputError(f"source {str(twice)!r} is given twice; give each source once")
    result = IMPORTERS[fmt]([Path(p) for p in paths], policy, opt or ImportOptions())
    if result.rollouts.height == 0:
        raise InputError(
            f"{', '.join(str(p) for p in paths)}: no rollouts to import (the sources hold no rows)"
        )
    result.rollouts = conform_rollouts(result.rollouts, what=f"{fmt} import", categorical=True)
    return result
